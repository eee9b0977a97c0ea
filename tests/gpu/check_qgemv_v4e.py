#!/usr/bin/env python3
"""v4 decode GEMV builds against each other on the H200: the launcher's fused entries and the plain ones.

    # build machine: sm_90a fatbins of ops/qgemv_cuda.cu (this tree, its build variants, and the
    # source of a baseline git revision), into .cache/ninfer/qgemv-v4e
    .venv/bin/python tests/gpu/check_qgemv_v4e.py fatbins --baseline 8b5d5f9
    # GPU machine (cupy), carry .cache/ninfer/qgemv-v4e:
    python3 tests/gpu/check_qgemv_v4e.py cupy --out $OUT

`cupy` fills random planes on the GPU and, for every build, launches the entries the launcher uses
(`ninfer_qgemv4e_q*_{plain,add,swiglu}`, the `V4Epi` parameter passed by value as a numpy structured
scalar) at the launcher's geometry (`qgemv_host.cc`: K split, warps per block, shared memory) on the
27B decode projections: numerics at batch 1..8 against float64 numpy (NaN-poisoned outputs, rows
subset for N > 4,096), then per-launch time at batch 1, 2, 4 and 8 inside a CUDA graph, rotating over
weight copies so that L2 cannot hold them, against the read / copy bandwidth measured in the run.
With the `cur` build it first checks the q4 entries on int8 activations (`ninfer_qgemv4e_q4_{plain,
swiglu}_i8`, their activations written by the norm `ninfer_rms_norm_xq_wbf16`, `I8_CASES`) against
float64 on the norm's output and times them against the bf16 entries on it (and the `d1` build's
loads-only entry where that build is there), then the feed-forward half on int8 activations
(`mlp_check`: norm -> `ninfer_qgemv4e_q4_swiglu_i8` writing its output as int8 activations ->
`ninfer_qgemv4e_q5_add_i8`, `MLP_CASES`) against float64 and against the bf16 chain, then the mixed-format multi entry
(`ninfer_qgemv4e_q45_multi`, the mixers' q4 + q5 projections, `MIXED`) the same way against the two
per-format launches it replaces, and first of all the residual add that also normalizes its output
(`add_norm_check`: `v4_add_norm` against the add followed by the norm kernel, `ADD_NORM_CASES`;
`--skip add_norm,mlp,mixed,cases` leaves checks out). It prints a table last and writes `qgemv_v4e.json`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_qgemv import BW_SOURCE, _ks_v4, _v4_stage_bytes, decode_planes  # noqa: E402
from cupy_bench import ceilings, graph_us  # noqa: E402

FATBINS = ROOT / ".cache" / "ninfer" / "qgemv-v4e"
STAGES = {4: 2, 5: 2, 6: 2}  # = qgemv.V4_STAGES (the ring depth of every build here)
# build tag -> extra nvcc defines ("base": the baseline revision's source, no defines)
BUILDS = {
    "base": [],
    "cur": [],
    "r64": ["-DNINFER_V4_MAXREG=64"],  # other register caps (4 / 2 blocks of 8 warps per SM)
    "r128": ["-DNINFER_V4_MAXREG=128"],
    "d1": ["-DNINFER_V4_DIAG=1"],  # loads only (no numerics): the streaming limit of the build
    # deeper q5 rings (the residual-add projections launch less than a wave of warps: few bytes in
    # flight per SM); the launches below size their shared memory by the build's depth (`stages`)
    "q5s4": ["-DNINFER_V4_STAGES_Q5=4"],
    "q5s6": ["-DNINFER_V4_STAGES_Q5=6"],
    "d1q5s6": ["-DNINFER_V4_DIAG=1", "-DNINFER_V4_STAGES_Q5=6"],
}
# the q4 entries on int8 activations (`i8_check`): (mode, N, K), SwiGLU: gate and up of N rows each
I8_CASES = {"q4 swiglu 2x17408x5120": ("swiglu", 17408, 5120), "q4 plain 6144x5120": ("plain", 6144, 5120),
            "q4 plain 2048x5120": ("plain", 2048, 5120), "q4 plain 5120x17408": ("plain", 5120, 17408)}
DIAG = {"d1", "d1q5s6"}


def stages(tag: str) -> dict[int, int]:
    """The ring depth per format of build `tag` (its NINFER_V4_STAGES_Q* defines, else STAGES)."""
    out = dict(STAGES)
    for d in BUILDS.get(tag, []):
        for bits in (4, 5, 6):
            if d.startswith(f"-DNINFER_V4_STAGES_Q{bits}="):
                out[bits] = int(d.split("=", 1)[1])
    return out
# (mode, format, N, K): the 27B decode launches of the fused entries (swiglu: gate and up of N rows each)
CASES = {
    "q4 swiglu 2x17408x5120": ("swiglu", 4, 17408, 5120),
    "q5 add down 5120x17408": ("add", 5, 5120, 17408),
    "q5 add out 5120x6144": ("add", 5, 5120, 6144),
    "q5 plain 6144x5120": ("plain", 5, 6144, 5120),
    "q4 plain 6144x5120": ("plain", 4, 6144, 5120),
    "q6 plain head 248320x5120": ("plain", 6, 248320, 5120),
}
MODES = {"plain": 0, "add": 1, "swiglu": 2}
EPI = np.dtype([("up_base", "<u8"), ("up_high", "<u8"), ("up_scales", "<u8"), ("residual", "<u8"),
                ("y_stride", "<u4"), ("seg_end", "<u4", (4,)), ("seg_stride", "<u4", (4,)),
                ("seg_base", "<u8", (4,)), ("seg_high", "<u8", (4,)), ("seg_scales", "<u8", (4,)),
                ("seg_y", "<u8", (4,)), ("x_scales", "<u8"), ("xq_out", "<u8"),
                ("norm_w", "<u8"), ("norm_y", "<u8"), ("norm_xq", "<u8"), ("norm_eps", "<f4"),
                ("norm_offset", "<f4"), ("norm_wbf16", "<u4")], align=True)  # = V4Epi (qgemv_cuda.cu)


def geometry(mode: str, bits: int, n: int, k: int, ks: int = 0) -> tuple[int, int, int]:
    """(grid, warps per block, ks) as qgemv_host.cc `run` picks them for a v4 launch (`ks`: forced)."""
    tiles = n // 16 * (2 if mode == "swiglu" else 1)
    ks = ks or _ks_v4(tiles * 16, k, bits)
    if mode == "swiglu":
        ks = min(ks, 4)
    warps = 8 if mode == "swiglu" else max(4, ks)
    return -(-tiles // (warps // ks)), warps, ks


def fatbins(baseline: str | None) -> None:
    from ninfer_compiler.codegen.toolchain import nvcc_path
    from ninfer_compiler.ops import qgemv

    FATBINS.mkdir(parents=True, exist_ok=True)
    flags = ["-fatbin", "-O3", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", "-DNINFER_GEMV_SKIP_V2",
             f"-I{qgemv.DEVICE_SOURCE.parent}"]
    for tag, defs in BUILDS.items():
        source = qgemv.DEVICE_SOURCE
        if tag == "base":
            if baseline is None:
                continue
            source = FATBINS / "base.cu"
            rel = qgemv.DEVICE_SOURCE.relative_to(ROOT)
            source.write_bytes(subprocess.run(["git", "-C", str(ROOT), "show", f"{baseline}:{rel}"],
                                              check=True, capture_output=True).stdout)
        subprocess.run([nvcc_path(), *flags, *defs, str(source), "-o", str(FATBINS / f"{tag}_sm_90a.fatbin")],
                       check=True)
    bw = FATBINS / "bw.cu"
    bw.write_text(BW_SOURCE)
    subprocess.run([nvcc_path(), *flags[:4], str(bw), "-o", str(FATBINS / "bw_sm_90a.fatbin")], check=True)
    print("wrote", *sorted(p.name for p in FATBINS.iterdir()))


# the mixed-format multi launch (`ninfer_qgemv4e_q45_multi`): a mixer's projections of one input, q4 first
MIXED = {
    "gdn q,k q4 | v,z q5": [(4, 2048), (4, 2048), (5, 6144), (5, 6144)],
    "attn q,k q4 | gate,v q5": [(4, 6144), (4, 1024), (5, 6144), (5, 1024)],
}
MIXED_K = 5120


# the feed-forward half on int8 activations (`mlp_check`): (intermediate N, hidden K), q4 gate / up, q5 down
MLP_CASES = {"27B mlp q4 2x17408x5120 -> q5 5120x17408": (17408, 5120)}


def _q_planes(cp, n: int, k: int, bits: int):  # noqa: ANN001, ANN202
    hb = {4: 0, 5: 8}[bits]
    base = cp.random.randint(0, 256, size=(n, k // 2), dtype=cp.int32).astype(cp.uint8)
    high = cp.random.randint(0, 256, size=(n, k // 64 * hb), dtype=cp.int32).astype(cp.uint8) if hb else base
    sc = cp.random.uniform(0.5, 1.5, size=(n, k // 64)) * cp.random.choice(cp.array([-1.0, 1.0]), size=(n, k // 64))
    return base, high, (sc / 64).astype(cp.float16)


def _bf16_rows(cp, rng, b: int, k: int):  # noqa: ANN001, ANN202
    return cp.asarray((rng.standard_normal((b, k)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16))


def _f64(a) -> np.ndarray:  # noqa: ANN001
    import cupy as cp

    return (cp.asnumpy(a).astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def mlp_check(cp, mods, say, rng, reps: int, function) -> tuple[bool, list]:  # noqa: ANN001
    """The feed-forward half on int8 activations: the norm writes them for the q4 SwiGLU, whose
    last block of every 64 outputs writes them for the q5 down projection (`v4_xq_out`), which adds
    the residual. Numerics at b = 1..4 against float64 (the SwiGLU on the norm's bf16 output, the
    down projection on the SwiGLU's bf16 output), with the arrival counts reused across launches;
    time of the three-launch chain and of each launch against the bf16 entries."""
    u32, ok, rows_out = np.uint32, True, []
    norm = mods["cur"].get_function("ninfer_rms_norm_xq_wbf16")
    plain_norm = mods["cur"].get_function("ninfer_rms_norm_wbf16")
    for name, (n, k) in MLP_CASES.items():
        nbytes = 2 * n * k // 64 * 34 + k * n // 64 * 42
        copies = max(1, min(40, -(-300_000_000 // nbytes)))
        sets = [([_q_planes(cp, n, k, 4) for _ in range(2)], _q_planes(cp, k, n, 5)) for _ in range(copies)]
        rows_n = np.r_[np.arange(512), np.arange(n - 512, n)]
        ref_gu = [decode_planes(cp.asnumpy(p[0][rows_n]), None, cp.asnumpy(p[2][rows_n]), 4) for p in sets[0][0]]
        d = sets[0][1]
        ref_d = decode_planes(cp.asnumpy(d[0]), cp.asnumpy(d[1]), cp.asnumpy(d[2]), 5)
        g_grid, g_warps, g_ks = geometry("swiglu", 4, n, k)
        d_grid, d_warps, d_ks = geometry("add", 5, k, n)
        xq = cp.zeros(k * 8 + k // 256 * 64, dtype=cp.uint8)
        yq = cp.zeros(n * 8 + n // 256 * 64, dtype=cp.uint8)
        nw16 = cp.asarray(((rng.standard_normal(k) * 0.1).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16))

        def swiglu(ws, xn, y, b, i8, x_out, g_grid=g_grid, g_warps=g_warps, g_ks=g_ks, n=n, k=k, xq=xq, yq=yq):
            epi = np.zeros((), dtype=EPI)
            epi["y_stride"] = n
            epi["up_base"], epi["up_high"], epi["up_scales"] = (int(a.data.ptr) for a in ws[1])
            if i8:
                epi["x_scales"] = int(xq.data.ptr) + 8 * k
                epi["xq_out"] = int(yq.data.ptr) if x_out else 0
            smem = g_warps * STAGES[4] * (_v4_stage_bytes(4) + (512 if i8 and b == 1 else 0))
            entry = "ninfer_qgemv4e_q4_swiglu" + ("_i8" if i8 else "")
            function("cur", entry, 4)((g_grid,), (g_warps * 32,), (xq if i8 else xn, *ws[0], y, u32(n), u32(k), u32(b),
                                                                   u32(g_ks), epi[()]), shared_mem=smem)

        def down(w, y, out, res, b, i8, d_grid=d_grid, d_warps=d_warps, d_ks=d_ks, n=n, k=k, yq=yq):
            epi = np.zeros((), dtype=EPI)
            epi["y_stride"] = k
            epi["residual"] = int(res.data.ptr)
            if i8:
                epi["x_scales"] = int(yq.data.ptr) + 8 * n
            smem = d_warps * STAGES[5] * (_v4_stage_bytes(5) + (512 if i8 and b == 1 else 0))
            entry = "ninfer_qgemv4e_q5_add" + ("_i8" if i8 else "")
            function("cur", entry, 5)((d_grid,), (d_warps * 32,), (yq if i8 else y, *w, out, u32(k), u32(n), u32(b),
                                                                   u32(d_ks), epi[()]), shared_mem=smem)

        def normalize(h, xn, b, with_xq=True, k=k, xq=xq, nw16=nw16):
            if with_xq:
                norm((b,), (256,), (h, nw16, xn, u32(k), np.float32(1e-6), np.float32(1.0), xq))
            else:
                plain_norm((b,), (256,), (h, nw16, xn, u32(k), np.float32(1e-6), np.float32(1.0)))

        errs = {"swiglu": 0.0, "down int8": 0.0, "down bf16": 0.0}
        for b in (1, 2, 3, 4, 1):  # b = 1 twice: the arrival counts of the earlier launches are back at 0
            h, res = _bf16_rows(cp, rng, b, k), _bf16_rows(cp, rng, b, k)
            xn = cp.zeros((b, k), dtype=cp.uint16)
            normalize(h, xn, b)
            y = cp.full((b, n), 0x7FC0, dtype=cp.uint16)
            yq.fill(0xFF)
            swiglu(sets[0][0], xn, y, b, True, True)
            acc = [_f64(xn) @ w.T for w in ref_gu]
            ref = acc[0] / (1 + np.exp(-acc[0])) * acc[1]
            y64 = _f64(y)
            ref_out = y64 @ ref_d.T + _f64(res)
            got = {}
            for label, i8 in (("down int8", True), ("down bf16", False)):
                out = cp.full((b, k), 0x7FC0, dtype=cp.uint16)
                down(d, y, out, res, b, i8)
                got[label] = _f64(out)
            for label, g, r in (("swiglu", y64[:, rows_n], ref), ("down int8", got["down int8"], ref_out),
                                ("down bf16", got["down bf16"], ref_out)):
                e = float(np.abs(g - r).max() / np.abs(r).max())
                errs[label] = max(errs[label], e if np.isfinite(e) else float("inf"))
        ok &= max(errs.values()) <= 1e-2
        say(f"mlp {name}: max err over b = 1..4 " + ", ".join(f"{lab} {e:.2e}" for lab, e in errs.items()))
        for b in (1, 2, 4):
            h, res = _bf16_rows(cp, rng, b, k), _bf16_rows(cp, rng, b, k)
            xn, y = cp.zeros((b, k), dtype=cp.uint16), cp.zeros((b, n), dtype=cp.uint16)
            out = cp.zeros((b, k), dtype=cp.uint16)
            normalize(h, xn, b)
            swiglu(sets[0][0], xn, y, b, True, True)

            def chain(i, i8, h=h, xn=xn, y=y, out=out, res=res, b=b, s=sets):
                gu, w = s[i % len(s)]
                normalize(h, xn, b, with_xq=i8)
                swiglu(gu, xn, y, b, i8, i8)
                down(w, y, out, res, b, i8)

            def one(i, what, i8, xn=xn, y=y, out=out, res=res, b=b, s=sets):
                if what == "swiglu":
                    swiglu(s[i % len(s)][0], xn, y, b, True, i8)
                else:
                    down(s[i % len(s)][1], y, out, res, b, i8)

            n_calls = max(copies, 20)
            t = {"chain int8": graph_us(lambda i, c=chain: c(i, True), n_calls, reps),
                 "chain bf16": graph_us(lambda i, c=chain: c(i, False), n_calls, reps),
                 "swiglu i8 + xq": graph_us(lambda i, o=one: o(i, "swiglu", True), n_calls, reps),
                 "swiglu i8": graph_us(lambda i, o=one: o(i, "swiglu", False), n_calls, reps),
                 "down i8": graph_us(lambda i, o=one: o(i, "down", True), n_calls, reps),
                 "down bf16": graph_us(lambda i, o=one: o(i, "down", False), n_calls, reps)}
            rows_out.append((name, b, nbytes, errs, t))
            say(f"mlp {name} {nbytes / 1e6:5.1f} MB b={b}: " + ", ".join(f"{lab} {v:.2f} us" for lab, v in t.items())
                + f"; chain int8 {nbytes / t['chain int8'] / 1e3:.0f} GB/s")
        sets = None
        cp.get_default_memory_pool().free_all_blocks()
    return ok, rows_out


# the residual-add launch that also normalizes its output (`v4_add_norm`, passes/add_norm.py): (N, K, weight dtype)
ADD_NORM_CASES = {"q5 add+norm out 5120x6144": (5120, 6144, "bf16"),
                  "q5 add+norm down 5120x17408": (5120, 17408, "f32")}


def add_norm_check(cp, mods, say, rng, reps: int, function) -> tuple[bool, list]:  # noqa: ANN001
    """`ninfer_qgemv4e_q5_add` with the norm fields set against the same launch without them followed
    by the norm kernel (`ninfer_rms_norm_xq_w*`): y bit-identical, the normalized rows within one
    bf16 unit (the sum of squares is added in another order) and their int8 activations equal where
    the rows are, at b = 1..8 and b = 1 again (the arrival count back at 0); then both forms timed."""
    u32, ok, rows_out = np.uint32, True, []
    for name, (n, k, wdt) in ADD_NORM_CASES.items():
        grid, warps, ks = geometry("add", 5, n, k)
        smem = warps * STAGES[5] * _v4_stage_bytes(5)
        nbytes = n * k // 64 * 42
        copies = max(1, min(40, -(-300_000_000 // nbytes)))
        sets = [_q_planes(cp, n, k, 5) for _ in range(copies)]
        norm = mods["cur"].get_function(f"ninfer_rms_norm_xq_w{wdt}")
        wf = (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)
        nw = cp.asarray(wf if wdt == "f32" else (wf.view(np.uint32) >> 16).astype(np.uint16))
        xq_n = n * 8 + n // 256 * 64

        def add(w, x, y, res, b, yn=None, xq=None, n=n, k=k, grid=grid, warps=warps, ks=ks, smem=smem, nw=nw, wdt=wdt):
            epi = np.zeros((), dtype=EPI)
            epi["y_stride"] = n
            epi["residual"] = int(res.data.ptr)
            if yn is not None:
                epi["norm_w"], epi["norm_y"] = int(nw.data.ptr), int(yn.data.ptr)
                epi["norm_xq"] = int(xq.data.ptr) if xq is not None else 0
                epi["norm_eps"], epi["norm_offset"], epi["norm_wbf16"] = 1e-6, 0.0, int(wdt == "bf16")
            function("cur", "ninfer_qgemv4e_q5_add", 5)((grid,), (warps * 32,), (x, *w, y, u32(n), u32(k), u32(b),
                                                                                  u32(ks), epi[()]), shared_mem=smem)

        worst = {"y bits": 0, "yn ulps": 0, "yn differ": 0.0, "xq bytes": 0, "yn vs f64": 0.0}
        for b in (1, 2, 3, 4, 5, 8, 1):
            x, res = _bf16_rows(cp, rng, b, k), _bf16_rows(cp, rng, b, n)
            y0, yn0 = cp.full((b, n), 0x7FC0, dtype=cp.uint16), cp.full((b, n), 0x7FC0, dtype=cp.uint16)
            q0 = cp.full(xq_n, 0xFF, dtype=cp.uint8)
            add(sets[0], x, y0, res, b)
            norm((b,), (256,), (y0, nw, yn0, u32(n), np.float32(1e-6), np.float32(0.0), q0))
            y1, yn1 = cp.full((b, n), 0x7FC0, dtype=cp.uint16), cp.full((b, n), 0x7FC0, dtype=cp.uint16)
            q1 = cp.full(xq_n, 0xFF, dtype=cp.uint8)
            add(sets[0], x, y1, res, b, yn1, q1)
            a0, a1 = cp.asnumpy(yn0).astype(np.int64), cp.asnumpy(yn1).astype(np.int64)
            worst["y bits"] = max(worst["y bits"], int((cp.asnumpy(y0) != cp.asnumpy(y1)).sum()))
            ulps = np.abs(np.where(a0 >= 0x8000, 0x8000 - a0, a0) - np.where(a1 >= 0x8000, 0x8000 - a1, a1))
            worst["yn ulps"] = max(worst["yn ulps"], int(ulps.max()))
            worst["yn differ"] = max(worst["yn differ"], float((ulps > 0).mean()))
            same_rows = [r for r in range(min(b, 4)) if (ulps[r] == 0).all()]
            if b <= 4:  # the int8 activations of rows whose normalized values agree bit for bit
                g0, g1 = cp.asnumpy(q0[: n * 8]).reshape(-1, 32, 16), cp.asnumpy(q1[: n * 8]).reshape(-1, 32, 16)
                cols = [c for r in same_rows for c in (2 * r, 2 * r + 1)]
                mism = sum(int((g0[:, m * 8 + c] != g1[:, m * 8 + c]).sum()) for m in range(4) for c in cols)
                worst["xq bytes"] = max(worst["xq bytes"], mism)
            y64 = _f64(y1)
            ref = y64 / np.sqrt((y64 ** 2).mean(axis=1, keepdims=True) + 1e-6) * wf.astype(np.float64)
            if wdt == "bf16":
                ref = y64 / np.sqrt((y64 ** 2).mean(axis=1, keepdims=True) + 1e-6) * _f64(cp.asarray(
                    (wf.view(np.uint32) >> 16).astype(np.uint16)))[None, :]
            e = float(np.abs(_f64(yn1) - ref).max() / np.abs(ref).max())
            worst["yn vs f64"] = max(worst["yn vs f64"], e if np.isfinite(e) else float("inf"))
        ok &= (worst["y bits"] == 0 and worst["yn ulps"] <= 1 and worst["xq bytes"] == 0
               and worst["yn vs f64"] <= 1e-2)
        say(f"add_norm {name}: " + ", ".join(f"{lab} {v:.3g}" for lab, v in worst.items()))
        for b in (1, 2, 4, 8):
            x, res = _bf16_rows(cp, rng, b, k), _bf16_rows(cp, rng, b, n)
            y, yn = cp.zeros((b, n), dtype=cp.uint16), cp.zeros((b, n), dtype=cp.uint16)
            q = cp.zeros(xq_n, dtype=cp.uint8)

            def two(i, x=x, y=y, yn=yn, q=q, res=res, b=b, s=sets, n=n, norm=norm, nw=nw):
                add(s[i % len(s)], x, y, res, b)
                norm((b,), (256,), (y, nw, yn, u32(n), np.float32(1e-6), np.float32(0.0), q))

            def one(i, x=x, y=y, yn=yn, q=q, res=res, b=b, s=sets):
                add(s[i % len(s)], x, y, res, b, yn, q)

            def bare(i, x=x, y=y, res=res, b=b, s=sets):
                add(s[i % len(s)], x, y, res, b)

            n_calls = max(copies, 20)
            t = {"add, norm": graph_us(two, n_calls, reps), "add_norm": graph_us(one, n_calls, reps),
                 "add alone": graph_us(bare, n_calls, reps)}
            rows_out.append((name, b, nbytes, worst, t))
            say(f"add_norm {name} {nbytes / 1e6:5.1f} MB b={b}: " + ", ".join(f"{lab} {v:.2f} us" for lab, v in t.items()))
        sets = None
        cp.get_default_memory_pool().free_all_blocks()
    return ok, rows_out


def i8_check(cp, mods, say, rng, reps: int, function) -> tuple[bool, list]:  # noqa: ANN001
    """The q4 entries on int8 activations (`ninfer_qgemv4e_q4_{plain,swiglu}_i8`, the activations
    written by the norm `ninfer_rms_norm_xq_wbf16`) against float64 on the norm's bf16 output at
    b = 1..4, and their time against the bf16 entries on that output (and the `d1` build's
    loads-only entry where it is there)."""
    u32, ok, rows_out = np.uint32, True, []
    norm = mods["cur"].get_function("ninfer_rms_norm_xq_wbf16")
    plain_norm = mods["cur"].get_function("ninfer_rms_norm_wbf16")
    for name, (mode, n, k) in I8_CASES.items():
        nw = 2 if mode == "swiglu" else 1
        nbytes = n * k // 64 * 34 * nw
        copies = max(1, min(40, -(-200_000_000 // nbytes)))

        def planes(n=n, k=k):
            base = cp.random.randint(0, 256, size=(n, k // 2), dtype=cp.int32).astype(cp.uint8)
            sc = cp.random.uniform(0.5, 1.5, size=(n, k // 64)) * cp.random.choice(cp.array([-1.0, 1.0]), size=(n, k // 64))
            return base, base, (sc / 64).astype(cp.float16)

        sets = [[planes() for _ in range(nw)] for _ in range(copies)]
        rows = np.arange(n) if n <= 4096 else np.r_[np.arange(1024), np.arange(n - 1024, n)]
        ref_w = [decode_planes(cp.asnumpy(p[0][rows]), None, cp.asnumpy(p[2][rows]), 4) for p in sets[0]]
        grid, warps, ks = geometry(mode, 4, n, k)
        xq = cp.zeros(k * 8 + k // 256 * 64, dtype=cp.uint8)
        nwb = (rng.standard_normal(k) * 0.1).astype(np.float32)
        nw16 = cp.asarray((nwb.view(np.uint32) >> 16).astype(np.uint16))  # bf16 norm weight (offset 1)

        def gemv(tag, ws, x, y, b, i8, grid=grid, warps=warps, ks=ks, n=n, k=k, mode=mode, xq=xq):
            epi = np.zeros((), dtype=EPI)
            epi["y_stride"] = n
            if len(ws) == 2:
                epi["up_base"], epi["up_high"], epi["up_scales"] = (int(a.data.ptr) for a in ws[1])
            if i8:
                epi["x_scales"] = int(xq.data.ptr) + 8 * k
            smem = warps * STAGES[4] * (_v4_stage_bytes(4) + (512 if i8 and b == 1 else 0))
            entry = f"ninfer_qgemv4e_q4_{mode}" + ("_i8" if i8 else "")
            function(tag, entry, 4)((grid,), (warps * 32,), (xq if i8 else x, *ws[0], y, u32(n), u32(k), u32(b),
                                                             u32(ks), epi[()]), shared_mem=smem)

        def normalize(h, xn, b, k=k, xq=xq, nw16=nw16):
            norm((b,), (256,), (h, nw16, xn, u32(k), np.float32(1e-6), np.float32(1.0), xq))

        err = 0.0
        for b in range(1, 5):
            h = cp.asarray((rng.standard_normal((b, k)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16))
            xn = cp.zeros((b, k), dtype=cp.uint16)
            normalize(h, xn, b)
            x64 = (cp.asnumpy(xn).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
            acc = [x64 @ w.T for w in ref_w]
            ref = acc[0] / (1 + np.exp(-acc[0])) * acc[1] if mode == "swiglu" else acc[0]
            y = cp.full((b, n), 0x7FC0, dtype=cp.uint16)
            gemv("cur", sets[0], xn, y, b, True)
            got = (cp.asnumpy(y).astype(np.uint32) << 16).view(np.float32)[:, rows].astype(np.float64)
            e = float(np.abs(got - ref).max() / np.abs(ref).max())
            err = max(err, e if np.isfinite(e) else float("inf"))
        ok &= err <= 1e-2
        for b in (1, 2, 4):
            h = cp.asarray((rng.standard_normal((b, k)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16))
            xn = cp.zeros((b, k), dtype=cp.uint16)
            normalize(h, xn, b)
            y = cp.zeros((b, n), dtype=cp.uint16)
            t_norm = graph_us(lambda i, h=h, xn=xn, b=b: normalize(h, xn, b), 20, reps)
            t_plain = graph_us(lambda i, h=h, xn=xn, b=b, k=k, nw16=nw16: plain_norm(
                (b,), (256,), (h, nw16, xn, u32(k), np.float32(1e-6), np.float32(1.0))), 20, reps)
            t = {label: graph_us(lambda i, xn=xn, y=y, b=b, s=sets, tag=tag, i8=i8: gemv(tag, s[i % len(s)], xn, y, b, i8),
                                 max(copies, 20), reps)
                 for label, tag, i8 in (("int8", "cur", True), ("bf16", "cur", False), ("loads only", "d1", False))
                 if tag in mods}
            rows_out.append((name, b, nbytes, err, t_norm, t_plain, t))
            say(f"i8 {name:24} {nbytes / 1e6:5.1f} MB b={b} err {err:.2e}  norm with xq {t_norm:.2f} us "
                f"(without {t_plain:.2f}); "
                + ", ".join(f"{lab} {v:.2f} us ({nbytes / v / 1e3:.0f} GB/s)" for lab, v in t.items()))
        sets = None
        cp.get_default_memory_pool().free_all_blocks()
    return ok, rows_out


# the q5 residual add on activations it quantizes itself (`ninfer_qgemv4e_q5_add_i8s`, one row): (N, K);
# the last case leaves each warp fewer stages than the ring is deep
SELF_CASES = {"q5 add down 5120x17408": (5120, 17408), "q5 add out 5120x6144": (5120, 6144),
              "q5 add 1024x512": (1024, 512)}


def self_check(cp, mods, say, rng, reps: int, function) -> tuple[bool, list]:  # noqa: ANN001
    """The q5 residual add quantizing its bf16 activations itself (one row; the launcher's entry for
    the output and down projections) against float64 on NaN-poisoned outputs, and its time against
    the bf16 entry and the int8 entry reading the norm's int8 activations of the same input (and the
    `d1` build's loads-only entry where it is there)."""
    u32, ok, rows_out = np.uint32, True, []
    norm = mods["cur"].get_function("ninfer_rms_norm_xq_wbf16")
    for name, (n, k) in SELF_CASES.items():
        nbytes = n * k // 64 * 42
        copies = max(1, min(40, -(-200_000_000 // nbytes)))
        sets = [_q_planes(cp, n, k, 5) for _ in range(copies)]
        rows = np.arange(n) if n <= 4096 else np.r_[np.arange(1024), np.arange(n - 1024, n)]
        ref_w = decode_planes(cp.asnumpy(sets[0][0][rows]), cp.asnumpy(sets[0][1][rows]), cp.asnumpy(sets[0][2][rows]), 5)
        grid, warps, ks = geometry("add", 5, n, k)
        xq = cp.zeros(k * 8 + k // 256 * 64, dtype=cp.uint8)
        nw16 = cp.asarray(((rng.standard_normal(k) * 0.1).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16))

        def add(tag, w, x, y, res, kind, grid=grid, warps=warps, ks=ks, n=n, k=k, xq=xq):
            epi = np.zeros((), dtype=EPI)
            epi["y_stride"] = n
            epi["residual"] = int(res.data.ptr)
            extra = {"bf16": 0, "int8": 512, "self": 528}[kind]
            if kind == "int8":
                epi["x_scales"] = int(xq.data.ptr) + 8 * k
            entry = "ninfer_qgemv4e_q5_add" + {"bf16": "", "int8": "_i8", "self": "_i8s"}[kind]
            function(tag, entry, 5)((grid,), (warps * 32,), (xq if kind == "int8" else x, *w, y, u32(n), u32(k), u32(1),
                                                             u32(ks), epi[()]),
                                    shared_mem=warps * STAGES[5] * (_v4_stage_bytes(5) + extra))

        errs = {"self": 0.0, "int8": 0.0, "bf16": 0.0}
        same = True  # the same int8 activations as the norm's (from its bf16 output): the same bits out
        for _ in range(3):
            h, res = _bf16_rows(cp, rng, 1, k), _bf16_rows(cp, rng, 1, n)
            xn = cp.zeros((1, k), dtype=cp.uint16)
            norm((1,), (256,), (h, nw16, xn, u32(k), np.float32(1e-6), np.float32(1.0), xq))
            ref = _f64(xn) @ ref_w.T + _f64(res)[:, rows]
            outs = {}
            for kind in errs:
                y = outs[kind] = cp.full((1, n), 0x7FC0, dtype=cp.uint16)
                add("cur", sets[0], xn, y, res, kind)
                e = float(np.abs(_f64(y)[:, rows] - ref).max() / np.abs(ref).max())
                errs[kind] = max(errs[kind], e if np.isfinite(e) else float("inf"))
            same &= bool(cp.array_equal(outs["self"], outs["int8"]))
        ok &= max(errs.values()) <= 1e-2 and same
        h, res = _bf16_rows(cp, rng, 1, k), _bf16_rows(cp, rng, 1, n)
        xn, y = cp.zeros((1, k), dtype=cp.uint16), cp.zeros((1, n), dtype=cp.uint16)
        norm((1,), (256,), (h, nw16, xn, u32(k), np.float32(1e-6), np.float32(1.0), xq))
        t = {label: graph_us(lambda i, tag=tag, kind=kind, xn=xn, y=y, res=res, s=sets: add(tag, s[i % len(s)], xn, y, res, kind),
                             max(copies, 20), reps)
             for label, tag, kind in (("self int8", "cur", "self"), ("norm's int8", "cur", "int8"), ("bf16", "cur", "bf16"),
                                      ("loads only", "d1", "bf16")) if tag in mods}
        rows_out.append((name, nbytes, errs, same, t))
        say(f"self {name:24} {nbytes / 1e6:5.1f} MB b=1 err " + ", ".join(f"{lab} {e:.2e}" for lab, e in errs.items())
            + f" (self = norm's int8 bit for bit: {'yes' if same else 'NO'}); " + ", ".join(f"{lab} {v:.2f} us ({nbytes / v / 1e3:.0f} GB/s)" for lab, v in t.items()))
        sets = None
        cp.get_default_memory_pool().free_all_blocks()
    return ok, rows_out


def mixed_check(cp, mod, say, rng, reps: int) -> tuple[bool, list]:  # noqa: ANN001
    """The mixed entry against float64 (b = 1..8, NaN-poisoned outputs) and its time against the two
    per-format multi launches it replaces (qgemv_host.cc `run_multi45` / `run_multi` geometry); then
    its int8 form on the norm's int8 activations (b = 1..4) against float64 and the bf16 form."""
    ok, rows_out = True, []
    for name, segs in MIXED.items():
        case_ok, rows = _mixed_case(cp, mod, say, rng, reps, name, segs)
        ok &= case_ok
        rows_out += rows
        cp.get_default_memory_pool().free_all_blocks()
    return ok, rows_out


def _mixed_case(cp, mod, say, rng, reps: int, name: str, segs: list) -> tuple[bool, list]:  # noqa: ANN001
    u32, k, rows_out = np.uint32, MIXED_K, []
    copies = 4
    sets = []
    for _ in range(copies):
        ws = []
        for bits, n in segs:
            hb = {4: 0, 5: 8}[bits]
            base = cp.random.randint(0, 256, size=(n, k // 2), dtype=cp.int32).astype(cp.uint8)
            high = cp.random.randint(0, 256, size=(n, k // 64 * hb), dtype=cp.int32).astype(cp.uint8) if hb else base
            sc = (cp.random.uniform(0.5, 1.5, size=(n, k // 64)) / 64).astype(cp.float16)
            ws.append((base, high, sc))
        sets.append(ws)
    tiles = [n // 16 for _, n in segs]
    n4 = sum(1 for b, _ in segs if b == 4)
    t4, t5 = sum(tiles[:n4]), sum(tiles[n4:])
    ks4, ks5 = _ks_v4(t4 * 16, k, 4), _ks_v4(t5 * 16, k, 5, q5_cap=4)
    warps = max(4, ks4, ks5)
    assert t4 % (warps // ks4) == 0
    blocks4, blocks5 = t4 // (warps // ks4), -(-t5 // (warps // ks5))
    smem = warps * max(STAGES[b] * _v4_stage_bytes(b) for b in (4, 5))
    fn = mod.get_function("ninfer_qgemv4e_q45_multi")
    fn.max_dynamic_shared_size_bytes = smem

    def epi_of(ws, ys, part):  # segment table of the weights `part`
        e = np.zeros((), dtype=EPI)
        end = 0
        for s in range(4):
            i = part[min(s, len(part) - 1)]
            if s < len(part):
                end += tiles[i]
            e["seg_end"][s], e["seg_stride"][s] = end, segs[i][1]
            e["seg_base"][s], e["seg_high"][s], e["seg_scales"][s] = (int(a.data.ptr) for a in ws[i])
            e["seg_y"][s] = int(ys[i].data.ptr)
        return e

    def mixed(ws, x, ys, b):
        e = epi_of(ws, ys, list(range(len(segs))))
        fn((blocks4 + blocks5,), (warps * 32,), (x, *ws[0], ys[0], u32(16 * (t4 + t5)), u32(k), u32(b), u32(ks4),
                                                  e[()], u32(blocks4), u32(ks5)), shared_mem=smem)

    def split(ws, x, ys, b):
        for bits, part in ((4, list(range(n4))), (5, list(range(n4, len(segs))))):
            t = sum(tiles[i] for i in part)
            ks = _ks_v4(t * 16, k, bits, q5_cap=4)
            w = max(4, ks)
            f = mod.get_function(f"ninfer_qgemv4e_q{bits}_multi")
            f.max_dynamic_shared_size_bytes = w * STAGES[bits] * _v4_stage_bytes(bits)
            e = epi_of(ws, ys, part)
            f((-(-t // (w // ks)),), (w * 32,), (x, *ws[part[0]], ys[part[0]], u32(16 * t), u32(k), u32(b), u32(ks),
                                                 e[()]), shared_mem=w * STAGES[bits] * _v4_stage_bytes(bits))

    refs = [decode_planes(cp.asnumpy(w[0]), cp.asnumpy(w[1]) if bits == 5 else None, cp.asnumpy(w[2]), bits)
            for (bits, _), w in zip(segs, sets[0], strict=True)]
    err = 0.0
    for b in range(1, 9):
        xb = (rng.standard_normal((b, k)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        x64 = (xb.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        ys = [cp.full((b, n), 0x7FC0, dtype=cp.uint16) for _, n in segs]
        mixed(sets[0], cp.asarray(xb), ys, b)
        for y, r in zip(ys, refs, strict=True):
            got = (cp.asnumpy(y).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
            ref = x64 @ r.T
            e = float(np.abs(got - ref).max() / np.abs(ref).max())
            err = max(err, e if np.isfinite(e) else float("inf"))
    nbytes = sum(n * k // 64 * (32 + {4: 0, 5: 8}[bits] + 2) for bits, n in segs)
    for b in (1, 8):
        x = cp.asarray((rng.standard_normal((b, k)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16))
        ys = [cp.zeros((b, n), dtype=cp.uint16) for _, n in segs]
        t_mixed = graph_us(lambda i, x=x, ys=ys, b=b: mixed(sets[i % copies], x, ys, b), 20, reps)
        t_split = graph_us(lambda i, x=x, ys=ys, b=b: split(sets[i % copies], x, ys, b), 20, reps)
        rows_out.append((name, b, nbytes, err, t_mixed, t_split))
        say(f"mixed {name:26} {nbytes / 1e6:5.1f} MB b={b} err {err:.2e}  one launch {t_mixed:.2f} us, "
            f"two launches {t_split:.2f} us")
    # the same launch on int8 activations (`ninfer_qgemv4e_q45_multi_i8`), written by the norm with the
    # int8 copy from a random residual row, against float64 on the norm's bf16 output, b = 1..4
    fn8 = mod.get_function("ninfer_qgemv4e_q45_multi_i8")
    smem8 = {b: warps * max(STAGES[q] * (_v4_stage_bytes(q) + (512 if b == 1 else 0)) for q in (4, 5)) for b in range(1, 5)}
    fn8.max_dynamic_shared_size_bytes = smem8[1]
    norm = mod.get_function("ninfer_rms_norm_xq_wbf16")
    xq = cp.zeros(k * 8 + k // 256 * 64, dtype=cp.uint8)
    nw16 = cp.asarray(((rng.standard_normal(k) * 0.1).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16))

    def normalize(b):  # a residual row through the norm: xn (bf16) and xq
        h = cp.asarray((rng.standard_normal((b, k)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16))
        xn = cp.empty((b, k), dtype=cp.uint16)
        norm((b,), (256,), (h, nw16, xn, u32(k), np.float32(1e-6), np.float32(1.0), xq))
        return xn

    def mixed8(ws, ys, b):
        e = epi_of(ws, ys, list(range(len(segs))))
        e["x_scales"] = int(xq.data.ptr) + 8 * k
        fn8((blocks4 + blocks5,), (warps * 32,), (xq, *ws[0], ys[0], u32(16 * (t4 + t5)), u32(k), u32(b), u32(ks4),
                                                   e[()], u32(blocks4), u32(ks5)), shared_mem=smem8[b])

    err8 = 0.0
    for b in range(1, 5):
        xn = normalize(b)
        x64 = (cp.asnumpy(xn).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        ys = [cp.full((b, n), 0x7FC0, dtype=cp.uint16) for _, n in segs]
        mixed8(sets[0], ys, b)
        for y, r in zip(ys, refs, strict=True):
            got = (cp.asnumpy(y).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
            ref = x64 @ r.T
            e = float(np.abs(got - ref).max() / np.abs(ref).max())
            err8 = max(err8, e if np.isfinite(e) else float("inf"))
    for b in (1, 2, 4):
        xn = normalize(b)
        ys = [cp.zeros((b, n), dtype=cp.uint16) for _, n in segs]
        t_i8 = graph_us(lambda i, ys=ys, b=b: mixed8(sets[i % copies], ys, b), 20, reps)
        t_bf16 = graph_us(lambda i, xn=xn, ys=ys, b=b: mixed(sets[i % copies], xn, ys, b), 20, reps)
        rows_out.append((name + " int8", b, nbytes, err8, t_i8, t_bf16))
        say(f"mixed {name:26} {nbytes / 1e6:5.1f} MB b={b} int8 err {err8:.2e}  int8 {t_i8:.2f} us, "
            f"bf16 {t_bf16:.2f} us (same launch, the norm's output)")
    return err <= 1e-2 and err8 <= 1e-2, rows_out


def cupy_check(out: Path, reps: int, cases: dict, builds: list[str] | None, force_ks: int = 0) -> int:
    import cupy as cp

    out.mkdir(parents=True, exist_ok=True)
    log = (out / "qgemv_v4e.log").open("w")

    def say(*a: object) -> None:
        print(*a, flush=True)
        print(*a, file=log, flush=True)

    mods = {tag: cp.RawModule(path=str(FATBINS / f"{tag}_sm_90a.fatbin")) for tag in BUILDS
            if (FATBINS / f"{tag}_sm_90a.fatbin").exists() and (builds is None or tag in builds)}
    bwmod = cp.RawModule(path=str(FATBINS / "bw_sm_90a.fatbin"))
    cache: dict = {}

    def function(tag: str, name: str, bits: int):
        if (tag, name) not in cache:
            fn = mods[tag].get_function(name)
            fn.max_dynamic_shared_size_bytes = min(227 * 1024, 8 * stages(tag)[bits] * (_v4_stage_bytes(bits) + 528))
            cache[(tag, name)] = fn
        return cache[(tag, name)]

    def gpu_us(fn, n_calls: int) -> float:
        return graph_us(fn, n_calls, reps)

    u32 = np.uint32
    copy_gb_s, read_gb_s = ceilings(bwmod)
    say(f"device bandwidth, 1 GiB: copy kernel {copy_gb_s:.0f} GB/s (read + write), read kernel {read_gb_s:.0f} GB/s")
    rng = np.random.default_rng(0)
    errors, timings, ok = [], [], True
    mixed_rows, i8_rows, mlp_rows = [], [], []
    add_norm_rows: list = []
    self_rows: list = []
    if "cur" in mods and ADD_NORM_CASES:
        an_ok, add_norm_rows = add_norm_check(cp, mods, say, rng, reps, function)
        ok &= an_ok
    if "cur" in mods and MLP_CASES:
        mlp_ok, mlp_rows = mlp_check(cp, mods, say, rng, reps, function)
        ok &= mlp_ok
    if "cur" in mods and I8_CASES:
        i8_ok, i8_rows = i8_check(cp, mods, say, rng, reps, function)
        ok &= i8_ok
    if "cur" in mods and SELF_CASES:
        self_ok, self_rows = self_check(cp, mods, say, rng, reps, function)
        ok &= self_ok
    if "cur" in mods and MIXED:
        mixed_ok, mixed_rows = mixed_check(cp, mods["cur"], say, rng, reps)
        ok &= mixed_ok
    for name, (mode, bits, n, k) in cases.items():
        hb = {4: 0, 5: 8, 6: 16}[bits]
        per_weight = n * k // 64 * (32 + hb + 2)
        nbytes = per_weight * (2 if mode == "swiglu" else 1)
        copies = max(1, min(40, -(-200_000_000 // nbytes)))

        def planes(n=n, k=k, hb=hb):
            base = cp.random.randint(0, 256, size=(n, k // 2), dtype=cp.int32).astype(cp.uint8)
            high = cp.random.randint(0, 256, size=(n, k // 64 * hb), dtype=cp.int32).astype(cp.uint8) if hb else base
            sc = cp.random.uniform(0.5, 1.5, size=(n, k // 64)) * cp.random.choice(cp.array([-1.0, 1.0]), size=(n, k // 64))
            return base, high, (sc / 64).astype(cp.float16)

        sets = [[planes() for _ in range(2 if mode == "swiglu" else 1)] for _ in range(copies)]
        rows = np.arange(n) if n <= 4096 else np.r_[np.arange(1024), np.arange(n - 1024, n)]
        ref_w = [decode_planes(cp.asnumpy(p[0][rows]), cp.asnumpy(p[1][rows]) if hb else None,
                               cp.asnumpy(p[2][rows]), bits) for p in sets[0]]
        grid, warps, ks = geometry(mode, bits, n, k, force_ks)
        entry = f"ninfer_qgemv4e_q{bits}_{mode}"

        def launch(tag, ws, x, y, b, residual=None, entry=entry, grid=grid, warps=warps, ks=ks, n=n, k=k,
                   bits=bits):
            smem = warps * stages(tag)[bits] * _v4_stage_bytes(bits)
            epi = np.zeros((), dtype=EPI)
            epi["y_stride"] = n
            if len(ws) == 2:
                epi["up_base"], epi["up_high"], epi["up_scales"] = (int(a.data.ptr) for a in ws[1])
            if residual is not None:
                epi["residual"] = int(residual.data.ptr)
            function(tag, entry, bits)((grid,), (warps * 32,),
                                       (x, *ws[0], y, u32(n), u32(k), u32(b), u32(ks), epi[()]), shared_mem=smem)

        for b in range(1, 9):
            xf = rng.standard_normal((b, k)).astype(np.float32)
            xb = (xf.view(np.uint32) >> 16).astype(np.uint16)
            x64 = (xb.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
            acc = [x64 @ w.T for w in ref_w]
            residual = None
            if mode == "swiglu":
                ref = acc[0] / (1 + np.exp(-acc[0])) * acc[1]
            elif mode == "add":
                rf = rng.standard_normal((b, n)).astype(np.float32)
                rb = (rf.view(np.uint32) >> 16).astype(np.uint16)
                residual = cp.asarray(rb)
                ref = acc[0] + (rb.astype(np.uint32) << 16).view(np.float32).astype(np.float64)[:, rows]
            else:
                ref = acc[0]
            for tag in mods:
                if tag in DIAG:
                    continue
                y = cp.full((b, n), 0x7FC0, dtype=cp.uint16)
                launch(tag, sets[0], cp.asarray(xb), y, b, residual)
                got = (cp.asnumpy(y).astype(np.uint32) << 16).view(np.float32)[:, rows].astype(np.float64)
                err = float(np.abs(got - ref).max() / np.abs(ref).max())
                err = err if np.isfinite(err) else float("inf")
                ok &= err <= 1e-2
                errors.append((name, tag, b, err))
        for b in (1, 2, 4, 8):
            x = cp.asarray((rng.standard_normal((b, k)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16))
            residual = cp.asarray((rng.standard_normal((b, n)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16))
            y = cp.zeros((b, n), dtype=cp.uint16)
            res = residual if mode == "add" else None
            entry_t = {tag: gpu_us(lambda i, tag=tag, s=sets, x=x, y=y, b=b, r=res: launch(tag, s[i % len(s)], x, y, b, r),
                                   max(copies, 20))
                       for tag in mods}
            timings.append((name, b, nbytes, entry_t))
            say(name, b, {t: round(v, 2) for t, v in entry_t.items()})
        sets = None
        cp.get_default_memory_pool().free_all_blocks()
    (out / "qgemv_v4e.json").write_text(json.dumps({"copy_gb_s": copy_gb_s, "read_gb_s": read_gb_s, "errors": errors,
                                                     "timings": timings, "mixed": mixed_rows,
                                                     "i8": i8_rows, "mlp": mlp_rows, "add_norm": add_norm_rows,
                                                     "self": self_rows},
                                                    indent=1))
    say("\nmax |y - ref| / max |ref| over b = 1..8 (float64 reference, bf16 output):")
    for name in cases:
        labels = dict.fromkeys(tt for (c, tt, _, _) in errors if c == name)
        say(f"{name:28} " + "  ".join(f"{t} {max(e for (c, tt, _, e) in errors if c == name and tt == t):.2e}"
                                      for t in labels))
    say(f"\nper launch in a CUDA graph (median of {reps}, us), weights rotated over copies; read {read_gb_s:.0f} GB/s, "
        f"copy {copy_gb_s:.0f} GB/s; last column: the best real build's GB/s (% of read)")
    for name, b, nbytes, e in timings:
        real = [t for t in e if t not in DIAG]
        best = min(real, key=lambda t: e[t])
        gbs = nbytes / (e[best] * 1e-6) / 1e9
        say(f"{name:28} {nbytes / 1e6:6.1f} MB b={b} " + " ".join(f"{t} {v:.2f}" for t, v in e.items())
            + f"   best {best} {gbs:.0f} GB/s ({100 * gbs / read_gb_s:.0f}%)")
    say("numerics", "ok" if ok else "FAILED")
    log.close()
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["fatbins", "cupy"])
    parser.add_argument("--baseline", help="fatbins: git revision whose qgemv_cuda.cu is the `base` build")
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--out", type=Path, default=Path("/tmp/qgemv-v4e-out"))
    parser.add_argument("--cases", help="cupy: mode:bits:N:K,... instead of the 27B launches")
    parser.add_argument("--builds", help="cupy: comma-separated build tags (default: every fatbin there)")
    parser.add_argument("--ks", type=int, default=0, help="cupy: K split for every case (default: the launcher's)")
    parser.add_argument("--i8-cases", help="cupy: mode:N:K,... of the int8 check instead of I8_CASES ('none': skip)")
    parser.add_argument("--skip", default="", help="cupy: checks to leave out, of add_norm,mlp,self,mixed,cases")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    if "add_norm" in skip:
        ADD_NORM_CASES.clear()
    if "mlp" in skip:
        MLP_CASES.clear()
    if "mixed" in skip:
        MIXED.clear()
    if "self" in skip:
        SELF_CASES.clear()
    if args.i8_cases:
        I8_CASES.clear()
        for spec in args.i8_cases.split(",") if args.i8_cases != "none" else []:
            mode, n, k = spec.split(":")
            I8_CASES[f"q4 {mode} {n}x{k}"] = (mode, int(n), int(k))
    if args.action == "fatbins":
        sys.path.insert(0, str(ROOT))
        fatbins(args.baseline)
        return 0
    cases = CASES
    if args.cases:
        cases = {}
        for spec in args.cases.split(","):
            mode, bits, n, k = spec.split(":")
            cases[f"q{bits} {mode} {n}x{k}"] = (mode, int(bits), int(n), int(k))
    if "cases" in skip:
        cases = {}
    return cupy_check(args.out, args.reps, cases, args.builds.split(",") if args.builds else None, args.ks)


if __name__ == "__main__":
    raise SystemExit(main())
