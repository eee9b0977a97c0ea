#!/usr/bin/env python3
"""Prefill GEMM over grouped-int planes (`ops/qgemm_triton.py`) on the H200: numerics and TFLOP/s.

    # build machine: cubins for sm_90a through the AOT path (ops/triton_aot.py), with an index
    .venv/bin/python tests/gpu/check_qgemm.py build .cache/qgemm-bench
    # GPU machine (torch + CUDA driver; Triton only for the fallback): carry .cache/qgemm-bench
    python3 tests/gpu/check_qgemm.py run --cubins .cache/qgemm-bench --out $OUT

`run` draws random codes (every value of the format) and fp16 scales per shape, packs them into
the row_split planes on the GPU (the packer is first checked against `row_split.pack_planes`),
and for every kernel config: poisons y with NaN, runs M = 1024 and compares with a float64
reference `x @ (scale * code)^T` (error over max |y|; also against the reference with the weights
rounded to bf16, which is what the kernel computes before its own bf16 output rounding), checks a
ragged M, then times M = 1024, 2048, 7680 (CUDA events, median of repeats) next to torch's bf16
matmul of the same shape. Cubins are launched through the driver API (ctypes), like the package's
launcher does; if they do not load, the kernel is JIT-compiled with the device's Triton instead.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
# On a bare GPU machine: dry run with `QGEMM_DRY=cpu` here (Triton's interpreter, tiny shapes).
DRY = os.environ.get("QGEMM_DRY") == "cpu"
if DRY:
    import tests.conftest  # noqa: F401 (Triton's interpreter, with the GPU's bf16 dot and rounding)


def _import_runtime() -> None:
    """`ninfer_runtime` is `runtime/` (pyproject's package-dir); alias it where it is not installed."""
    try:
        import ninfer_runtime  # noqa: F401
    except ImportError:
        import importlib.util

        spec = importlib.util.spec_from_file_location(
            "ninfer_runtime", ROOT / "runtime" / "__init__.py", submodule_search_locations=[str(ROOT / "runtime")])
        module = importlib.util.module_from_spec(spec)
        sys.modules["ninfer_runtime"] = module
        spec.loader.exec_module(module)

# (N, K, bits): 27B prefill projections (MLP gate/up q4, down q5, GDN/attention q4/q5), q6/q8, ragged N
SHAPES = [(17408, 5120, 4), (5120, 17408, 5), (6144, 5120, 5), (6144, 5120, 4), (5120, 6144, 5),
          (2048, 5120, 4), (1024, 5120, 4), (1024, 5120, 5), (6144, 5120, 6), (6144, 5120, 8),
          (1000, 5120, 4)]
CONFIGS = {  # name: (BLOCK_M, BLOCK_N, warps, stages, TRANS)
    "t128x128w8s3": (128, 128, 8, 3, 1), "t256x128w8s3": (256, 128, 8, 3, 1),
    "t128x256w8s3": (128, 256, 8, 3, 1), "t64x128w4s4": (64, 128, 4, 4, 1),
    "t128x128w8s4": (128, 128, 8, 4, 1), "t256x128w8s4": (256, 128, 8, 4, 1),
    "n128x128w8s3": (128, 128, 8, 3, 0), "n128x256w8s3": (128, 256, 8, 3, 0),
}
GROUP_M = 8
JIT_CONFIGS = ("t128x128w8s3", "t256x128w8s3", "n128x128w8s3")  # the fallback compiles on the device: fewer
MS = (1024, 2048, 7680)
SIGNATURE = {"x_ptr": "*bf16", "base_ptr": "*u8", "high_ptr": "*u8", "scales_ptr": "*fp16",
             "y_ptr": "*bf16", "M": "i32"}


def _build_one(job: tuple[tuple[int, int, int], str, str]) -> dict:
    (n, k, bits), name, out = job
    from ninfer_compiler.ops.qgemm_triton import qgemm_kernel
    from ninfer_compiler.ops.triton_aot import compile_kernel

    bm, bn, warps, stages, trans = CONFIGS[name]
    consts = dict(N=n, K=k, BITS=bits, BLOCK_M=bm, BLOCK_N=bn, GROUP_M=GROUP_M, TRANS=bool(trans))
    img = compile_kernel(qgemm_kernel, signature=SIGNATURE, constants=consts, arch="sm_90a",
                         num_warps=warps, num_stages=stages)
    file = f"{n}x{k}q{bits}_{name}.cubin"
    (Path(out) / file).write_bytes(img.cubin)
    return dict(file=file, n=n, k=k, bits=bits, config=name, name=img.name, shared=img.shared,
                threads=img.threads)


def build(out: Path, jobs: int) -> None:
    from concurrent.futures import ProcessPoolExecutor

    out.mkdir(parents=True, exist_ok=True)
    work = [(s, c, str(out)) for s in SHAPES for c in CONFIGS]
    with ProcessPoolExecutor(jobs) as ex:
        index = list(ex.map(_build_one, work))
    (out / "index.json").write_text(json.dumps(index, indent=1))
    print(f"{len(index)} cubins in {out}")


class Driver:
    """cuModuleLoadData / cuLaunchKernel through ctypes (what the package's launcher does in C++)."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.modules: list[ctypes.c_void_p] = []

    def load(self, data: bytes, name: str, shared: int) -> ctypes.c_void_p:
        mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
        rc = self.lib.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(data))
        if rc != 0:
            raise RuntimeError(f"cuModuleLoadData {rc}")
        self.modules.append(mod)
        rc = self.lib.cuModuleGetFunction(ctypes.byref(fn), mod, name.encode())
        if rc != 0:
            raise RuntimeError(f"cuModuleGetFunction {rc}")
        if shared > 48 * 1024:
            rc = self.lib.cuFuncSetAttribute(fn, 8, ctypes.c_int(shared))
            if rc != 0:
                raise RuntimeError(f"cuFuncSetAttribute {rc}")
        return fn

    def launch(self, fn, grid: int, threads: int, shared: int, ptrs: list[int], m: int, stream: int) -> None:
        vals = [ctypes.c_uint64(p) for p in ptrs] + [ctypes.c_int32(m), ctypes.c_uint64(0), ctypes.c_uint64(0)]
        params = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
        rc = self.lib.cuLaunchKernel(fn, grid, 1, 1, threads, 1, 1, shared, ctypes.c_void_p(stream), params, None)
        if rc != 0:
            raise RuntimeError(f"cuLaunchKernel {rc}")


def pack_torch(codes, bits: int):
    """Signed codes `[N, K]` (int32, cuda) -> base/high planes, as `row_split.pack_planes` does."""
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


def run(cubins: Path | None, out: Path) -> None:
    import numpy as np
    import torch

    _import_runtime()
    from ninfer_compiler.ops.row_split import pack_planes

    shapes, ms, m0, m_rag = SHAPES, MS, 1024, 1000
    if DRY:
        shapes, ms, m0, m_rag = [(48, 256, 4), (64, 256, 5), (64, 256, 6), (64, 256, 8)], (64,), 40, 33

    out.mkdir(parents=True, exist_ok=True)
    log = open(out / "check_qgemm.log", "w")

    def say(*a) -> None:
        s = " ".join(str(x) for x in a)
        print(s, flush=True)
        log.write(s + "\n")
        log.flush()

    dev = torch.device("cpu" if DRY else "cuda")
    torch.zeros(1, device=dev)
    stream = 0 if DRY else torch.cuda.current_stream().cuda_stream
    say("device", "cpu (dry)" if DRY else torch.cuda.get_device_name(), "torch", torch.__version__)

    def sync() -> None:
        if not DRY:
            torch.cuda.synchronize()
    # the torch packer against the reference packer, every format
    rng = np.random.default_rng(0)
    for bits in (4, 5, 6, 8):
        c = rng.integers(-(1 << (bits - 1)), 1 << (bits - 1), size=(8, 256)).astype(np.int32)
        ref = pack_planes(c, np.ones((8, 4), np.float16), f"q{bits}_g{32 if bits == 8 else 64}_fp16")
        b, h = pack_torch(torch.from_numpy(c).to(dev), bits)
        assert np.array_equal(b.cpu().numpy(), ref["base"]), bits
        if "high" in ref:
            assert np.array_equal(h.cpu().numpy(), ref["high"]), bits
    say("torch packer matches row_split.pack_planes")

    index = {}
    drv = None
    if cubins is not None and (cubins / "index.json").exists() and not DRY:
        drv = Driver()
        for e in json.loads((cubins / "index.json").read_text()):
            index[(e["n"], e["k"], e["bits"], e["config"])] = e
    mode = "aot-cubin"

    def make_launcher(n: int, k: int, bits: int, cfg: str):
        nonlocal mode, drv
        bm, bn, warps, stages, trans = CONFIGS[cfg]
        e = index.get((n, k, bits, cfg))
        if drv is not None and e is not None:
            try:
                fn = drv.load((cubins / e["file"]).read_bytes(), e["name"], e["shared"])

                def go(x, base, high, sc, y, m):
                    grid = -(-m // bm) * -(-n // bn)
                    drv.launch(fn, grid, e["threads"], e["shared"],
                               [x.data_ptr(), base.data_ptr(), high.data_ptr(), sc.data_ptr(), y.data_ptr()], m, stream)
                return go
            except RuntimeError as err:
                say("cubin load failed, JIT fallback:", err)
                drv = None
        mode = "triton-jit"
        from ninfer_compiler.ops.qgemm_triton import qgemm_kernel

        def jit(x, base, high, sc, y, m):
            grid = (-(-m // bm) * -(-n // bn),)
            qgemm_kernel[grid](x, base, high, sc, y, m, N=n, K=k, BITS=bits, BLOCK_M=bm, BLOCK_N=bn,
                               GROUP_M=GROUP_M, TRANS=bool(trans), num_warps=warps,
                               num_stages=stages)
        return jit

    def timeit(f, reps: int = 10) -> float:
        f()
        f()
        if DRY:
            t = time.perf_counter()
            f()
            return (time.perf_counter() - t) * 1e3
        times = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            f()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        return float(np.median(times))

    def measure(n, k, bits, cfg, x_all, base, high, scales, ref, ref_fold, ymax, torch_ms) -> dict:
        go = make_launcher(n, k, bits, cfg)
        y = torch.full((max(ms), n), float("nan"), device=dev, dtype=torch.bfloat16)
        go(x_all, base, high, scales, y, m0)
        sync()
        yd = y[:m0].double()
        finite = bool(torch.isfinite(yd).all())
        err = (yd - ref).abs().max().item() / ymax if finite else float("inf")
        err_fold = (yd - ref_fold).abs().max().item() / ymax if finite else float("inf")
        # ragged M: rows past M stay poisoned, rows below match the reference
        y.fill_(float("nan"))
        go(x_all, base, high, scales, y, m_rag)
        sync()
        ragged_ok = bool(torch.isnan(y[m_rag:m0]).all()) and bool(torch.isfinite(y[:m_rag]).all()) and \
            (y[:m_rag].double() - ref[:m_rag]).abs().max().item() / ymax < 2e-2
        rec = dict(n=n, k=k, bits=bits, config=cfg, mode=mode, err=err, err_fold=err_fold, ragged_ok=ragged_ok)
        for m in ms:
            t = timeit(lambda m=m: go(x_all, base, high, scales, y, m))
            rec[f"ms_{m}"] = t
            rec[f"tflops_{m}"] = 2 * m * n * k / t / 1e9
            rec[f"torch_tflops_{m}"] = 2 * m * n * k / torch_ms[m] / 1e9
        return rec

    results = []
    gen = torch.Generator(device=dev).manual_seed(1)
    for n, k, bits in shapes:
        lo, hi_ = -(1 << (bits - 1)), 1 << (bits - 1)
        codes = torch.randint(lo, hi_, (n, k), device=dev, dtype=torch.int32, generator=gen)
        group = 32 if bits == 8 else 64
        scales = (torch.rand(n, k // group, device=dev, generator=gen) * 0.02 + 0.005).half()
        base, high = pack_torch(codes, bits)
        w64 = codes.double() * scales.double().repeat_interleave(group, 1)
        wbf = w64.float().bfloat16()  # the kernel's folded weight (fp32 product, one bf16 rounding)
        x_all = torch.randn(max(ms), k, device=dev, generator=gen).bfloat16()
        ref = x_all[:m0].double() @ w64.T
        ref_fold = x_all[:m0].double() @ wbf.double().T
        ymax = ref.abs().max().item()
        torch_ms = {m: timeit(lambda m=m, x=x_all, w=wbf: x[:m] @ w.T) for m in ms}
        for cfg in CONFIGS:
            if mode == "triton-jit" and cfg not in JIT_CONFIGS:
                continue
            try:
                rec = measure(n, k, bits, cfg, x_all, base, high, scales, ref, ref_fold, ymax, torch_ms)
            except Exception as err:  # one config failing must not lose the others' numbers
                say(f"{n}x{k}q{bits} {cfg}: FAILED {type(err).__name__}: {err}")
                continue
            results.append(rec)
            say(json.dumps(rec))
    (out / "check_qgemm.json").write_text(json.dumps(results, indent=1))
    # table: per shape, every config at M=7680, best first
    say(f"\n| N x K q | config | max err / max|y| (vs bf16-folded ref) | ragged M | TFLOP/s M={' / '.join(map(str, ms))}"
        " | torch bf16 TFLOP/s |")
    say("|---|---|---|---|---|---|")
    for n, k, bits in shapes:
        rs = sorted([r for r in results if (r["n"], r["k"], r["bits"]) == (n, k, bits)],
                    key=lambda r: -r[f"tflops_{max(ms)}"])
        for r in rs:
            ours = " / ".join(f"{r[f'tflops_{m}']:.0f}" for m in ms)
            theirs = " / ".join(f"{r[f'torch_tflops_{m}']:.0f}" for m in ms)
            say(f"| {n}x{k} q{bits} | {r['config']} | {r['err']:.2e} ({r['err_fold']:.2e}) | "
                f"{'ok' if r['ragged_ok'] else 'FAIL'} | {ours} | {theirs} |")
    log.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("out", type=Path)
    b.add_argument("-j", type=int, default=os.cpu_count() or 2)
    r = sub.add_parser("run")
    r.add_argument("--cubins", type=Path, default=None)
    r.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out/check_qgemm")))
    args = ap.parse_args()
    t0 = time.time()
    if args.cmd == "build":
        build(args.out, args.j)
    else:
        run(args.cubins, args.out)
    print(f"({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
