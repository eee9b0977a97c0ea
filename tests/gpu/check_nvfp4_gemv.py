"""The tensor-core nvfp4 decode GEMV (`ops/nvfp4_gemv_cuda.cu`) on a GPU, launched from cupy.

    python3 tests/gpu/check_nvfp4_gemv.py fatbins                      # here (nvcc): sm_90a fatbins
    python3 tests/gpu/check_nvfp4_gemv.py cupy --out $OUT              # GPU machine, carry .cache/ninfer/nvfp4-gemv-check

`cupy` measures the device's copy bandwidth with its own kernel (1 GiB, read + write), fills random
valid planes (every code byte, E4M3 scales 0x00..0x7E: zero, subnormal and normal, a divisor) for
the 27B decode projections of the nvfp4 recipe, and checks batch 1, 2, 4, 8 against a float64
reference on up to 2,048 rows (outputs poisoned with NaN first; every output must be written).
Times are per launch inside a CUDA graph, median of `--reps`, rotating over enough weight copies
(>= 300 MB) that L2 cannot hold them. It also sweeps the launch plan at batch 1 (K split, block
size, persistent or one block per row group) and a 2-chunk pipeline variant. A table is printed last; the log and a JSON go to --out.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cupy_bench import graph_us  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "ninfer_compiler" / "ops" / "nvfp4_gemv_cuda.cu"
FATBINS = ROOT / ".cache" / "ninfer" / "nvfp4-gemv-check"
VARIANTS = {"ch4": [], "ch2": ["-DNVFP4_CH=2"]}  # default first

# (N, K): the nvfp4 projections of Qwen3.6-27B (convert/recipes.py DENSE_NVFP4; the head is q8)
CASES = {
    "mlp gate/up 17408x5120": (17408, 5120),
    "mlp down 5120x17408": (5120, 17408),
    "attn q+gate 12288x5120": (12288, 5120),
    "gdn v/z 6144x5120": (6144, 5120),
    "gdn q/k 2048x5120": (2048, 5120),
    "attn k/v 1024x5120": (1024, 5120),
    "out proj 5120x6144": (5120, 6144),
}

BW_SOURCE = r"""
#include <stdint.h>
extern "C" __global__ void bw_copy(const uint4* __restrict__ src, uint4* __restrict__ dst, uint32_t n) {
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) dst[i] = src[i];
}
"""

E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])


def e4m3(s: np.ndarray) -> np.ndarray:
    """E4M3FN bytes (no NaN) as float64."""
    s = s.astype(np.int64)
    e, m = (s >> 3) & 0xF, s & 7
    mag = np.where(e == 0, m / 8.0 * 2.0**-6, (1 + m / 8.0) * 2.0 ** (e - 7))
    return np.where(s & 0x80, -mag, mag)


def tc_plan(rows: int, k: int, sms: int = 132, warps_per_sm: int = 16) -> tuple[int, int, int]:
    """(ks, warps per block, grid): a copy of ops/nvfp4.py tc_plan (this script runs without TVM)."""
    chunks = k // 128
    best = None
    for ks in (1, 2, 4, 5, 8, 10, 16):
        if ks > chunks:
            continue
        warps, groups, grid = geometry(rows, ks, sms, warps_per_sm)
        rounds = -(-groups // grid)
        occupancy = min(1.0, grid * warps / (sms * 12.0))
        cost = rounds * (-(-chunks // ks) + 1) / occupancy
        if best is None or cost < best[0] - 1e-9:
            best = (cost, ks, warps, grid)
    return best[1], best[2], best[3]


def geometry(rows: int, ks: int, sms: int = 132, warps_per_sm: int = 16) -> tuple[int, int, int]:
    """(warps per block, groups, persistent grid) for K split `ks`."""
    slots = max(1, 8 // ks)
    warps = ks * slots
    groups = -(-(rows // 16) // slots)
    return warps, groups, min(groups, (warps_per_sm // warps) * sms)


def fatbins() -> None:
    """sm_90a fatbins of the kernel variants and the bandwidth kernel, under .cache (carry it)."""
    FATBINS.mkdir(parents=True, exist_ok=True)
    (FATBINS / "bw.cu").write_text(BW_SOURCE)
    jobs = {f"{tag}.fatbin": (SOURCE, flags) for tag, flags in VARIANTS.items()}
    jobs["bw.fatbin"] = (FATBINS / "bw.cu", [])
    for name, (src, flags) in jobs.items():
        cmd = ["nvcc", "-fatbin", "-O3", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", "-Xptxas", "-v",
               *flags, str(src), "-o", str(FATBINS / name)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        regs = [ln.strip() for ln in proc.stderr.splitlines() if "registers" in ln or "spill" in ln]
        print(name, proc.returncode, *regs, sep="\n  ")
        if proc.returncode:
            print(proc.stderr)
            raise SystemExit(1)


def cupy_check(out: Path, reps: int, smoke: bool) -> int:
    import cupy as cp

    out.mkdir(parents=True, exist_ok=True)
    log = open(out / "nvfp4_gemv.log", "w")  # noqa: SIM115 (closed at the end)

    def say(*a: object) -> None:
        print(*a, flush=True)
        print(*a, file=log, flush=True)

    mods = {tag: cp.RawModule(path=str(FATBINS / f"{tag}.fatbin")) for tag in VARIANTS}
    bw = cp.RawModule(path=str(FATBINS / "bw.fatbin")).get_function("bw_copy")
    u32 = np.uint32

    def gpu_us(fn, n_calls: int) -> float:
        return graph_us(fn, n_calls, reps)

    src = cp.ones(1 << 30, dtype=cp.uint8)
    dst = cp.empty_like(src)
    nvec = u32((1 << 30) // 16)
    copy_us = gpu_us(lambda i: bw((132 * 8,), (512,), (src, dst, nvec)), 5)
    copy_gb_s = 2 * (1 << 30) / (copy_us * 1e-6) / 1e9
    say(f"device copy kernel, 1 GiB: {copy_gb_s:.0f} GB/s (read + write)")
    src = dst = None

    rng = np.random.default_rng(0)
    results, ok = [], True
    cases = {"smoke 64x256": (64, 256)} if smoke else {"smoke 64x256": (64, 256), **CASES}
    for name, (n, k) in cases.items():
        try:
            nbytes = n * k // 2 + n * k // 16
            copies = max(2, min(128, -(-300_000_000 // nbytes)))
            sets = []
            for _ in range(copies):
                codes = cp.random.randint(0, 256, size=(n, k // 2), dtype=cp.int32).astype(cp.uint8)
                scales = cp.random.randint(0, 0x7F, size=(n, k // 16), dtype=cp.int32).astype(cp.uint8)
                sets.append((codes, scales))
            divisor = float(rng.uniform(0.5, 3.0))
            d_dev = cp.asarray(np.array([divisor], np.float32))
            rows = np.arange(n) if n <= 2048 else np.r_[np.arange(1024), np.arange(n - 1024, n)]
            c_h, s_h = cp.asnumpy(sets[0][0][rows]), cp.asnumpy(sets[0][1][rows])
            nib = np.stack([c_h & 0xF, c_h >> 4], axis=-1).reshape(len(rows), k)
            w64 = E2M1[nib] * np.repeat(e4m3(s_h), 16, axis=1) / np.float64(np.float32(divisor))
            plan = tc_plan(n, k)
            ks0 = plan[0]

            def launch(tag, planes, x, y, b, plan, fn_name="ninfer_nvfp4_gemv_ybf16", n=n, k=k, d_dev=d_dev):
                ks, warps, grid = plan
                fn = mods[tag].get_function(fn_name)
                fn((grid,), (32 * warps,), (x, planes[0], planes[1], d_dev, y, u32(n), u32(k), u32(b), u32(ks)))

            for b in (1, 2, 4, 8):
                xf = rng.standard_normal((b, k)).astype(np.float32)
                x_bits = (xf.view(np.uint32) >> 16).astype(np.uint16)
                x64 = (x_bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
                ref = x64 @ w64.T
                x_dev = cp.asarray(x_bits)
                for out_t, fn_name in (("f32", "ninfer_nvfp4_gemv_yf32"), ("bf16", "ninfer_nvfp4_gemv_ybf16")):
                    if out_t == "f32":
                        y = cp.full((b, n), np.nan, dtype=cp.float32)
                    else:
                        y = cp.full((b, n), 0xFFFF, dtype=cp.uint16)  # bf16 NaN
                    launch("ch4", sets[0], x_dev, y, b, plan, fn_name)
                    cp.cuda.Device().synchronize()
                    yh = cp.asnumpy(y)
                    if out_t == "bf16":
                        yh = (yh.astype(np.uint32) << 16).view(np.float32)
                    nan = int(np.isnan(yh).sum())
                    err = float(np.abs(yh[:, rows].astype(np.float64) - ref).max() / np.abs(ref).max())
                    err = err if np.isfinite(err) else float("inf")
                    tol = 1e-5 if out_t == "f32" else 8e-3
                    good = nan == 0 and err < tol
                    ok &= good
                    results.append({"case": name, "kind": "err", "b": b, "out": out_t, "err": err, "nan": nan,
                                    "ok": good})
                    say(f"{name} b={b} y{out_t}: err {err:.2e} nan {nan} {'ok' if good else 'FAIL'}")

            for extra in [(ks, *geometry(n, ks)[::2]) for ks in (8, 16) if ks <= k // 128]:
                for tag in VARIANTS:  # other plans and the 2-chunk build: b = 8, fp32 output
                    xf = rng.standard_normal((8, k)).astype(np.float32)
                    x_bits = (xf.view(np.uint32) >> 16).astype(np.uint16)
                    ref = (x_bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64) @ w64.T
                    y = cp.full((8, n), np.nan, dtype=cp.float32)
                    launch(tag, sets[0], cp.asarray(x_bits), y, 8, extra, "ninfer_nvfp4_gemv_yf32")
                    yh = cp.asnumpy(y)
                    err = float(np.abs(yh[:, rows] - ref).max() / np.abs(ref).max())
                    good = bool(np.isfinite(yh).all()) and err < 1e-5
                    ok &= good
                    say(f"{name} {tag} plan {extra} b=8 yf32: err {err:.2e} {'ok' if good else 'FAIL'}")
            xs = {b: cp.asarray((rng.standard_normal((b, k)).astype(np.float32).view(np.uint32) >> 16)
                                .astype(np.uint16)) for b in (1, 2, 4, 8)}
            ys = {b: cp.empty((b, n), dtype=cp.uint16) for b in (1, 2, 4, 8)}
            n_calls = max(copies, 8)

            def timed(tag, b, plan, sets=sets, n_calls=n_calls, xs=xs, ys=ys, launch=launch):
                return gpu_us(lambda i: launch(tag, sets[i % len(sets)], xs[b], ys[b], b, plan), n_calls)

            row = {"case": name, "kind": "time", "n": n, "k": k, "mb": nbytes / 1e6, "ks": ks0, "plan": plan}
            for b in (1, 2, 4, 8):
                row[f"b{b}"] = timed("ch4", b, plan)
            row["gb_s"] = (nbytes + 2 * k + 2 * n) / (row["b1"] * 1e-6) / 1e9
            row["pct"] = 100 * row["gb_s"] / copy_gb_s
            sweep = {}
            for ks in (1, 2, 4, 5, 8, 10, 16):
                if ks <= k // 128:
                    warps, groups, grid = geometry(n, ks)
                    sweep[f"ch4 ks{ks} w{warps} g{grid}"] = timed("ch4", 1, (ks, warps, grid))
                    if grid < groups:  # one block per group, not persistent
                        sweep[f"ch4 ks{ks} w{warps} g{groups}"] = timed("ch4", 1, (ks, warps, groups))
                    if ks in (ks0, 8):
                        warps, groups, grid = geometry(n, ks, warps_per_sm=20)
                        sweep[f"ch2 ks{ks} w{warps} g{grid}"] = timed("ch2", 1, (ks, warps, grid))
            row["sweep"] = sweep
            results.append(row)
            say(f"{name}: plan {plan} b1 {row['b1']:.1f} us ({row['gb_s']:.0f} GB/s, {row['pct']:.0f}%), b8 {row['b8']:.1f} us;"
                " b=1 sweep " + ", ".join(f"{key} {v:.1f}" for key, v in sweep.items()))
            sets = None
            cp.get_default_memory_pool().free_all_blocks()
        except Exception as exc:  # noqa: BLE001 - report and go on to the next case
            ok = False
            say(f"{name}: FAILED {type(exc).__name__}: {exc}")
    (out / "nvfp4_gemv.json").write_text(json.dumps({"copy_gb_s": copy_gb_s, "results": results}, indent=1))
    worst = {}
    for r in results:
        if r["kind"] == "err":
            key = (r["case"], r["out"])
            worst[key] = max(worst.get(key, 0.0), r["err"])
    say(f"\nper launch in a CUDA graph (median of {reps}), weights rotated over >= 300 MB; copy kernel "
        f"{copy_gb_s:.0f} GB/s; err = max |y - ref| / max |ref| over b = 1..8 (fp32 / bf16 output)")
    say("| case | MB | plan (ks, warps, grid) | b=1 us | b=2 | b=4 | b=8 | b=1 GB/s (% of copy) | best b=1 sweep | err f32 / bf16 |")
    say("|---|---:|---:|---:|---:|---:|---:|---:|---|---|")
    for r in results:
        if r["kind"] != "time":
            continue
        best = min(r["sweep"].items(), key=lambda kv: kv[1]) if r["sweep"] else ("-", 0.0)
        say(f"| {r['case']} | {r['mb']:.1f} | {r['plan']} | {r['b1']:.1f} | {r['b2']:.1f} | {r['b4']:.1f} | "
            f"{r['b8']:.1f} | {r['gb_s']:.0f} ({r['pct']:.0f}%) | {best[0]} {best[1]:.1f} | "
            f"{worst.get((r['case'], 'f32'), float('nan')):.1e} / {worst.get((r['case'], 'bf16'), float('nan')):.1e} |")
    say("ALL OK" if ok else "SOME CHECKS FAILED")
    log.close()
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["fatbins", "cupy"])
    parser.add_argument("--out", type=Path, default=Path("out/nvfp4-gemv"))
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--smoke", action="store_true", help="cupy: the tiny case only")
    args = parser.parse_args()
    if args.action == "fatbins":
        fatbins()
        return 0
    return cupy_check(args.out, args.reps, args.smoke)


if __name__ == "__main__":
    sys.exit(main())
