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

Without TVM on the GPU machine (v2 vs v3 vs the bf16 dense GEMV, kernels called directly):

    .venv/bin/python tests/gpu/check_qgemv.py fatbins          # build machine: sm_90a fatbins
    python3 tests/gpu/check_qgemv.py cupy --out $OUT           # GPU machine (cupy), carry .cache/ninfer/qgemv-v3

`cupy` fills random planes on the GPU, checks v2, v3 (bf16 and fp32 output) and dense at batch
1..8 against float64 numpy on a subset of rows (NaN-poisoned outputs), then times batch 1, 2, 4, 8
per launch inside a CUDA graph, rotating over weight copies so that L2 cannot hold them. Other
builds of the .cu staged there as `v3a_sm_90a.fatbin` / `v3x<tag>_sm_90a.fatbin` (nvcc -fatbin of
another version of the source) are timed next to v3, and v3 also at the neighbouring K-splits.
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
FATBINS = ROOT / ".cache" / "ninfer" / "qgemv-v3"
# cupy subcommand: (format, N, K); "bf16" = dense bf16 weights
CUPY_CASES = {
    "q4 up 17408x5120": ("q4", 17408, 5120),
    "q4 qk 2048x5120": ("q4", 2048, 5120),
    "q5 down 5120x17408": ("q5", 5120, 17408),
    "q5 value 6144x5120": ("q5", 6144, 5120),
    "q6 16384x5120": ("q6", 16384, 5120),
    "q6 head 248320x5120": ("q6", 248320, 5120),
    "bf16 gate 48x5120": ("bf16", 48, 5120),
    "bf16 1024x5120": ("bf16", 1024, 5120),
    "bf16 17408x5120": ("bf16", 17408, 5120),
}


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


def fatbins() -> None:
    """sm_90a fatbins of ops/qgemv_cuda.cu (all kernels, and the dense-only build) for `cupy`."""
    sys.path.insert(0, str(ROOT))
    from ninfer_compiler.ops import qgemv

    FATBINS.mkdir(parents=True, exist_ok=True)
    (FATBINS / "all_sm_90a.fatbin").write_bytes(qgemv.fatbin("sm_90a"))
    (FATBINS / "dense_sm_90a.fatbin").write_bytes(qgemv.fatbin("sm_90a", dense=True))
    print("wrote", *sorted(p.name for p in FATBINS.iterdir()))


def decode_planes(base: np.ndarray, high: np.ndarray | None, scales: np.ndarray, bits: int) -> np.ndarray:
    """float64 `[rows, K]` of q4/q5/q6 planes (spec 4.3; same as row_split.decode_row_split)."""
    rows = base.shape[0]
    u = np.empty((rows, base.shape[1] * 2), dtype=np.int32)
    u[:, 0::2] = base & 0xF
    u[:, 1::2] = base >> 4
    if bits == 5:
        u |= ((high[:, :, None] >> np.arange(8, dtype=np.uint8)) & 1).reshape(rows, -1).astype(np.int32) << 4
    elif bits == 6:
        u |= ((high[:, :, None] >> (2 * np.arange(4, dtype=np.uint8))) & 3).reshape(rows, -1).astype(np.int32) << 4
    q = np.where(u >= 1 << (bits - 1), u - (1 << bits), u).astype(np.float64)
    return q * np.repeat(scales.astype(np.float64), 64, axis=1)


def _ks_v2(n: int) -> int:  # qgemv_host.cc choose_ks
    ks = 1
    while ks < 8 and (n + 4 * (8 // ks) - 1) // (4 * (8 // ks)) < 264:
        ks *= 2
    return ks


def _ks_v3(n: int, k: int) -> int:  # qgemv_host.cc choose_ks_v3
    ks = 1
    while ks < 16 and (n // 16) * ks < 4224 and k // 128 >= 4 * ks:
        ks *= 2
    return ks


def cupy_check(out: Path, reps: int) -> int:
    """v2 / v3 / dense on random data with cupy: numerics table and timings table."""
    import cupy as cp

    out.mkdir(parents=True, exist_ok=True)
    log = open(out / "qgemv_cupy.log", "w")  # noqa: SIM115 (closed at the end)

    def say(*a: object) -> None:
        print(*a, flush=True)
        print(*a, file=log, flush=True)

    mod = cp.RawModule(path=str(FATBINS / "all_sm_90a.fatbin"))
    dmod = cp.RawModule(path=str(FATBINS / "dense_sm_90a.fatbin"))
    start, stop = cp.cuda.Event(), cp.cuda.Event()

    def gpu_us(fn, n_calls: int) -> float:
        """Median over `reps` of (one CUDA graph of n_calls launches) / n_calls, in us (a plain
        loop of launches if capture is refused)."""
        stream = cp.cuda.Stream(non_blocking=True)
        with stream:
            fn(0)
            try:
                stream.begin_capture()
                for i in range(n_calls):
                    fn(i)
                graph = stream.end_capture()
                run = lambda: graph.launch(stream)  # noqa: E731
            except Exception as exc:  # noqa: BLE001 - fall back to plain launches
                say(f"graph capture failed ({exc}); timing plain launches")
                stream = cp.cuda.Stream(non_blocking=True)
                run = lambda: [fn(i) for i in range(n_calls)]  # noqa: E731
            run()
            stream.synchronize()
            times = []
            for _ in range(reps):
                start.record(stream)
                run()
                stop.record(stream)
                stop.synchronize()
                times.append(cp.cuda.get_elapsed_time(start, stop) * 1e3 / n_calls)
        return float(np.median(times))

    def torch_us(fn, n_calls: int) -> float:
        """The same for a torch call, through torch's own CUDA graph."""
        import torch

        fn()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(n_calls):
                fn()
        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(reps):
            t0.record()
            graph.replay()
            t1.record()
            t1.synchronize()
            times.append(t0.elapsed_time(t1) * 1e3 / n_calls)
        return float(np.median(times))

    src = cp.empty(1 << 30, dtype=cp.uint8)
    dst = cp.empty_like(src)
    copy_us = gpu_us(lambda i, src=src, dst=dst: dst.data.copy_from_device_async(src.data, src.nbytes), 5)
    copy_gb_s = 2 * (1 << 30) / (copy_us * 1e-6) / 1e9
    src = dst = None
    say(f"device copy (cudaMemcpyAsync, read + write, 1 GiB): {copy_gb_s:.0f} GB/s")
    # an earlier kernel version to compare against (a fatbin of it, if one was staged)
    old = FATBINS / "v3a_sm_90a.fatbin"
    amod = cp.RawModule(path=str(old)) if old.exists() else None
    extra = {p.name.split("_")[0]: cp.RawModule(path=str(p)) for p in sorted(FATBINS.glob("v3x*_sm_90a.fatbin"))}
    rng = np.random.default_rng(0)
    u32 = np.uint32
    errors, timings, ok = [], [], True
    cases = CUPY_CASES
    if os.environ.get("NINFER_QGEMV_SMOKE"):  # tiny shapes, to try the script's plumbing
        cases = {name: (fmt, 64 if n > 64 else n, 256) for name, (fmt, n, k) in CUPY_CASES.items()}
    for name, (fmt, n, k) in cases.items():
        if fmt == "bf16":
            nbytes = n * k * 2
        else:
            bits = int(fmt[1])
            hb = {4: 0, 5: 8, 6: 16}[bits]
            nbytes = n * k // 64 * (32 + hb + 2)
        copies = max(1, min(40, -(-200_000_000 // nbytes)))
        sets = []
        for _ in range(copies):
            if fmt == "bf16":
                w = (cp.random.standard_normal((n, k), dtype=cp.float32) / 64).view(cp.uint32) >> 16
                sets.append((w.astype(cp.uint16),))
            else:
                base = cp.random.randint(0, 256, size=(n, k // 2), dtype=cp.int32).astype(cp.uint8)
                high = cp.random.randint(0, 256, size=(n, k // 64 * hb), dtype=cp.int32).astype(cp.uint8) if hb else base
                sc = cp.random.uniform(0.5, 1.5, size=(n, k // 64)) * cp.random.choice(cp.array([-1.0, 1.0]), size=(n, k // 64))
                sets.append((base, high, (sc / 64).astype(cp.float16)))
        rows = np.arange(n) if n <= 4096 else np.r_[np.arange(1024), np.arange(n - 1024, n)]
        first = sets[0]
        if fmt == "bf16":
            w_ref = (cp.asnumpy(first[0][rows]).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        else:
            w_ref = decode_planes(cp.asnumpy(first[0][rows]), cp.asnumpy(first[1][rows]) if hb else None,
                                  cp.asnumpy(first[2][rows]), bits)

        def launch(variant: str, planes, x, y, b: int, n=n, k=k, fmt=fmt, ks_v3: int = 0) -> None:
            pb = 1 if b == 1 else 2 if b == 2 else 4 if b <= 4 else 8
            if variant == "dense":
                dmod.get_function(f"ninfer_dense_bf16_b{pb}")((n,), (256,), (x, planes[0], y, u32(n), u32(k), u32(b)))
            elif variant == "v2":
                ks = _ks_v2(n)
                grid = (n + 4 * (8 // ks) - 1) // (4 * (8 // ks))
                mod.get_function(f"ninfer_qgemv_q{fmt[1]}_b{pb}_bf16")(
                    (grid,), (256,), (x, *planes, y, u32(n), u32(k), u32(b), u32(ks)))
            else:
                ks = ks_v3 or _ks_v3(n, k)
                warps = max(8, ks)
                grid = -(-(n // 16) // (warps // ks))
                tag = "f32" if y.dtype == cp.float32 else "bf16"
                (amod if variant == "v3a" else extra.get(variant, mod)).get_function(f"ninfer_qgemv3_q{fmt[1]}_y{tag}")(
                    (grid,), (warps * 32,), (x, *planes, y, u32(n), u32(k), u32(b), u32(ks)))

        variants = ["dense"] if fmt == "bf16" else ["v2", "v3", "v3f32"]
        for b in range(1, 9):
            xf = rng.standard_normal((b, k)).astype(np.float32)
            xb = (xf.view(np.uint32) >> 16).astype(np.uint16)
            ref = ((xb.astype(np.uint32) << 16).view(np.float32).astype(np.float64)) @ w_ref.T
            x = cp.asarray(xb)
            for v in variants:
                # poisoned output: NaN in fp32, the bf16 NaN pattern otherwise
                y = cp.full((b, n), np.nan, dtype=cp.float32) if v == "v3f32" else cp.full((b, n), 0x7FC0, dtype=cp.uint16)
                launch(v.replace("f32", ""), first, x, y, b)
                got = cp.asnumpy(y)
                if got.dtype == np.uint16:
                    got = (got.astype(np.uint32) << 16).view(np.float32)
                err = float(np.abs(got[:, rows].astype(np.float64) - ref).max() / np.abs(ref).max())
                if not np.isfinite(err):
                    err = float("inf")
                tol = 1e-5 if v == "v3f32" else 1e-2
                ok &= err <= tol
                errors.append((name, v, b, err))
        for b in (1, 2, 4, 8):
            x = cp.asarray((rng.standard_normal((b, k)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16))
            y = cp.zeros((b, n), dtype=cp.uint16)
            entry = {}
            for v in ("dense",) if fmt == "bf16" else ("v2", "v3a", "v3") if amod else ("v2", "v3"):
                entry[v] = gpu_us(lambda i, v=v, s=sets, x=x, y=y, b=b: launch(v, s[i % len(s)], x, y, b),
                                  max(copies, 20))
            for v in extra if fmt != "bf16" else ():
                entry[v] = gpu_us(lambda i, v=v, s=sets, x=x, y=y, b=b: launch(v, s[i % len(s)], x, y, b), max(copies, 20))
            if fmt != "bf16" and b in (1, 8):  # the launcher's K-split choice against its neighbours
                for ks in (1, 2, 4, 8, 16):
                    if k // 128 >= 2 * ks and ks != _ks_v3(n, k):
                        entry[f"v3 ks={ks}"] = gpu_us(
                            lambda i, s=sets, x=x, y=y, b=b, ks=ks: launch("v3", s[i % len(s)], x, y, b, ks_v3=ks),
                            max(copies, 20))
                entry["ks"] = _ks_v3(n, k)
            if fmt == "bf16":
                try:
                    import torch

                    tw = torch.from_dlpack(sets[0][0]).view(torch.bfloat16)
                    tx = torch.from_dlpack(x).view(torch.bfloat16)
                    entry["torch"] = torch_us(lambda tx=tx, tw=tw: torch.nn.functional.linear(tx, tw), 20)
                except Exception as exc:  # noqa: BLE001 - the comparison is optional
                    say(f"torch comparison skipped: {exc}")
            timings.append((name, b, nbytes, entry))
            say(name, b, {v: round(t, 2) for v, t in entry.items()})
        sets = first = None
        cp.get_default_memory_pool().free_all_blocks()
    say("\nmax |y - ref| / max |ref| (float64 reference, rows subset for N > 4096):")
    say(f"{'case':24} {'variant':6} " + " ".join(f"b={b:<7}" for b in range(1, 9)))
    for name in cases:
        for v in ("v2", "v3", "v3f32", "dense"):
            row = [e for (c, vv, _, e) in errors if c == name and vv == v]
            if row:
                say(f"{name:24} {v:6} " + " ".join(f"{e:<9.2e}" for e in row))
    say(f"\nper launch in a CUDA graph (median of {reps}), weights rotated over copies; copy {copy_gb_s:.0f} GB/s")
    say(f"{'case':24} {'MB':>6} {'b':>2} {'v2 us':>8} {'v3a us':>8} {'v3 us':>8} {'v3 GB/s':>8} {'% copy':>6} "
        f"{'torch us':>9}")
    for name, b, nbytes, e in timings:
        main = e.get("v3", e.get("dense"))
        gbs = nbytes / (main * 1e-6) / 1e9
        other = e.get("torch", float("nan"))
        say(f"{name:24} {nbytes / 1e6:6.1f} {b:2d} {e.get('v2', float('nan')):8.2f} {e.get('v3a', float('nan')):8.2f} "
            f"{main:8.2f} {gbs:8.0f} "
            f"{100 * gbs / copy_gb_s:5.0f}% {other:9.2f}")
    say("numerics", "ok" if ok else "FAILED")
    log.close()
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["prepare", "run", "fatbins", "cupy"])
    parser.add_argument("--reps", type=int, default=20, help="cupy: timing repeats")
    parser.add_argument("--out", type=Path, default=Path("/tmp/qgemv-out"))
    parser.add_argument("--tag", default="v2", help="prepare: name of this kernel version")
    parser.add_argument("--source", type=Path, help="prepare: a .cu to use instead of ops/qgemv_cuda.cu")
    args = parser.parse_args()
    if args.action == "prepare":
        prepare(args.tag, args.source)
        return 0
    if args.action == "fatbins":
        fatbins()
        return 0
    if args.action == "cupy":
        return cupy_check(args.out, args.reps)
    if "TVM_USE_RUNTIME_LIB" not in os.environ:  # GPU machine: TVM's runtime staged by profile_27b.py
        sys.path.insert(0, str(ROOT / "tests" / "gpu"))
        from profile_27b import _env

        return subprocess.run([sys.executable, __file__, "run", "--out", str(args.out)], env=_env(), cwd="/tmp").returncode
    return run(args.out)


if __name__ == "__main__":
    raise SystemExit(main())
