#!/usr/bin/env python3
"""Chunked gated delta rule kernels (`ops/gdn_chunked_triton.py`) on one GPU: numerics and speed.

    python3 tests/gpu/check_gdn_chunked.py --out $OUT      # GPU machine: torch + triton, no TVM
    TRITON_INTERPRET=1 .venv/bin/python tests/gpu/check_gdn_chunked.py --small   # the script itself, on a CPU

Runs the Triton kernels directly (JIT) with 27B shapes (Hk 16, Hv 48, dk = dv = 128, B = 1) at
T = 1,024, 7,680 and 8,192 on random inputs (q, k L2-normalised, q scaled; log decays spread over
three decades; beta in (0, 1)), plus a case with strongly correlated keys inside each chunk (the
hard case for the triangular solve). Output and workspace are poisoned with NaN first. Output and
final state of a few heads are compared with the float64 token-by-token recurrence; then every
configuration (column slice, warps, dot precision) is timed with CUDA events (median of repeats)
for the two kernels together. Prints a table last.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from ninfer_compiler.ops import gdn_chunked_triton as gdn  # noqa: E402

HK, HV, DK, DV = 16, 48, 128, 128
HEADS = (0, 1, 29, 47)  # value heads checked against float64 (key heads 0, 0, 9, 15)
LENGTHS = (1024, 7680, 8192)
DEVICE = "cuda"
# (BV, state-kernel warps, prep-kernel warps, tl.dot precision); the first is gdn_chunked_triton.CONFIG
CONFIGS = [(32, 4, 4, "tf32x3"), (32, 4, 8, "tf32x3"), (16, 4, 4, "tf32x3"), (32, 8, 4, "tf32x3"),
           (64, 8, 4, "tf32x3"), (32, 4, 4, "tf32"), (32, 4, 8, "tf32"), (64, 8, 8, "tf32"),
           (32, 4, 4, "ieee")]


def inputs(t: int, seed: int, correlated: bool = False):
    """Random layer inputs of one sequence, shaped as the GDN layer passes them (fp32)."""
    gen = torch.Generator(device=DEVICE).manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=DEVICE)

    q = randn(1, t, HK, DK)
    k = randn(1, t, HK, DK)
    if correlated:  # keys of a chunk close to one direction: A near strictly-lower ones
        base = randn(1, (t + 63) // 64, HK, DK).repeat_interleave(64, dim=1)[:, :t]
        k = base + 0.05 * k
    q = q / q.norm(dim=-1, keepdim=True) * DK**-0.5
    k = k / k.norm(dim=-1, keepdim=True)
    v = randn(1, t, HV, DV)
    g = -torch.exp(torch.empty(1, t, HV, device=DEVICE).uniform_(-7.0, 0.0, generator=gen))
    beta = torch.sigmoid(randn(1, t, HV))
    return q, k, v, g, beta


def reference(q, k, v, g, beta, s0):
    """float64 recurrence for the heads in HEADS; s0 [len(HEADS), DK, DV]. Returns (o, state)."""
    hs = torch.tensor(HEADS, device=DEVICE)
    kh = hs // (HV // HK)
    qq, kk = q[0][:, kh].double(), k[0][:, kh].double()  # [T, n, DK]
    vv, gg, bb = v[0][:, hs].double(), g[0][:, hs].double(), beta[0][:, hs].double()
    s = s0.double().clone()
    o = torch.empty(q.shape[1], len(HEADS), DV, dtype=torch.float64, device=DEVICE)
    for t in range(q.shape[1]):
        s *= torch.exp(gg[t])[:, None, None]
        u = bb[t][:, None] * (vv[t] - torch.einsum("nkd,nk->nd", s, kk[t]))
        s += kk[t][:, :, None] * u[:, None, :]
        o[t] = torch.einsum("nkd,nk->nd", s, qq[t])
    return o, s


def rel(a, b) -> float:
    return float((a.double() - b).abs().max() / b.abs().max())


def run(t: int, config, q, k, v, g, beta, state, lens, ws, o):
    slots = torch.tensor([1], dtype=torch.int32, device=DEVICE)
    return gdn.run_torch(q, k, v, g, beta, state, slots, lens, 2, out=o, workspace=ws, config=config)


def small() -> None:
    """Tiny shapes and a short config list on the CPU, through Triton's interpreter."""
    global HK, HV, DK, DV, HEADS, LENGTHS, DEVICE, CONFIGS
    HK, HV, DK, DV, HEADS, LENGTHS, DEVICE = 2, 4, 16, 32, (0, 3), (70, 64, 130), "cpu"
    CONFIGS = [(16, 4, 4, "tf32x3"), (32, 4, 4, "ieee")]


def timed(repeats: int, *call) -> float:
    """Median milliseconds of `run(*call)` (CUDA events; wall clock on the CPU) after two warm-ups."""
    times = []
    for i in range(repeats + 2):
        if DEVICE == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run(*call)
            end.record()
            end.synchronize()
            ms = start.elapsed_time(end)
        else:
            t0 = time.perf_counter()
            run(*call)
            ms = (time.perf_counter() - t0) * 1e3
        if i >= 2:
            times.append(ms)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="out/gdn")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--small", action="store_true", help="tiny shapes on the CPU (TRITON_INTERPRET=1)")
    args = parser.parse_args()
    if args.small:
        small()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows, checks, failed = [], [], 0
    short, mid, long = LENGTHS
    for t, correlated, lens0 in ((short, False, 5), (short, True, 5), (mid, False, 0), (long, False, 5)):
        q, k, v, g, beta = inputs(t, seed=t + correlated, correlated=correlated)
        state0 = torch.randn(3, 2, HV, DK, DV, device=DEVICE) * 0.1
        if lens0 == 0:
            state0[2, 1] = float("nan")  # must be ignored: the sequence starts from zero
        s_init = torch.zeros(len(HEADS), DK, DV, device=DEVICE) if lens0 == 0 else state0[2, 1, list(HEADS)]
        ref_o, ref_s = reference(q, k, v, g, beta, s_init)
        lens = torch.tensor([lens0], dtype=torch.int32, device=DEVICE)
        ws = torch.empty(1, t, HV, gdn.workspace_width(DK, DV), device=DEVICE)
        for config in CONFIGS:
            if correlated and config[:3] != CONFIGS[0][:3]:
                continue
            state = state0.clone()
            o = torch.full_like(v, float("nan"))
            ws.fill_(float("nan"))
            run(t, config, q, k, v, g, beta, state, lens, ws, o)
            if DEVICE == "cuda":
                torch.cuda.synchronize()
            eo = rel(o[0][:, list(HEADS)], ref_o)
            es = rel(state[2, 1, list(HEADS)], ref_s)
            others = torch.equal(state[[0, 1]], state0[[0, 1]]) and torch.equal(state[2, 0], state0[2, 0])
            finite = bool(torch.isfinite(o).all()) and bool(torch.isfinite(state[2, 1]).all())
            ok = finite and others and eo < 2e-3 and es < 2e-3
            failed += not ok
            checks.append({"T": t, "correlated": correlated, "config": config, "o_err": eo, "state_err": es,
                           "ok": ok})
            print(f"T={t} corr={correlated} cfg={config} o_err={eo:.2e} state_err={es:.2e} "
                  f"{'ok' if ok else 'FAIL'}", flush=True)
            if correlated:
                continue
            ms = timed(args.repeats, t, config, q, k, v, g, beta, state, lens, ws, o)
            rows.append({"T": t, "config": config, "ms": ms, "tok_per_s": t / ms * 1e3})
    (out_dir / "gdn_chunked.json").write_text(json.dumps({"checks": checks, "timings": rows}, indent=1))
    print("\n| T | BV, warps (state, prep), precision | ms per layer | x48 layers (ms) | o err | state err |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        c = next(x for x in checks if x["T"] == r["T"] and x["config"] == r["config"] and not x["correlated"])
        bv, w, pw, prec = r["config"]
        print(f"| {r['T']} | {bv}, {w}/{pw}, {prec} | {r['ms']:.3f} | {48 * r['ms']:.1f} | "
              f"{c['o_err']:.1e} | {c['state_err']:.1e} |")
    for c in checks:
        if c["correlated"]:
            print(f"correlated keys T={c['T']} {c['config']}: o err {c['o_err']:.1e}, state err "
                  f"{c['state_err']:.1e}")
    print("FAILED" if failed else "all checks ok")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
