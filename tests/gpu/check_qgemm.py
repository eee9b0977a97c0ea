#!/usr/bin/env python3
"""Prefill GEMMs on the H200: numerics and speed of the grouped-int GEMM (`ops/qgemm_triton.py`),
its fused epilogues (SwiGLU, residual add) and the dense small-N GEMM (`ops/dense_triton.py`),
each against the version of a baseline commit and torch's bf16 matmul, in one run.

    # build machine: cubins for sm_90a through the AOT path (ops/triton_aot.py), this tree's
    # kernels and those of BASELINE (a git revision), with an index
    .venv/bin/python tests/gpu/check_qgemm.py build .cache/ninfer/qgemm/bench --baseline 0c501ff
    # GPU machine (torch + CUDA driver, no TVM, no Triton needed): carry the build folder
    python3 tests/gpu/check_qgemm.py run --cubins .cache/ninfer/qgemm/bench --out $OUT
    # any machine, no GPU: the same run in Triton's interpreter on tiny shapes
    QGEMM_DRY=cpu .venv/bin/python tests/gpu/check_qgemm.py run --out /tmp/qgemm-dry

`run` draws random codes (every value of the format) and fp16 scales per shape, packs them into
the row_split planes on the GPU (the packer is first checked against `row_split.pack_planes`),
and for every kernel config: poisons y with NaN, runs M = 1024 and compares with a float64
reference `x @ (scale * code)^T` (error over max |ref|; also against the reference with the
weights rounded to bf16, what the kernel multiplies by), checks a ragged M (rows past it stay
NaN), then times M = 1024, 2048, 7680: CUDA events around batches of launches queued behind a
sleep kernel (so launch overhead does not show), median of batches, cycling through copies of
the weights so that L2 does not keep them. Fused ops are timed against the unfused sequence they
replace (two GEMMs + SiLU*up, GEMM + add; elementwise kernels AOT-compiled here). Cubins are
launched through the driver API (ctypes), as the package's launcher does in C++.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
DRY = os.environ.get("QGEMM_DRY") == "cpu"
if DRY:
    import tests.conftest  # noqa: F401 (Triton's interpreter, with the GPU's bf16 dot and rounding)


def _import_runtime() -> None:
    """`ninfer_runtime` is `runtime/` (pyproject's package-dir); alias it where it is not installed."""
    try:
        import ninfer_runtime  # noqa: F401
    except ImportError:
        spec = importlib.util.spec_from_file_location(
            "ninfer_runtime", ROOT / "runtime" / "__init__.py", submodule_search_locations=[str(ROOT / "runtime")])
        module = importlib.util.module_from_spec(spec)
        sys.modules["ninfer_runtime"] = module
        spec.loader.exec_module(module)


# (N, K, bits): 27B prefill projections (MLP gate/up q4, down q5, GDN/attention q4/q5), q6/q8, ragged N
SHAPES = [(17408, 5120, 4), (5120, 17408, 5), (6144, 5120, 5), (6144, 5120, 4), (5120, 6144, 5),
          (2048, 5120, 4), (1024, 5120, 4), (1024, 5120, 5), (6144, 5120, 6), (6144, 5120, 8),
          (1000, 5120, 4)]
# launches of each shape per prefill chunk of the 27B (48 GDN + 16 attention layers)
LAUNCHES = {(17408, 5120, 4): 128, (5120, 17408, 5): 64, (6144, 5120, 5): 112, (6144, 5120, 4): 16,
            (5120, 6144, 5): 64, (2048, 5120, 4): 96, (1024, 5120, 4): 16, (1024, 5120, 5): 16}
CONFIGS = {  # name: (BLOCK_M, BLOCK_N, warps, stages)
    "t256x128s3": (256, 128, 8, 3), "t256x128s4": (256, 128, 8, 4),
    "t128x128s3": (128, 128, 8, 3), "t128x128s4": (128, 128, 8, 4),
    "t256x128w16s3": (256, 128, 16, 3), "t256x128w16s4": (256, 128, 16, 4),
}
NEW_CONFIGS = list(CONFIGS)
NOASM = [(17408, 5120, 4), (6144, 5120, 5)]  # also timed without the inline-PTX byte conversion
FUSED = [("swiglu", 17408, 5120, 4), ("add", 5120, 17408, 5), ("add", 5120, 6144, 5)]
DENSE_SHAPE = (48, 5120)
DENSE_CONFIGS = {  # name: (BLOCK_M, BLOCK_K, warps, stages); BLOCK_N = 64
    "t16k128s4": (16, 128, 4, 4), "t32k128s4": (32, 128, 4, 4), "t64k128s4": (64, 128, 4, 4),
    "t16k64s4": (16, 64, 4, 4), "t64k64s4": (64, 64, 4, 4), "t128k64s3": (128, 64, 4, 3),
}
OLD_DENSE = (64, 64, 64, 4, 3)  # BLOCK_M, BLOCK_N, BLOCK_K, warps, stages of the baseline
GROUP_M = 8
MS = (1024, 2048, 7680)
WIDE_MIN_TILES = 128
SIG_NEW = {"x_ptr": "*bf16", "base_ptr": "*u8", "high_ptr": "*u8", "scales_ptr": "*fp16",
           "base2_ptr": "*u8", "high2_ptr": "*u8", "scales2_ptr": "*fp16", "res_ptr": "*bf16",
           "y_ptr": "*bf16", "M": "i32"}
SIG_OLD = {"x_ptr": "*bf16", "base_ptr": "*u8", "high_ptr": "*u8", "scales_ptr": "*fp16",
           "y_ptr": "*bf16", "M": "i32"}
EPILOGUE = {"plain": 0, "add": 1, "swiglu": 2}


def old_wide(bits: int) -> str:
    """The baseline launcher's wide config (its narrow one was t128x128s4)."""
    return "t256x128s3" if bits in (4, 8) else "t256x128s4"


def baseline_module(rev: str, path: str, name: str, where: Path):
    """Module `path` as of git revision `rev` (relative imports made absolute), loaded as `name`."""
    src = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{path}"], check=True, capture_output=True,
                         text=True).stdout
    src = src.replace("from .", "from ninfer_compiler.ops.")
    where.mkdir(parents=True, exist_ok=True)
    file = where / f"{name}.py"
    file.write_text(src)
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _elementwise():
    """The unfused epilogues' kernels (one pass each, like the package's elementwise kernels)."""
    import triton
    import triton.language as tl

    @triton.jit
    def silu_mul_kernel(g_ptr, u_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        ok = offs < n
        g = tl.load(g_ptr + offs, mask=ok).to(tl.float32)
        u = tl.load(u_ptr + offs, mask=ok).to(tl.float32)
        tl.store(y_ptr + offs, (g * tl.sigmoid(g) * u).to(tl.bfloat16), mask=ok)

    @triton.jit
    def add_kernel(a_ptr, b_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        ok = offs < n
        a = tl.load(a_ptr + offs, mask=ok).to(tl.float32)
        b = tl.load(b_ptr + offs, mask=ok).to(tl.float32)
        tl.store(y_ptr + offs, (a + b).to(tl.bfloat16), mask=ok)

    return {"silu_mul": silu_mul_kernel, "add": add_kernel}


EW_BLOCK = 2048


def _build_one(job: dict) -> dict:
    from ninfer_compiler.ops.triton_aot import compile_kernel

    kind = job["kind"]
    if kind in ("new", "noasm"):
        from ninfer_compiler.ops.qgemm_triton import qgemm_kernel as fn

        bm, bn, warps, stages = CONFIGS[job["config"]]
        sig, consts = SIG_NEW, dict(N=job["n"], K=job["k"], BITS=job["bits"], BLOCK_M=bm, BLOCK_N=bn,
                                    GROUP_M=GROUP_M, EPILOGUE=EPILOGUE[job["epilogue"]], ASM=kind == "new")
    elif kind == "old":
        fn = baseline_module(job["rev"], "ninfer_compiler/ops/qgemm_triton.py", "baseline_qgemm_triton",
                             Path(job["out"]) / "baseline").qgemm_kernel
        bm, bn, warps, stages = CONFIGS[job["config"]]
        sig, consts = SIG_OLD, dict(N=job["n"], K=job["k"], BITS=job["bits"], BLOCK_M=bm, BLOCK_N=bn,
                                    GROUP_M=GROUP_M, TRANS=True)
    elif kind == "dense":
        from ninfer_compiler.ops.dense_triton import BLOCK_N
        from ninfer_compiler.ops.dense_triton import dense_nt_kernel as fn

        bm, bk, warps, stages = DENSE_CONFIGS[job["config"]]
        sig = {"x": "*bf16", "w": "*bf16", "y": "*bf16", "M": "i32"}
        consts = dict(N=job["n"], K=job["k"], BLOCK_M=bm, BLOCK_N=BLOCK_N, BLOCK_K=bk)
    elif kind == "dense_old":
        fn = baseline_module(job["rev"], "ninfer_compiler/ops/dense_triton.py", "baseline_dense_triton",
                             Path(job["out"]) / "baseline").dense_nt_kernel
        bm, bn, bk, warps, stages = OLD_DENSE
        sig = {"x": "*bf16", "w": "*bf16", "y": "*bf16", "M": "i32", "N": "i32", "K": "i32"}
        consts = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk)
    else:  # elementwise
        fn = _elementwise()[job["config"]]
        warps, stages = 4, 1
        sig = {a: "*bf16" for a in list(fn.arg_names)[:3]} | {"n": "i64"}
        consts = dict(BLOCK=EW_BLOCK)
    img = compile_kernel(fn, signature=sig, constants=consts, arch="sm_90a", num_warps=warps, num_stages=stages)
    file = f"{job['id']}.cubin"
    (Path(job["out"]) / file).write_bytes(img.cubin)
    return {**{k: v for k, v in job.items() if k not in ("out", "rev")}, "file": file, "name": img.name,
            "shared": img.shared, "threads": img.threads}


def jobs(out: Path, rev: str) -> list[dict]:
    work = []

    def add(**kw) -> None:
        kw["id"] = "_".join(str(v) for v in kw.values())
        work.append({**kw, "out": str(out), "rev": rev})

    for n, k, bits in SHAPES:
        for cfg in NEW_CONFIGS:
            add(kind="new", epilogue="plain", n=n, k=k, bits=bits, config=cfg)
        for cfg in ("t128x128s4", old_wide(bits)):
            add(kind="old", epilogue="plain", n=n, k=k, bits=bits, config=cfg)
        if (n, k, bits) in NOASM:
            add(kind="noasm", epilogue="plain", n=n, k=k, bits=bits, config=old_wide(bits))
    for ep, n, k, bits in FUSED:
        for cfg in NEW_CONFIGS:
            add(kind="new", epilogue=ep, n=n, k=k, bits=bits, config=cfg)
    for cfg in DENSE_CONFIGS:
        add(kind="dense", epilogue="plain", n=DENSE_SHAPE[0], k=DENSE_SHAPE[1], bits=16, config=cfg)
    add(kind="dense_old", epilogue="plain", n=DENSE_SHAPE[0], k=DENSE_SHAPE[1], bits=16, config="t64x64k64s3")
    for name in ("silu_mul", "add"):
        add(kind="elementwise", epilogue="plain", n=0, k=0, bits=16, config=name)
    return work


def build(out: Path, rev: str, n_jobs: int) -> None:
    from concurrent.futures import ProcessPoolExecutor

    out.mkdir(parents=True, exist_ok=True)
    baseline_module(rev, "ninfer_compiler/ops/qgemm_triton.py", "baseline_qgemm_triton", out / "baseline")
    with ProcessPoolExecutor(n_jobs) as ex:
        index = list(ex.map(_build_one, jobs(out, rev)))
    (out / "index.json").write_text(json.dumps({"baseline": rev, "cubins": index}, indent=1))
    print(f"{len(index)} cubins in {out} (baseline {rev})")


class Driver:
    """cuModuleLoadData / cuLaunchKernel through ctypes (what the package's launcher does in C++)."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.modules: list[ctypes.c_void_p] = []

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            raise RuntimeError(f"{what} failed with {rc}")

    def load(self, data: bytes, name: str, shared: int) -> ctypes.c_void_p:
        mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
        self._check(self.lib.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(data)), "cuModuleLoadData")
        self.modules.append(mod)
        self._check(self.lib.cuModuleGetFunction(ctypes.byref(fn), mod, name.encode()), f"cuModuleGetFunction {name}")
        if shared > 48 * 1024:
            self._check(self.lib.cuFuncSetAttribute(fn, 8, ctypes.c_int(shared)), "cuFuncSetAttribute")
        return fn

    def prepare(self, fn, grid: tuple[int, int], threads: int, shared: int, args: list, stream: int):
        """A callable that launches `fn` with `args` (ctypes values; Triton's 2 scratch pointers added)."""
        vals = list(args) + [ctypes.c_uint64(0), ctypes.c_uint64(0)]
        params = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
        lib, gx, gy, st = self.lib, grid[0], grid[1], ctypes.c_void_p(stream)

        def go() -> None:
            rc = lib.cuLaunchKernel(fn, gx, gy, 1, threads, 1, 1, shared, st, params, None)
            if rc != 0:
                raise RuntimeError(f"cuLaunchKernel {rc}")
        go.keep = (vals, params)
        return go


def pack_torch(codes, bits: int):
    """Signed codes `[N, K]` (int32) -> base/high planes, as `row_split.pack_planes` does."""
    import torch

    n = codes.shape[0]
    u = (codes & ((1 << bits) - 1)).to(torch.uint8)
    if bits == 8:
        return u.contiguous(), u.contiguous()
    base = (u[:, 0::2] & 0xF) | ((u[:, 1::2] & 0xF) << 4)
    hi = u >> 4
    if bits == 5:
        sh = torch.arange(8, device=codes.device, dtype=torch.uint8)
        high = ((hi.reshape(n, -1, 8) & 1) << sh).sum(-1).to(torch.uint8)
    elif bits == 6:
        sh = 2 * torch.arange(4, device=codes.device, dtype=torch.uint8)
        high = ((hi.reshape(n, -1, 4) & 3) << sh).sum(-1).to(torch.uint8)
    else:
        high = base
    return base.contiguous(), high.contiguous()


def choose(m: int, n_out_tiles: int, narrow: str, wide: str, wide_bm: int = 256) -> str:
    """The launchers' rule: the wide tile once its grid reaches WIDE_MIN_TILES programs."""
    return wide if -(-m // wide_bm) * n_out_tiles >= WIDE_MIN_TILES else narrow


def run(cubins: Path | None, out: Path) -> None:
    import numpy as np
    import torch

    _import_runtime()
    from ninfer_compiler.ops.row_split import pack_planes

    global SHAPES, MS, FUSED, DENSE_SHAPE
    m0, m_rag = 1024, 1000
    if DRY:
        SHAPES = [(48, 256, 4), (64, 256, 5), (64, 256, 6), (64, 256, 8), (40, 256, 4)]
        MS, FUSED, DENSE_SHAPE, m0, m_rag = (64,), [("swiglu", 40, 256, 4), ("add", 64, 256, 5)], (48, 256), 40, 33
    out.mkdir(parents=True, exist_ok=True)
    log = open(out / "check_qgemm.log", "w")

    def say(*a) -> None:
        s = " ".join(str(x) for x in a)
        print(s, flush=True)
        log.write(s + "\n")
        log.flush()

    dev = torch.device("cpu" if DRY else "cuda")
    stream = 0 if DRY else torch.cuda.current_stream().cuda_stream
    say("device", "cpu (dry)" if DRY else torch.cuda.get_device_name(), "torch", torch.__version__)

    def sync() -> None:
        if not DRY:
            torch.cuda.synchronize()

    # ---- timing: batches of launches queued behind a sleep kernel, median per launch
    def timeit(calls: list) -> float:
        """ms per call of `calls` (a list of no-argument launchers, cycled: weight copies)."""
        calls[0]()
        if DRY:
            t = time.perf_counter()
            calls[0]()
            return (time.perf_counter() - t) * 1e3
        sync()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        calls[0]()
        b.record()
        b.synchronize()
        one = max(a.elapsed_time(b), 1e-3)
        reps = max(3, min(40, math.ceil(3.0 / one)))
        times = []
        for batch in range(5):
            torch.cuda._sleep(int(2e6 * min(2.0, reps * 0.02)))  # ~cycles: covers the enqueue time
            a.record()
            for i in range(reps):
                calls[(batch * reps + i) % len(calls)]()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / reps)
        return float(np.median(times))

    # ---- the bf16 matrix rate on this GPU (the ceiling the GEMMs are read against)
    if not DRY:
        g = torch.Generator(device=dev).manual_seed(0)
        a8 = torch.randn(8192, 8192, device=dev, generator=g).bfloat16()
        b8 = torch.randn(8192, 8192, device=dev, generator=g).bfloat16()
        t = timeit([lambda: a8 @ b8])
        say(f"torch bf16 8192^3: {2 * 8192**3 / t / 1e9:.0f} TFLOP/s ({t:.3f} ms)")
        del a8, b8

    # ---- the torch packer against the reference packer, every format
    rng = np.random.default_rng(0)
    for bits in (4, 5, 6, 8):
        c = rng.integers(-(1 << (bits - 1)), 1 << (bits - 1), size=(8, 256)).astype(np.int32)
        ref = pack_planes(c, np.ones((8, 4), np.float16), f"q{bits}_g{32 if bits == 8 else 64}_fp16")
        b, h = pack_torch(torch.from_numpy(c).to(dev), bits)
        assert np.array_equal(b.cpu().numpy(), ref["base"]), bits
        if "high" in ref:
            assert np.array_equal(h.cpu().numpy(), ref["high"]), bits
    say("torch packer matches row_split.pack_planes")

    # ---- kernels: cubins through the driver, or (dry) the interpreter
    index: dict[tuple, dict] = {}
    drv = None
    if not DRY:
        meta = json.loads((cubins / "index.json").read_text())
        say("baseline", meta["baseline"])
        drv = Driver()
        for e in meta["cubins"]:
            index[(e["kind"], e["epilogue"], e["n"], e["k"], e["bits"], e["config"])] = e
    else:
        from ninfer_compiler.ops import dense_triton, qgemm_triton
        from ninfer_compiler.ops.triton_aot import interpreted

        base_dir = Path("/tmp/qgemm-dry-baseline")
        old_q = baseline_module(os.environ.get("QGEMM_BASELINE", "HEAD"), "ninfer_compiler/ops/qgemm_triton.py",
                                "baseline_qgemm_triton", base_dir)
        old_d = baseline_module(os.environ.get("QGEMM_BASELINE", "HEAD"), "ninfer_compiler/ops/dense_triton.py",
                                "baseline_dense_triton", base_dir)
        ew = _elementwise()

    def c64(t) -> ctypes.c_uint64:
        return ctypes.c_uint64(t.data_ptr())

    def launcher(kind: str, ep: str, n: int, k: int, bits: int, cfg: str, tensors: list, m: int, extra=()):
        """One prepared launch; `tensors` are the kernel's pointer arguments in order."""
        if kind in ("new", "noasm", "old"):
            bm, bn = (min(b, 32) if DRY else b for b in CONFIGS[cfg][:2])
            out_n = bn // 2 if ep == "swiglu" else bn
            grid = (-(-m // bm) * -(-n // out_n), 1)
        elif kind == "dense":
            grid = (-(-m // DENSE_CONFIGS[cfg][0]), -(-n // 64))
        elif kind == "dense_old":
            grid = (-(-m // OLD_DENSE[0]), -(-n // OLD_DENSE[1]))
        else:
            grid = (-(-m // EW_BLOCK), 1)
        if DRY:
            def go() -> None:
                if kind in ("new", "noasm"):
                    interpreted(qgemm_triton.qgemm_kernel)[(grid[0],)](
                        *tensors, m, N=n, K=k, BITS=bits, BLOCK_M=bm, BLOCK_N=bn, GROUP_M=GROUP_M,
                        EPILOGUE=EPILOGUE[ep], ASM=False)
                elif kind == "old":
                    interpreted(old_q.qgemm_kernel)[(grid[0],)](
                        *tensors, m, N=n, K=k, BITS=bits, BLOCK_M=bm, BLOCK_N=bn, GROUP_M=GROUP_M, TRANS=True)
                elif kind == "dense":
                    bm_, bk_ = DENSE_CONFIGS[cfg][:2]
                    interpreted(dense_triton.dense_nt_kernel)[grid](*tensors, m, N=n, K=k, BLOCK_M=bm_,
                                                                    BLOCK_N=64, BLOCK_K=bk_)
                elif kind == "dense_old":
                    interpreted(old_d.dense_nt_kernel)[grid](*tensors, m, n, k, BLOCK_M=64, BLOCK_N=64, BLOCK_K=64)
                else:
                    interpreted(ew[cfg])[grid](*tensors, m, BLOCK=EW_BLOCK)
            return go
        e = index[(kind, ep, n, k, bits, cfg)]
        fn = e.get("_fn")
        if fn is None:
            fn = e["_fn"] = drv.load((cubins / e["file"]).read_bytes(), e["name"], e["shared"])
        args = [c64(t) for t in tensors]
        if kind == "elementwise":
            args.append(ctypes.c_int64(m))
        else:
            args.append(ctypes.c_int32(m))
            args.extend(ctypes.c_int32(v) for v in extra)
        return drv.prepare(fn, grid, e["threads"], e["shared"], args, stream)

    results: list[dict] = []
    gen = torch.Generator(device=dev).manual_seed(1)

    def weights(n: int, k: int, bits: int, copies: int):
        """Random codes and scales, their planes (several copies) and the float64 weight."""
        lo, hi_ = -(1 << (bits - 1)), 1 << (bits - 1)
        codes = torch.randint(lo, hi_, (n, k), device=dev, dtype=torch.int32, generator=gen)
        group = 32 if bits == 8 else 64
        scales = (torch.rand(n, k // group, device=dev, generator=gen) * 0.02 + 0.005).half()
        base, high = pack_torch(codes, bits)
        w64 = codes.double() * scales.double().repeat_interleave(group, 1)
        planes = [(base, high, scales)] + [(base.clone(), high.clone(), scales.clone()) for _ in range(copies - 1)]
        return planes, w64

    def n_copies(n: int, k: int, bits: int) -> int:
        return 1 if DRY else max(2, min(8, math.ceil(160e6 / (n * k * bits / 8))))

    def check_out(y, ref, m: int) -> tuple[float, bool]:
        yd = y[:m].double()
        if not bool(torch.isfinite(yd).all()):
            return float("inf"), False
        return (yd - ref[:m]).abs().max().item() / ref[:m].abs().max().item(), True

    def ragged_ok(y, ref, m_r: int) -> bool:
        return bool(torch.isnan(y[m_r:m0].float()).all()) and bool(torch.isfinite(y[:m_r].float()).all()) and \
            (y[:m_r].double() - ref[:m_r]).abs().max().item() / ref[:m_r].abs().max().item() < 2e-2

    def measure(op: str, kind: str, cfg: str, n: int, k: int, bits: int, calls, y, ref, ref_fold=None,
                flops: float = 1.0, torch_ms: dict | None = None) -> None:
        """Numerics (poisoned y, M = m0 and ragged M) and times at every M of one variant;
        `calls(m)` gives the launchers (one per weight copy)."""
        try:
            y.fill_(float("nan"))
            calls(m0)[0]()
            sync()
            err, finite = check_out(y, ref, m0)
            err_fold = check_out(y, ref_fold, m0)[0] if ref_fold is not None else err
            y.fill_(float("nan"))
            calls(m_rag)[0]()
            sync()
            rag = ragged_ok(y, ref, m_rag)
            rec = dict(kind=kind, op=op, n=n, k=k, bits=bits, config=cfg, err=err, err_fold=err_fold,
                       ragged_ok=rag, ok=finite and rag and err < 1e-2)
            for m in MS:
                t = timeit(calls(m))
                rec[f"ms_{m}"] = t
                rec[f"tflops_{m}"] = flops * 2 * m * n * k / t / 1e9
                if torch_ms is not None:
                    rec[f"torch_ms_{m}"] = torch_ms[m]
        except Exception as err:  # one config failing must not lose the others' numbers
            say(f"{op} {n}x{k}q{bits} {kind} {cfg}: FAILED {type(err).__name__}: {err}")
            return
        results.append(rec)
        say(json.dumps(rec))

    def gemm_calls(kind: str, cfg: str, n: int, k: int, bits: int, x, planes, y):
        def calls(m: int) -> list:
            if kind in ("new", "noasm"):
                return [launcher(kind, "plain", n, k, bits, cfg, [x, b, h, s, b, h, s, y, y], m) for b, h, s in planes]
            return [launcher(kind, "plain", n, k, bits, cfg, [x, b, h, s, y], m) for b, h, s in planes]
        return calls

    def check_gemm(n: int, k: int, bits: int) -> None:
        """Plain GEMM: baseline and this tree's kernel, every config, against torch bf16."""
        planes, w64 = weights(n, k, bits, n_copies(n, k, bits))
        wbf = w64.float().bfloat16()
        x = torch.randn(max(MS), k, device=dev, generator=gen).bfloat16()
        ref = x[:m0].double() @ w64.T
        ref_fold = x[:m0].double() @ wbf.double().T
        wbf2 = [wbf, wbf.clone()] if not DRY else [wbf]
        torch_ms = {m: timeit([(lambda m=m, w=w: x[:m] @ w.T) for w in wbf2]) for m in MS}
        y = torch.full((max(MS), n), float("nan"), device=dev, dtype=torch.bfloat16)
        variants = [("new", c) for c in NEW_CONFIGS] + [("old", "t128x128s4"), ("old", old_wide(bits))]
        if (n, k, bits) in NOASM and not DRY:
            variants.append(("noasm", old_wide(bits)))
        for kind, cfg in variants:
            measure("gemm", kind, cfg, n, k, bits, gemm_calls(kind, cfg, n, k, bits, x, planes, y), y, ref,
                    ref_fold, torch_ms=torch_ms)

    def launcher_choice(kind: str, n: int, k: int, bits: int, m: int, out_n: int = 128) -> str:
        """The config the baseline's / this tree's launcher runs (`qgemm.configs`, plain GEMM)."""
        return choose(m, -(-n // out_n), "t128x128s4", old_wide(bits) if kind == "old" else "t256x128s4")

    def check_fused(ep: str, n: int, k: int, bits: int) -> None:
        """A fused epilogue against the unfused sequence it replaces (this tree's GEMM + elementwise
        kernel, and the baseline's), each with the launcher's choice of config."""
        planes, w64 = weights(n, k, bits, n_copies(n, k, bits))
        planes2, w64_2 = weights(n, k, bits, len(planes)) if ep == "swiglu" else (planes, w64)
        x = torch.randn(max(MS), k, device=dev, generator=gen).bfloat16()
        res = (torch.randn(max(MS), n, device=dev, generator=gen) * 4).bfloat16()
        a = x[:m0].double() @ w64.T
        ref = a * torch.sigmoid(a) * (x[:m0].double() @ w64_2.T) if ep == "swiglu" else a + res[:m0].double()
        y = torch.full((max(MS), n), float("nan"), device=dev, dtype=torch.bfloat16)
        t1 = torch.empty((max(MS), n), device=dev, dtype=torch.bfloat16)
        t2 = torch.empty((max(MS), n), device=dev, dtype=torch.bfloat16)
        pairs = list(zip(planes, planes2, strict=True))

        def fused(cfg: str):
            def calls(m: int) -> list:
                out = []
                for (b1, h1, s1), (b2, h2, s2) in pairs:
                    ptrs = [x, b1, h1, s1, b2, h2, s2, y, y] if ep == "swiglu" else [x, b1, h1, s1, b1, h1, s1, res, y]
                    out.append(launcher("new", ep, n, k, bits, cfg, ptrs, m))
                return out
            return calls

        def unfused(kind: str):
            def calls(m: int) -> list:
                cfg = launcher_choice(kind, n, k, bits, m)
                seqs = []
                for p1, p2 in pairs:
                    g1 = gemm_calls(kind, cfg, n, k, bits, x, [p1], t1)(m)
                    if ep == "swiglu":
                        parts = g1 + gemm_calls(kind, cfg, n, k, bits, x, [p2], t2)(m) + [
                            launcher("elementwise", "plain", 0, 0, 16, "silu_mul", [t1, t2, y], m * n)]
                    else:
                        parts = g1 + [launcher("elementwise", "plain", 0, 0, 16, "add", [t1, res, y], m * n)]
                    seqs.append(lambda parts=parts: [p() for p in parts])
                return seqs
            return calls

        flops = 2.0 if ep == "swiglu" else 1.0
        for cfg in NEW_CONFIGS:
            measure(ep, "new", cfg, n, k, bits, fused(cfg), y, ref, flops=flops)
        for kind in ("new", "old"):
            measure(f"unfused_{ep}", kind, "launcher", n, k, bits, unfused(kind), y, ref, flops=flops)

    def check_dense() -> dict:
        """The dense small-N GEMM (GDN gate projections): baseline, every config, torch bf16."""
        n, k = DENSE_SHAPE
        wd = [(torch.randn(n, k, device=dev, generator=gen) * 0.02).bfloat16() for _ in range(1 if DRY else 4)]
        x = torch.randn(max(MS), k, device=dev, generator=gen).bfloat16()
        ref = x[:m0].double() @ wd[0].double().T
        y = torch.full((max(MS), n), float("nan"), device=dev, dtype=torch.bfloat16)
        torch_ms = {m: timeit([(lambda m=m, w=w: x[:m] @ w.T) for w in wd]) for m in MS}

        def dcalls(kind: str, cfg: str):
            extra = (n, k) if kind == "dense_old" else ()
            return lambda m: [launcher(kind, "plain", n, k, 16, cfg, [x, w, y], m, extra) for w in wd]
        for kind, cfg in [("dense", c) for c in DENSE_CONFIGS] + [("dense_old", "t64x64k64s3")]:
            measure("dense", kind, cfg, n, k, 16, dcalls(kind, cfg), y, ref, torch_ms=torch_ms)
        return torch_ms

    for n, k, bits in SHAPES:
        check_gemm(n, k, bits)
        if not DRY:
            torch.cuda.empty_cache()
    for ep, n, k, bits in FUSED:
        check_fused(ep, n, k, bits)
        if not DRY:
            torch.cuda.empty_cache()
    dense_torch_ms = check_dense()
    (out / "check_qgemm.json").write_text(json.dumps(results, indent=1))

    def best(kind: str, n: int, k: int, bits: int, m: int, op: str = "gemm") -> dict | None:
        """The fastest config at M = m."""
        rs = [r for r in results if (r["kind"], r["op"], r["n"], r["k"], r["bits"]) == (kind, op, n, k, bits)]
        return min(rs, key=lambda r: r[f"ms_{m}"]) if rs else None

    def pick(kind: str, n: int, k: int, bits: int, cfg: str, op: str = "gemm") -> dict | None:
        for r in results:
            if (r["kind"], r["op"], r["n"], r["k"], r["bits"], r["config"]) == (kind, op, n, k, bits, cfg):
                return r
        return None

    # ---- tables (short, last)
    ms_s = " / ".join(map(str, MS))
    say(f"\n## GEMM TFLOP/s at M = {ms_s} (err = max|y-ref|/max|ref| vs float64, M={m0}; rag = ragged M)")
    say("| N x K q | baseline (launcher) | new (launcher) | new best config per M | torch bf16 | err new / old | ok |")
    say("|---|---|---|---|---|---|---|")
    for n, k, bits in SHAPES:
        row_old, row_new, row_best, row_t = [], [], [], []
        for m in MS:
            ro = pick("old", n, k, bits, launcher_choice("old", n, k, bits, m))
            rn = pick("new", n, k, bits, launcher_choice("new", n, k, bits, m))
            rb = best("new", n, k, bits, m)
            row_old.append(f"{ro[f'tflops_{m}']:.0f}" if ro else "-")
            row_new.append(f"{rn[f'tflops_{m}']:.0f}" if rn else "-")
            row_best.append(f"{rb[f'tflops_{m}']:.0f} {rb['config']}" if rb else "-")
            row_t.append(f"{2 * m * n * k / rn[f'torch_ms_{m}'] / 1e9:.0f}" if rn else "-")
        rs = [r for r in results if (r["op"], r["n"], r["k"], r["bits"]) == ("gemm", n, k, bits)
              and r["kind"] in ("new", "old")]
        en = max((r["err"] for r in rs if r["kind"] == "new"), default=float("nan"))
        eo = max((r["err"] for r in rs if r["kind"] == "old"), default=float("nan"))
        ok = all(r["ok"] for r in rs) and len(rs) == len(NEW_CONFIGS) + 2
        say(f"| {n}x{k} q{bits} | {' / '.join(row_old)} | {' / '.join(row_new)} | {' / '.join(row_best)} | "
            f"{' / '.join(row_t)} | {en:.1e} / {eo:.1e} | {'ok' if ok else 'FAIL'} |")
    for n, k, bits in NOASM:
        ra, rn = pick("new", n, k, bits, old_wide(bits)), pick("noasm", n, k, bits, old_wide(bits))
        if ra and rn:
            fa = " / ".join(f"{ra[f'tflops_{m}']:.0f}" for m in MS)
            fn = " / ".join(f"{rn[f'tflops_{m}']:.0f}" for m in MS)
            say(f"{n}x{k} q{bits} {old_wide(bits)}: PRMT+FMA {fa}, shifts+I2F {fn} TFLOP/s")

    def per_m(r: dict | None, fmt: str = "{:.3f}", scale: float = 1.0) -> str:
        return " / ".join(fmt.format(r[f"ms_{m}"] * scale) for m in MS) if r else "-"

    say(f"\n## fused epilogues, ms at M = {ms_s}")
    say("| op | fused (best config per M) | unfused new | unfused baseline | err | ok |")
    say("|---|---|---|---|---|---|")
    for ep, n, k, bits in FUSED:
        fb = [best("new", n, k, bits, m, ep) for m in MS]
        fused_s = " / ".join("{:.3f} {}".format(r[f"ms_{m}"], r["config"]) if r else "-"
                             for r, m in zip(fb, MS, strict=True))
        un = pick("new", n, k, bits, "launcher", f"unfused_{ep}")
        uo = pick("old", n, k, bits, "launcher", f"unfused_{ep}")
        rs = [r for r in results if (r["op"], r["n"], r["k"]) == (ep, n, k)]
        err = max((r["err"] for r in rs), default=float("nan"))
        ok = "ok" if rs and all(r["ok"] for r in rs) else "FAIL"
        say(f"| {ep} {n}x{k} q{bits} | {fused_s} | {per_m(un)} | {per_m(uo)} | {err:.1e} | {ok} |")
    say(f"\n## dense {DENSE_SHAPE[0]}x{DENSE_SHAPE[1]} bf16, us at M = {ms_s}")
    say("| kernel | us | err | ok |")
    say("|---|---|---|---|")
    for r in [r for r in results if r["op"] == "dense"]:
        say(f"| {r['kind']} {r['config']} | {per_m(r, '{:.1f}', 1e3)} | {r['err']:.1e} | {'ok' if r['ok'] else 'FAIL'} |")
    say(f"| torch bf16 | {' / '.join(f'{dense_torch_ms[m] * 1e3:.1f}' for m in MS)} | | |")
    chunk = {kind: sum(LAUNCHES[s] * (pick(kind, *s, launcher_choice(kind, *s, MS[-1])) or {}).get(
        f"ms_{MS[-1]}", float("nan")) for s in LAUNCHES) for kind in ("old", "new")}
    say(f"\nquantized projections of one {MS[-1]}-token chunk (launch counts of the 27B, unfused, launcher's "
        f"configs): baseline {chunk['old']:.1f} ms, new {chunk['new']:.1f} ms")
    log.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("out", type=Path)
    b.add_argument("--baseline", default="HEAD", help="git revision whose kernels are the baseline")
    b.add_argument("-j", type=int, default=os.cpu_count() or 2)
    r = sub.add_parser("run")
    r.add_argument("--cubins", type=Path, default=None)
    r.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out/check_qgemm")))
    args = ap.parse_args()
    t0 = time.time()
    if args.cmd == "build":
        build(args.out, args.baseline, args.j)
    else:
        run(args.cubins, args.out)
    print(f"({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
