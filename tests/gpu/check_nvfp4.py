#!/usr/bin/env python3
"""nvfp4 Triton kernels (`ops/nvfp4_triton.py`) on the H200: numerics, GB/s and TFLOP/s.

    python3 tests/gpu/check_nvfp4.py --out $OUT            # GPU machine: torch + Triton, no TVM
    NVFP4_DRY=cpu .venv/bin/python tests/gpu/check_nvfp4.py  # here: interpreter, tiny shapes

Per 27B projection shape it draws random valid planes (every E2M1 word, E4M3FN scales in
[2^-6, 2^4), a random divisor) on the GPU, then for every kernel config: poisons the output,
checks rows of the result against a float64 reference (error over max |y|), and times the kernel
(CUDA events, median of repeats). Decode (M = 1, 8) is reported in GB/s of weight + activation
bytes next to a measured device-to-device copy; prefill (M = 1024, 7680) in TFLOP/s next to
torch's bf16 matmul of the same shape. The kernels are plain `triton.jit` launches here (the
package launches the same kernels as AOT cubins).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DRY = os.environ.get("NVFP4_DRY") == "cpu"
if DRY:
    sys.path.insert(0, str(ROOT))
    import tests.conftest  # noqa: F401 (Triton's interpreter)

import torch  # noqa: E402


def _kernels():
    """The kernel module by path (the package's other modules need TVM, absent on the GPU box)."""
    spec = importlib.util.spec_from_file_location("nvfp4_triton", ROOT / "ninfer_compiler/ops/nvfp4_triton.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["nvfp4_triton"] = mod
    spec.loader.exec_module(mod)
    return mod


E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def e2m1_table(dev) -> torch.Tensor:
    mag = torch.tensor(E2M1, dtype=torch.float64, device=dev)
    return torch.cat([mag, -mag])


def e4m3_values(s: torch.Tensor) -> torch.Tensor:
    s = s.to(torch.int64)
    e, m = s >> 3, s & 7
    normal = (8 + m).double() * torch.pow(2.0, (e - 10).double())
    return torch.where(e == 0, m.double() * 2.0**-9, normal)


def planes(n: int, k: int, dev, gen):
    codes = torch.randint(0, 16, (n, k), dtype=torch.uint8, device=dev, generator=gen)
    # scales around 1 (words 0x18..0x5F: 2^-4 .. 2^4): realistic weights, no fp32 overflow in sums
    scales = torch.randint(0x18, 0x60, (n, k // 16), dtype=torch.uint8, device=dev, generator=gen)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    divisor = torch.rand(1, device=dev, generator=gen, dtype=torch.float32) * 2 + 0.5
    return codes, packed.contiguous(), scales, divisor


def reference(x, codes, scales, divisor, rows):
    w = e2m1_table(x.device)[codes[rows].long()] * e4m3_values(scales[rows]).repeat_interleave(16, dim=1)
    return x.double() @ (w / divisor.double()).T


def timed(fn, reps: int) -> float:
    """Median milliseconds of `fn` over `reps` launches, CUDA events (one warm-up)."""
    fn()
    if DRY:
        return float("nan")
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def bench_shape(nt, n, k, dev, gen, decode_ms, prefill_ms, gemv_cfgs, gemm_cfgs, copy_gbs, rows_checked):
    """Rows of the table for one projection shape `[n, k]`."""
    table = []
    codes, packed, scales, divisor = planes(n, k, dev, gen)
    w_bf16 = (torch.randn(n, k, device=dev, generator=gen) * 0.02).to(torch.bfloat16)
    for m in decode_ms:
        x = torch.randn(m, k, device=dev, generator=gen).to(torch.bfloat16)
        ref = reference(x, codes, scales, divisor, rows_checked)
        wbytes = n * k // 2 + n * k // 16 + m * k * 2 + m * n * 2
        for bn, bk, warps, stages, target in gemv_cfgs:
            tiles = -(-n // bn)
            steps = -(-k // bk)
            want = max(1, min(steps, -(-target // tiles)))
            per = -(-steps // want)
            splits = -(-steps // per)
            part = torch.full((splits, m, n), float("nan"), device=dev)
            grid = (tiles, splits, -(-m // 16))

            def run(part=part, x=x, m=m, grid=grid, per=per, bn=bn, bk=bk, warps=warps, stages=stages):
                nt.nvfp4_gemv_kernel[grid](x, packed, scales, divisor, part, m, n, k // 64, per,
                                           BLOCK_M=16, BLOCK_N=bn, BLOCK_K=bk, F32_DOT=DRY,
                                           num_warps=warps, num_stages=stages)

            run()
            y = part.sum(0)
            err = float(((y[:, rows_checked].double() - ref).abs().max() / ref.abs().max()).item())
            nan = bool(torch.isnan(y).any().item())
            ms = timed(run, 50)
            ms_red = timed(lambda part=part, run=run: (run(), part.sum(0).to(torch.bfloat16)), 50)
            gbs = wbytes / ms / 1e6
            row = dict(kind="gemv", n=n, k=k, m=m, cfg=f"bn{bn} bk{bk} w{warps} s{stages} split{splits}",
                       err=err, nan=nan, ms=ms, ms_with_sum=ms_red, GBs=gbs, pct_copy=100 * gbs / copy_gbs)
            table.append(row)
            print(row, flush=True)
    for m in prefill_ms:
        x = torch.randn(m, k, device=dev, generator=gen).to(torch.bfloat16)
        ref = reference(x[:256], codes, scales, divisor, rows_checked)
        flops = 2 * m * n * k
        t_torch = float("nan") if DRY else timed(lambda x=x: x @ w_bf16.T, 10)
        for bm, bn, bk, warps, stages, trans, group in gemm_cfgs:
            y = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=dev)
            grid = (-(-m // bm) * -(-n // bn),)

            def run(y=y, x=x, m=m, grid=grid, bm=bm, bn=bn, bk=bk, warps=warps, stages=stages, trans=trans,
                    group=group):
                nt.nvfp4_gemm_kernel[grid](x, packed, scales, divisor, y, m, n, k // 64, BLOCK_M=bm,
                                           BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group, TRANS=trans,
                                           F32_DOT=DRY, num_warps=warps, num_stages=stages)

            try:
                run()
            except Exception as exc:  # a config that does not fit (shared memory): report, go on
                print("failed", bm, bn, bk, trans, str(exc)[:200], flush=True)
                continue
            got = y[:256, rows_checked].double()
            err = float(((got - ref).abs().max() / ref.abs().max()).item())
            nan = bool(torch.isnan(y).any().item())
            ms = timed(run, 10)
            tf = flops / ms / 1e9
            row = dict(kind="gemm", n=n, k=k, m=m, cfg=f"{bm}x{bn}x{bk} w{warps} s{stages} {'T' if trans else 'N'}",
                       err=err, nan=nan, ms=ms, TFLOPs=tf, torch_bf16_TFLOPs=flops / t_torch / 1e9)
            table.append(row)
            print(row, flush=True)
    return table


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    nt = _kernels()
    dev = "cpu" if DRY else "cuda"
    gen = torch.Generator(device=dev).manual_seed(0)
    if DRY:
        shapes, decode_ms, prefill_ms = [(256, 320), (128, 1024)], [1, 8], [70]
        gemm_cfgs = [(64, 64, 64, 4, 2, True, 8), (64, 64, 64, 4, 2, False, 8)]
        gemv_cfgs = [(64, 256, 4, 2, 264)]
    else:
        shapes, decode_ms, prefill_ms = [(17408, 5120), (5120, 17408), (6144, 5120)], [1, 8], [1024, 7680]
        # (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages, TRANS, GROUP_M)
        gemm_cfgs = [(128, 128, 64, 8, 3, True, 8), (128, 128, 64, 8, 3, False, 8),
                     (128, 256, 64, 8, 3, True, 8), (128, 128, 128, 8, 3, True, 8)]
        # (BLOCK_N, BLOCK_K, warps, stages, target programs)
        gemv_cfgs = [(64, 256, 4, 3, 264), (64, 512, 4, 3, 264), (128, 256, 8, 3, 264), (32, 256, 4, 4, 528)]
    rows_checked = slice(0, 256)
    log, table = [], []

    # device copy bandwidth (read + write bytes)
    if DRY:
        copy_gbs = float("nan")
    else:
        src = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
        dst = torch.empty_like(src)
        copy_gbs = 2 * src.numel() / timed(lambda: dst.copy_(src), 20) / 1e6
        del src, dst
    log.append({"copy_GBs": copy_gbs})

    for n, k in shapes:
        rows = bench_shape(nt, n, k, dev, gen, decode_ms, prefill_ms, gemv_cfgs, gemm_cfgs, copy_gbs, rows_checked)
        log += rows
        table += rows
        if not DRY:
            torch.cuda.empty_cache()

    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "check_nvfp4.json").write_text(json.dumps(log, indent=1))
    print(f"\ndevice copy: {copy_gbs:.0f} GB/s (read + write)")
    print(f"{'kind':5} {'N':>6} {'K':>6} {'M':>5} {'config':30} {'err':>8} {'ms':>8} {'GB/s|TF':>8} {'%copy|torch':>11}")
    for r in table:
        rate = r.get("GBs", r.get("TFLOPs"))
        rel = r["pct_copy"] if r["kind"] == "gemv" else 100 * r["TFLOPs"] / r["torch_bf16_TFLOPs"]
        flag = " NaN!" if r["nan"] else ""
        print(f"{r['kind']:5} {r['n']:6d} {r['k']:6d} {r['m']:5d} {r['cfg']:30} {r['err']:8.1e} {r['ms']:8.4f} "
              f"{rate:8.1f} {rel:10.1f}%{flag}")


if __name__ == "__main__":
    main()
