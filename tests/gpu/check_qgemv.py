#!/usr/bin/env python3
"""Our decode GEMV (`ops/qgemv.py`) on the H200: numerics against numpy and bandwidth, per format.

    # build machine: one sm_90a library per (format, dtype), `main(x [b, 1, K], planes...)`
    .venv/bin/python tests/gpu/check_qgemv.py prepare
    # GPU machine (TVM runtime only; run after profile_27b.py has staged its site):
    python3 tests/gpu/check_qgemv.py run --out $OUT

`run` fills random planes (every byte random, scales random fp16), compares the GPU result at
batch 1..8 with numpy's `decode_row_split(planes) @ x` in float64 (fp32 activations: max error
over max |y| <= 1e-5; bf16: <= 1e-2, the output rounding), then times batch 1 and 8 in bf16 and
reports the weight bandwidth against the measured device copy bandwidth.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
STAGE = ROOT / ".cache" / "ninfer" / "qgemv-check"
# 27B shapes (N, K): MLP up/gate q4, MLP down q5, GDN value q5, a q6 slice of the head, q8
CASES = {
    "q4_up": ("q4_g64_fp16", 17408, 5120),
    "q4_qk": ("q4_g64_fp16", 2048, 5120),
    "q5_down": ("q5_g64_fp16", 5120, 17408),
    "q5_value": ("q5_g64_fp16", 6144, 5120),
    "q6_head": ("q6_g64_fp16", 16384, 5120),
    "q8": ("q8_g32_fp16", 4096, 5120),
}
DTYPES = ("float32", "bfloat16")


def prepare(tag: str, source: Path | None) -> None:
    """Libraries `<tag>_<case>_<dtype>.so`; `source` replaces qgemv_cuda.cu (A/B of kernel versions)."""
    sys.path.insert(0, str(ROOT))
    from ninfer_compiler.build import compile_module
    from ninfer_compiler.codegen.targets import tvm_target
    from ninfer_compiler.codegen.toolchain import cuda_build
    from ninfer_compiler.ops import qgemv
    from ninfer_compiler.ops.dequant_matmul import dequant_matmul
    from ninfer_compiler.ops.row_split import plane_shapes
    from ninfer_runtime import targets
    from tests.compiler.conftest import _op_module

    if source is not None:
        qgemv.DEVICE_SOURCE = source.resolve()
    STAGE.mkdir(parents=True, exist_ok=True)
    gpu = tvm_target(targets.load("h200"))
    for name, (fmt, n, k) in CASES.items():
        shapes = plane_shapes(fmt, n, k)
        for dtype in DTYPES:
            spec = {"x": (["b", 1, k], dtype)}
            spec.update({p: (list(s), d) for p, (s, d) in shapes.items()})

            def fn(x, *planes, fmt=fmt, k=k):
                high = planes[1] if len(planes) == 3 else None
                return dequant_matmul(x, planes[0], high, planes[-1], fmt, k)

            model = _op_module(fn, spec)
            with gpu:
                mod, _, ext = model.export_tvm(spec=model.get_export_spec(), allow_extern=True)
            assert ext, "the GEMV extern was not used"
            from tvm import relax

            mod = relax.transform.AttachExternModules(ext)(mod)
            with cuda_build(gpu):
                compile_module(mod, gpu).export_library(str(STAGE / f"{tag}_{name}_{dtype}.so"))
            print(f"built {tag} {name} {dtype}", flush=True)


def run(out: Path) -> int:
    import tvm
    from tvm.runtime import vm as tvm_vm

    from ninfer_compiler.ops.row_split import decode_row_split, plane_shapes
    from ninfer_runtime.cuda import load_cuda_runtime

    load_cuda_runtime()

    try:
        import ml_dtypes
    except ImportError:
        ml_dtypes = None
    dev = tvm.cuda(0)
    rng = np.random.default_rng(0)
    src = tvm.runtime.empty((1 << 30,), "uint8", dev)
    dst = tvm.runtime.empty((1 << 30,), "uint8", dev)
    src.copyto(dst)
    dev.sync()
    t0 = time.perf_counter()
    for _ in range(10):
        src.copyto(dst)
    dev.sync()
    copy_gb_s = 2 * 10 * (1 << 30) / (time.perf_counter() - t0) / 1e9
    print(f"device copy (read + write): {copy_gb_s:.0f} GB/s", flush=True)
    results: dict = {"copy_gb_s": copy_gb_s}
    ok = True
    tags = sorted({p.name.split("_")[0] for p in STAGE.glob("*.so")})
    for name, (fmt, n, k) in CASES.items():
        shapes = plane_shapes(fmt, n, k)
        planes = {}
        for p, (s, d) in shapes.items():
            if d == "uint8":
                planes[p] = rng.integers(0, 256, size=s, dtype=np.uint8)
            else:
                planes[p] = (rng.uniform(0.5, 1.5, size=s) * rng.choice([-1, 1], size=s) / 64).astype(np.float16)
        w = decode_row_split(planes, fmt, k).astype(np.float64)
        nbytes = sum(a.nbytes for a in planes.values())
        dev_planes = [tvm.runtime.tensor(planes[p], dev) for p in shapes]
        for tag, dtype in [(t, d) for t in tags for d in DTYPES]:
            key = f"{tag}_{name}_{dtype}"
            entry: dict = {}
            try:
                vm = tvm_vm.VirtualMachine(tvm.runtime.load_module(str(STAGE / f"{key}.so")), dev)
                errs = {}
                for b in range(1, 9):
                    x = rng.standard_normal((b, 1, k)).astype(np.float32)
                    if dtype == "bfloat16":
                        x = x.astype(ml_dtypes.bfloat16)
                    y = vm["main"](tvm.runtime.tensor(x, dev), *dev_planes).numpy().astype(np.float64)
                    ref = x.astype(np.float64)[:, 0, :] @ w.T
                    errs[b] = float(np.abs(y[:, 0, :] - ref).max() / np.abs(ref).max())
                tol = 1e-5 if dtype == "float32" else 1e-2
                entry["max_rel_err"] = errs
                entry["ok"] = all(e <= tol for e in errs.values())
                ok &= entry["ok"]
                if dtype == "bfloat16":
                    for b in (1, 8):
                        x = tvm.runtime.tensor(rng.standard_normal((b, 1, k)).astype(ml_dtypes.bfloat16), dev)
                        try:  # kernel + VM call overhead (a few us) per call
                            us = vm.time_evaluator("main", dev, number=50, repeat=3)(x, *dev_planes).median * 1e6
                        except Exception:  # noqa: BLE001 - no time_evaluator in this runtime: time by hand
                            vm["main"](x, *dev_planes)
                            dev.sync()
                            start = time.perf_counter()
                            for _ in range(50):
                                vm["main"](x, *dev_planes)
                            dev.sync()
                            us = (time.perf_counter() - start) / 50 * 1e6
                        entry[f"b{b}_us"] = us
                        entry[f"b{b}_gb_s"] = nbytes / (us * 1e-6) / 1e9
            except Exception as exc:  # noqa: BLE001 - report and go on
                entry["error"] = f"{type(exc).__name__}: {exc}"[:2000]
                ok = False
            results[key] = entry
            print(f"{key} ({n}x{k}, {nbytes / 1e6:.1f} MB): {json.dumps(entry)}", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "qgemv.json").write_text(json.dumps(results, indent=1))
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["prepare", "run"])
    parser.add_argument("--out", type=Path, default=Path("/tmp/qgemv-out"))
    parser.add_argument("--tag", default="v2", help="prepare: name of this kernel version")
    parser.add_argument("--source", type=Path, help="prepare: a .cu to use instead of ops/qgemv_cuda.cu")
    args = parser.parse_args()
    if args.action == "prepare":
        prepare(args.tag, args.source)
        return 0
    if "TVM_USE_RUNTIME_LIB" not in os.environ:  # GPU machine: TVM's runtime staged by profile_27b.py
        sys.path.insert(0, str(ROOT / "tests" / "gpu"))
        from profile_27b import _env

        return subprocess.run([sys.executable, __file__, "run", "--out", str(args.out)], env=_env(), cwd="/tmp").returncode
    return run(args.out)


if __name__ == "__main__":
    raise SystemExit(main())
