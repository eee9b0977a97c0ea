#!/usr/bin/env python3
"""Decode GEMV v5 (`ops/qgemv5_cuda.cu`) on the H200: numerics of every op, per-launch timings
against the shipped v2/v3/v4 GEMVs, and a CUDA graph of decode-shaped layers with PDL on and off.

    .venv/bin/python tests/gpu/check_qgemv5.py fatbins          # build machine: sm_90a fatbins + launcher library
    python3 tests/gpu/check_qgemv5.py cupy --out $OUT           # GPU machine (cupy), carry .cache/ninfer/gemv5

The kernels run through the package's own launcher (`ops/qgemv5_host.cc` built with its C API, no
TVM): the same plan, workspace and `cuLaunchKernelEx` (PDL attribute unless switched off). `cupy`
measures the read and copy bandwidth with its own kernels; checks every op (plain, several
outputs, swiglu, residual add), format (q4/q5/q6/bf16) and batch 1..8 (and 11: two launches)
against float64 numpy on random planes with NaN-poisoned outputs, in fp32 output (tolerance 1e-5)
and bf16 (1e-2), plus repeatability of the split-strip reduction; then times every 27B decode
projection and fused op per launch inside a CUDA graph (weights rotated over >= 200 MB of copies),
v5 against the shipped launcher's choice (v4 from 16 Mi weights, else v2 at batch 1 / v3), at
batch 1, 2, 4, 8; a ring-depth sweep; and 8 GDN decode layers (multi(q|k|v, z, a, b) -> add(out)
-> swiglu(gate, up) -> add(down), distinct weights) as one graph with PDL on and off, at batch 1
and 8, against the same projections launched with the shipped kernels.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from cupy_bench import graph_us as cupy_graph_us  # noqa: E402

STAGE = ROOT / ".cache" / "ninfer" / "gemv5"
OPS = ROOT / "ninfer_compiler" / "ops"
Q4, Q5, Q6, BF16 = 4, 5, 6, 16
PLAIN, SWIGLU, ADD = 0, 1, 2
HB = {Q4: 0, Q5: 8, Q6: 16}
# v5 builds measured besides the default: tag -> (nvcc defines, whether the launcher must match them)
VARIANTS = {"v5ne": (["-DNINFER_V5_EVICT_FIRST=0"], False),
            "v5w16": (["-DNINFER_V5_WARPS=16", "-DNINFER_V5_MIN_BLOCKS=1"], True),
            "v5d1": (["-DNINFER_V5_DIAG=1"], False)}  # loads only: timing, no numerics
K = 5120
# 27B decode launches: name -> (mode, K, [(fmt, rows, output)]), launches per step
LAUNCHES = {
    "gdn multi q|k|v,z,a,b": (PLAIN, K, [(Q4, 2048, 0), (Q4, 2048, 0), (Q5, 6144, 0), (Q5, 6144, 1), (BF16, 48, 2),
                                         (BF16, 48, 3)], 48),
    "gdn out + res": (ADD, 6144, [(Q5, 5120, 0)], 48),
    "mlp swiglu": (SWIGLU, K, [(Q4, 17408, 0), (Q4, 17408, 0)], 64),
    "mlp down + res": (ADD, 17408, [(Q5, 5120, 0)], 64),
    "attn multi q,g,k,v": (PLAIN, K, [(Q4, 6144, 0), (Q5, 6144, 1), (Q4, 1024, 2), (Q5, 1024, 3)], 16),
    "attn out + res": (ADD, 6144, [(Q5, 5120, 0)], 16),
    "head q6": (PLAIN, K, [(Q6, 248320, 0)], 1),
}
SINGLES = {  # per projection, as the shipped launcher runs them
    "q4 17408x5120": (Q4, 17408, K), "q5 5120x17408": (Q5, 5120, 17408), "q4 2048x5120": (Q4, 2048, K),
    "q5 6144x5120": (Q5, 6144, K), "q5 5120x6144": (Q5, 5120, 6144), "q4 6144x5120": (Q4, 6144, K),
    "q4 1024x5120": (Q4, 1024, K), "q5 1024x5120": (Q5, 1024, K), "bf16 48x5120": (BF16, 48, K),
    "q6 248320x5120": (Q6, 248320, K),
}


def weight_bytes(fmt: int, rows: int, k: int) -> int:
    return rows * k * 2 if fmt == BF16 else rows * k // 64 * (32 + HB[fmt] + 2)


# ---- build machine ----------------------------------------------------------------------------
def fatbins() -> None:
    from ninfer_compiler.codegen.toolchain import nvcc_path
    from ninfer_compiler.ops import qgemv
    from tests.gpu import check_qgemv

    STAGE.mkdir(parents=True, exist_ok=True)
    (STAGE / "v5_sm_90a.fatbin").write_bytes(qgemv.fatbin_v5("sm_90a"))
    (STAGE / "all_sm_90a.fatbin").write_bytes(qgemv.fatbin("sm_90a"))
    (STAGE / "dense_sm_90a.fatbin").write_bytes(qgemv.fatbin("sm_90a", dense=True))
    flags = ["-fatbin", "-O3", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a"]
    for tag, (defs, own_launcher) in VARIANTS.items():
        subprocess.run([nvcc_path(), *flags, *defs, str(qgemv.V5_DEVICE_SOURCE), "-o", str(STAGE / f"{tag}_sm_90a.fatbin")],
                       check=True)
        if own_launcher:
            build_launcher(STAGE / f"libgemv5_{tag}.so", static=True, defines=defs)
    bw = STAGE / "bw.cu"
    bw.write_text(check_qgemv.BW_SOURCE)
    subprocess.run([nvcc_path(), *flags, str(bw), "-o", str(STAGE / "bw_sm_90a.fatbin")], check=True)
    build_launcher(STAGE / "libgemv5.so", static=True)
    print("wrote", *sorted(p.name for p in STAGE.iterdir()))


def build_launcher(out: Path, static: bool = False, defines: list[str] | None = None) -> None:
    """The launcher with its C API (no TVM), for ctypes."""
    cxx = shutil.which("g++") or shutil.which("c++")
    flags = ["-static-libstdc++", "-static-libgcc"] if static else []
    subprocess.run([cxx, "-std=c++17", "-O2", "-shared", "-fPIC", *flags, *(defines or []), "-DNINFER_GEMV5_NO_TVM",
                    "-DNINFER_GEMV5_CAPI", str(OPS / "qgemv5_host.cc"), "-o", str(out), "-ldl"], check=True)


# ---- GPU machine ------------------------------------------------------------------------------
class Launcher:
    """ninfer_gemv5_run through ctypes, with the fatbin images kept alive."""

    def __init__(self) -> None:
        self.libs, self.images = {}, {}
        for tag in ("v5", *VARIANTS):
            own = VARIANTS.get(tag, ([], False))
            name = f"libgemv5_{tag}.so" if own[1] else "libgemv5.so"
            try:
                lib = ctypes.CDLL(str(STAGE / name))
            except OSError:  # built elsewhere and not loadable here: build it on this machine
                path = Path("/tmp") / name
                build_launcher(path, defines=own[0] if own[1] else None)
                lib = ctypes.CDLL(str(path))
            self.libs[tag] = lib
            data = (STAGE / f"{tag}_sm_90a.fatbin").read_bytes()
            self.images[tag] = ctypes.create_string_buffer(data, len(data))
        self.err = ctypes.create_string_buffer(512)

    def options(self, pdl: bool = True, stages: int = 0, blocks_per_sm: int = 1, min_units: int = 0) -> None:
        for lib in {id(v): v for v in self.libs.values()}.values():
            lib.ninfer_gemv5_set_options(int(pdl), int(stages), int(blocks_per_sm), int(min_units))

    def run(self, stream, mode: int, x, batch: int, k: int, weights: list, ys: list, residual=None, f32: bool = False,
            tag: str = "v5") -> None:
        """weights: [(fmt, rows, base, high, scales, output)] (cupy arrays; high/scales may be base)."""
        n = len(weights)
        u32, ptr = ctypes.c_uint32 * n, ctypes.c_void_p * n
        rc = self.libs[tag].ninfer_gemv5_run(
            self.images[tag], ctypes.c_void_p(stream.ptr), mode, ctypes.c_void_p(x.data.ptr),
            ctypes.c_void_p(residual.data.ptr if residual is not None else 0), batch, k, n,
            u32(*[w[0] for w in weights]), u32(*[w[1] for w in weights]), ptr(*[w[2].data.ptr for w in weights]),
            ptr(*[w[3].data.ptr for w in weights]), ptr(*[w[4].data.ptr for w in weights]), u32(*[w[5] for w in weights]),
            len(ys), (ctypes.c_void_p * len(ys))(*[y.data.ptr for y in ys]), int(f32), self.err, 512)
        if rc != 0:
            raise RuntimeError(self.err.value.decode())


def cupy_check(out: Path, reps: int, smoke: bool = False) -> int:
    import cupy as cp

    from tests.gpu.check_qgemv import (
        _ks_v2,
        _ks_v3,
        _ks_v4,
        _v4_geometry,
        _v4_stage_bytes,
        decode_planes,
    )

    out.mkdir(parents=True, exist_ok=True)
    log = open(out / "qgemv5.log", "w")  # noqa: SIM115 (closed at the end)
    t_start = time.perf_counter()

    def say(*a: object) -> None:
        print(*a, flush=True)
        print(*a, file=log, flush=True)

    v5 = Launcher()
    mod = cp.RawModule(path=str(STAGE / "all_sm_90a.fatbin"))
    dmod = cp.RawModule(path=str(STAGE / "dense_sm_90a.fatbin"))
    bwmod = cp.RawModule(path=str(STAGE / "bw_sm_90a.fatbin"))
    stream = cp.cuda.Stream(non_blocking=True)
    functions: dict = {}
    u32 = np.uint32
    rng = np.random.default_rng(0)

    def function(module, name: str, smem: int = 0):
        key = (id(module), name)
        if key not in functions:
            fn = module.get_function(name)
            if smem:
                try:
                    fn.max_dynamic_shared_size_bytes = smem
                except Exception:  # noqa: BLE001 - older cupy: the driver call
                    cp.cuda.driver.funcSetAttribute(fn.ptr, 8, smem)
            functions[key] = fn
        return functions[key]

    def graph_us(fn, n_calls: int, count: int = 1) -> float:
        """Median over `reps` of one CUDA graph of n_calls calls of fn(i), per call / count."""
        return cupy_graph_us(fn, n_calls, reps, stream, count)

    # ---- ceilings
    src = cp.ones(1 << 30, dtype=cp.uint8)
    dst = cp.empty_like(src)
    sink = cp.zeros(1, dtype=cp.uint32)
    nvec = u32((1 << 30) // 16)
    copy_fn, read_fn = function(bwmod, "bw_copy"), function(bwmod, "bw_read")
    copy_gb_s = 2 * (1 << 30) / (graph_us(lambda i: copy_fn((132 * 8,), (256,), (src, dst, nvec), stream=stream), 5) * 1e-6) / 1e9
    read_gb_s = (1 << 30) / (graph_us(lambda i: read_fn((132 * 8,), (256,), (src, nvec, sink), stream=stream), 5) * 1e-6) / 1e9
    say(f"device bandwidth, 1 GiB: copy kernel {copy_gb_s:.0f} GB/s (read + write), read kernel {read_gb_s:.0f} GB/s")
    src = dst = None
    cp.get_default_memory_pool().free_all_blocks()

    # ---- data
    def make_weight(fmt: int, rows: int, k: int, scale: float = 1 / 64):
        if fmt == BF16:
            w = (cp.random.standard_normal((rows, k), dtype=cp.float32) * scale * 4).view(cp.uint32) >> 16
            w = w.astype(cp.uint16)
            return (w, w, w)
        base = cp.random.randint(0, 256, size=(rows, k // 2), dtype=cp.int32).astype(cp.uint8)
        high = cp.random.randint(0, 256, size=(rows, k // 64 * HB[fmt]), dtype=cp.int32).astype(cp.uint8) if HB[fmt] else base
        sc = cp.random.uniform(0.5, 1.5, size=(rows, k // 64)) * cp.random.choice(cp.array([-1.0, 1.0]), size=(rows, k // 64))
        return (base, high, (sc * scale).astype(cp.float16))

    def ref_weight(fmt: int, planes, rows: np.ndarray) -> np.ndarray:
        if fmt == BF16:
            return (cp.asnumpy(planes[0][rows]).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        return decode_planes(cp.asnumpy(planes[0][rows]), cp.asnumpy(planes[1][rows]) if HB[fmt] else None,
                             cp.asnumpy(planes[2][rows]), fmt)

    def bf16_rand(shape, scale: float = 1.0) -> tuple:
        f = (rng.standard_normal(shape) * scale).astype(np.float32)
        bits = (f.view(np.uint32) >> 16).astype(np.uint16)
        return cp.asarray(bits), (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)

    def to_f64(y) -> np.ndarray:
        a = cp.asnumpy(y)
        return (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64) if a.dtype == np.uint16 else a.astype(np.float64)

    def sample_rows(n: int) -> np.ndarray:
        return np.arange(n) if n <= 2048 else np.unique(np.r_[np.arange(512), np.arange(n - 512, n),
                                                            rng.choice(n, 512, replace=False)])

    # ---- numerics
    errors, ok = [], True

    def check(name: str, mode: int, k: int, spec: list, batches=range(1, 9), tag: str = "v5") -> None:
        """spec: [(fmt, rows, output)]; every output checked on a row sample (all rows when small)."""
        nonlocal ok
        planes = [make_weight(f, r, k) for f, r, _ in spec]
        nout = 1 if mode != PLAIN else max(o for *_, o in spec) + 1
        out_rows = [sum(r for f, r, o in spec if o == i) for i in range(nout)] if mode == PLAIN else [spec[0][1]]
        samples = [sample_rows(n) for n in out_rows]
        refw = []  # per output: float64 weights of the sampled rows (swiglu: gate, up)
        for o in range(nout):
            if mode == SWIGLU:
                refw.append([ref_weight(spec[t][0], planes[t], samples[0]) for t in range(2)])
                continue
            parts, base = [], 0
            for (f, r, oo), pl in zip(spec, planes, strict=True):
                if oo != o:
                    continue
                sel = samples[o][(samples[o] >= base) & (samples[o] < base + r)] - base
                parts.append(ref_weight(f, pl, sel))
                base += r
            refw.append([np.concatenate(parts)])
        ws = [(f, r, *pl, o if mode == PLAIN else 0) for (f, r, o), pl in zip(spec, planes, strict=True)]
        for b in batches:
            xd, xf = bf16_rand((b, k))
            res_d, res_f = bf16_rand((b, out_rows[0])) if mode == ADD else (None, None)
            for f32 in (True, False):
                ys = [cp.full((b, n), np.nan, dtype=cp.float32) if f32 else cp.full((b, n), 0x7FC0, dtype=cp.uint16)
                      for n in out_rows]
                try:
                    with stream:
                        v5.run(stream, mode, xd, b, k, ws, ys, residual=res_d, f32=f32, tag=tag)
                    stream.synchronize()
                    err = 0.0
                    for o, y in enumerate(ys):
                        got = to_f64(y)
                        if not np.isfinite(got).all():
                            err = float("inf")
                            break
                        if mode == SWIGLU:
                            g, u = xf @ refw[o][0].T, xf @ refw[o][1].T
                            ref = g / (1 + np.exp(-g)) * u
                        else:
                            ref = xf @ refw[o][0].T
                            if mode == ADD:
                                ref = ref + res_f[:, samples[o]]
                        err = max(err, float(np.abs(got[:, samples[o]] - ref).max() / np.abs(ref).max()))
                except Exception as exc:  # noqa: BLE001 - report, count as a failure, go on
                    say(f"{name} b={b} f32={f32}: {type(exc).__name__}: {exc}")
                    err = float("inf")
                tol = 1e-5 if f32 else 1e-2
                ok &= err <= tol
                errors.append((name, "f32" if f32 else "bf16", b, err))
        # repeatability of the split reduction (bitwise)
        xd, _ = bf16_rand((8, k))
        res_d = bf16_rand((8, out_rows[0]))[0] if mode == ADD else None
        outs = []
        for _ in range(3):
            ys = [cp.full((8, n), np.nan, dtype=cp.float32) for n in out_rows]
            with stream:
                v5.run(stream, mode, xd, 8, k, ws, ys, residual=res_d, f32=True)
            stream.synchronize()
            outs.append([cp.asnumpy(y) for y in ys])
        same = all(np.array_equal(a, b) for o in outs[1:] for a, b in zip(outs[0], o, strict=True))
        ok &= same
        errors.append((name, "repeat", 8, 0.0 if same else float("inf")))
        say(f"checked {name}: max err f32 {max(e for n, t, _, e in errors if n == name and t == 'f32'):.2e}, "
            f"bf16 {max(e for n, t, _, e in errors if n == name and t == 'bf16'):.2e}, repeatable {same}")

    if smoke:  # one check of each op, and PDL launches inside a graph, then stop
        check("smoke multi", PLAIN, 1152, [(Q4, 256, 0), (Q5, 272, 1), (BF16, 48, 2)], batches=[1, 8])
        check("smoke swiglu", SWIGLU, 1152, [(Q4, 272, 0), (Q4, 272, 0)], batches=[1, 8])
        check("smoke add", ADD, 1152, [(Q6, 272, 0)], batches=[1, 8])
        w = make_weight(Q5, 6144, K)
        x, y = bf16_rand((1, K))[0], cp.zeros((1, 6144), dtype=cp.uint16)
        us = graph_us(lambda i: v5.run(stream, PLAIN, x, 1, K, [(Q5, 6144, *w, 0)], [y]), 20)
        say(f"smoke: q5 6144x5120 b=1 {us:.2f} us per launch (one weight copy: L2-resident); numerics {ok}")
        log.close()
        return 0 if ok else 1
    check("plain q4 1040x1152", PLAIN, 1152, [(Q4, 1040, 0)])
    check("plain q5 1040x1152", PLAIN, 1152, [(Q5, 1040, 0)])
    check("plain q6 1040x1152", PLAIN, 1152, [(Q6, 1040, 0)])
    check("plain bf16 56x1152", PLAIN, 1152, [(BF16, 56, 0)])
    check("multi gdn-like K5120", PLAIN, K, [(Q4, 256, 0), (Q4, 256, 0), (Q5, 768, 0), (Q5, 768, 1), (BF16, 48, 2),
                                              (BF16, 48, 3)])
    check("multi attn-like K5120", PLAIN, K, [(Q4, 768, 0), (Q5, 768, 1), (Q4, 128, 2), (Q5, 128, 3)])
    check("swiglu q4 1024x5120", SWIGLU, K, [(Q4, 1024, 0), (Q4, 1024, 0)])
    check("swiglu q5 272x1152", SWIGLU, 1152, [(Q5, 272, 0), (Q5, 272, 0)])
    check("swiglu q6 272x1152", SWIGLU, 1152, [(Q6, 272, 0), (Q6, 272, 0)])
    check("add q5 640x17408", ADD, 17408, [(Q5, 640, 0)])
    check("add q6 272x1152", ADD, 1152, [(Q6, 272, 0)])
    check("add bf16 56x1152", ADD, 1152, [(BF16, 56, 0)])
    check("plain q5 1040x1152 b=11", PLAIN, 1152, [(Q5, 1040, 0)], batches=[11])
    check("w16 multi gdn-like K5120", PLAIN, K, [(Q4, 256, 0), (Q4, 256, 0), (Q5, 768, 0), (Q5, 768, 1), (BF16, 48, 2),
                                                  (BF16, 48, 3)], batches=[1, 3, 8], tag="v5w16")
    check("w16 swiglu q4 1024x5120", SWIGLU, K, [(Q4, 1024, 0), (Q4, 1024, 0)], batches=[1, 8], tag="v5w16")
    check("ne add q5 640x17408", ADD, 17408, [(Q5, 640, 0)], batches=[1, 8], tag="v5ne")
    v5.options(blocks_per_sm=2)
    check("2/SM multi gdn-like K5120", PLAIN, K, [(Q4, 256, 0), (Q4, 256, 0), (Q5, 768, 0), (Q5, 768, 1), (BF16, 48, 2),
                                                   (BF16, 48, 3)], batches=[1, 8])
    check("2/SM add q5 640x17408", ADD, 17408, [(Q5, 640, 0)], batches=[1, 8])
    v5.options()
    for name, (mode, k, spec, _) in LAUNCHES.items():  # full 27B shapes, sampled rows
        check(f"27B {name}", mode, k, [(f, r, o) for f, r, o in spec], batches=[1, 8])
        cp.get_default_memory_pool().free_all_blocks()
    say(f"numerics done in {time.perf_counter() - t_start:.0f} s: {'ok' if ok else 'FAILED'}")

    # ---- shipped kernels (v2 / v3 / v4, dense), as qgemv_host.cc dispatches them
    def shipped(fmt: int, n: int, k: int, planes, x, y, b: int, variant: str = "auto") -> None:
        pb = 1 if b == 1 else 2 if b == 2 else 4 if b <= 4 else 8
        if fmt == BF16:
            function(dmod, f"ninfer_dense_bf16_b{pb}")((n,), (256,), (x, planes[0], y, u32(n), u32(k), u32(b), planes[0], y),
                                                   stream=stream)
            return
        if variant == "auto":
            variant = "v4" if n * k >= 16 << 20 else "v2" if b == 1 else "v3"
        if variant == "v2":
            ks = _ks_v2(n)
            grid = (n + 4 * (8 // ks) - 1) // (4 * (8 // ks))
            function(mod, f"ninfer_qgemv_q{fmt}_b{pb}_bf16")((grid,), (256,), (x, *planes, y, u32(n), u32(k), u32(b), u32(ks),
                                                                                u32(n)), stream=stream)
        elif variant == "v3":
            ks = _ks_v3(n, k)
            warps = max(8, ks)
            function(mod, f"ninfer_qgemv3_q{fmt}_ybf16")((-(-(n // 16) // (warps // ks)),), (warps * 32,),
                                                          (x, *planes, y, u32(n), u32(k), u32(b), u32(ks), u32(n)), stream=stream)
        else:
            ks = _ks_v4(n, k)
            grid, warps = _v4_geometry(n, k, ks)
            per_warp = 2 * _v4_stage_bytes(fmt)
            function(mod, f"ninfer_qgemv4_q{fmt}_ybf16", 8 * per_warp)(
                (grid,), (warps * 32,), (x, *planes, y, u32(n), u32(k), u32(b), u32(ks)), shared_mem=warps * per_warp,
                stream=stream)

    def copies_for(nbytes: int) -> int:
        return max(1, min(40, -(-200_000_000 // nbytes)))

    # ---- per-launch timings (results saved after each section: a failure later keeps them)
    timings: dict = {}
    fused: dict = {}
    chain_res: dict = {}

    def save() -> None:
        (out / "qgemv5.json").write_text(json.dumps(
            {"copy_gb_s": copy_gb_s, "read_gb_s": read_gb_s, "errors": errors,
             "timings": {f"{n}|{b}": e for (n, b), e in timings.items()},
             "fused": {f"{n}|{b}": e for (n, b), e in fused.items()}, "chain": chain_res}, indent=1))

    save()

    def time_single(name: str, fmt: int, n: int, k: int, sets: list, b: int) -> dict:
        calls = max(len(sets), 20)
        x = bf16_rand((b, k))[0]
        y = cp.zeros((b, n), dtype=cp.uint16)

        def run5(i: int, tag: str = "v5") -> None:
            v5.run(stream, PLAIN, x, b, k, [(fmt, n, *sets[i % len(sets)], 0)], [y], tag=tag)

        e = {"bytes": weight_bytes(fmt, n, k)}
        v5.options()
        e["v5"] = graph_us(run5, calls)
        if b in (1, 8):
            v5.options(pdl=False)
            e["v5 nopdl"] = graph_us(run5, calls)
            v5.options(blocks_per_sm=2)
            e["v5 2/SM"] = graph_us(run5, calls)
            v5.options()
            if b == 1 and name in ("q5 6144x5120", "q4 17408x5120", "q6 248320x5120"):
                e["v5ne"] = graph_us(lambda i: run5(i, "v5ne"), calls)
            e["v5w16"] = graph_us(lambda i: run5(i, "v5w16"), calls)
            e["v5d1"] = graph_us(lambda i: run5(i, "v5d1"), calls)
            if n * k < 16 << 20:  # small projections: units per block
                for mu in (1, 6, 12):
                    v5.options(min_units=mu)
                    e[f"v5 mu={mu}"] = graph_us(run5, calls)
                v5.options()
        e["shipped"] = graph_us(lambda i: shipped(fmt, n, k, sets[i % len(sets)], x, y, b), calls)
        if fmt != BF16 and n * k < 16 << 20:
            e["v4"] = graph_us(lambda i: shipped(fmt, n, k, sets[i % len(sets)], x, y, b, "v4"), calls)
        return e

    for name, (fmt, n, k) in SINGLES.items():
        sets = [make_weight(fmt, n, k) for _ in range(copies_for(weight_bytes(fmt, n, k)))]
        for b in (1, 2, 4, 8):
            timings[(name, b)] = e = time_single(name, fmt, n, k, sets, b)
            say(name, b, {kk: round(v, 2) for kk, v in e.items() if kk != "bytes"})
        sets = None
        cp.get_default_memory_pool().free_all_blocks()
        save()

    for name, (mode, k, spec, per_step) in LAUNCHES.items():
        nbytes = sum(weight_bytes(f, r, k) for f, r, _ in spec)
        sets = [[make_weight(f, r, k) for f, r, _ in spec] for _ in range(copies_for(nbytes))]
        calls = max(len(sets), 20)
        nout = 1 if mode != PLAIN else max(o for *_, o in spec) + 1
        out_rows = [sum(r for f, r, o in spec if o == i) for i in range(nout)] if mode == PLAIN else [spec[0][1]]
        for b in (1, 2, 4, 8):
            x = bf16_rand((b, k))[0]
            ys = [cp.zeros((b, n), dtype=cp.uint16) for n in out_rows]
            res = bf16_rand((b, out_rows[0]))[0] if mode == ADD else None

            def run5(i, s=sets, x=x, ys=ys, res=res, b=b, mode=mode, spec=spec, k=k, tag="v5"):
                v5.run(stream, mode, x, b, k, [(f, r, *pl, o if mode == PLAIN else 0) for (f, r, o), pl in
                                                zip(spec, s[i % len(s)], strict=True)], ys, residual=res, tag=tag)

            ys_old = {(f, r): cp.zeros((b, r), dtype=cp.uint16) for f, r, _ in spec}

            def run_old(i, s=sets, x=x, b=b, spec=spec, k=k, ys_old=ys_old):
                for (f, r, _), pl in zip(spec, s[i % len(s)], strict=True):
                    shipped(f, r, k, pl, x, ys_old[(f, r)], b)

            e = {"bytes": nbytes, "per_step": per_step}
            v5.options()
            e["v5"] = graph_us(run5, calls)
            if b in (1, 8):
                v5.options(pdl=False)
                e["v5 nopdl"] = graph_us(run5, calls)
                v5.options(blocks_per_sm=2)
                e["v5 2/SM"] = graph_us(run5, calls)
                v5.options()
                e["v5w16"] = graph_us(lambda i, run5=run5: run5(i, tag="v5w16"), calls)
                e["v5d1"] = graph_us(lambda i, run5=run5: run5(i, tag="v5d1"), calls)
            e["shipped"] = graph_us(run_old, calls)
            if b == 1 and name in ("gdn multi q|k|v,z,a,b", "mlp swiglu", "gdn out + res"):
                for stages in (3, 4, 5, 6, 8):
                    v5.options(stages=stages)
                    e[f"v5 S={stages}"] = graph_us(run5, calls)
                v5.options()
            fused[(name, b)] = e
            say(name, b, {kk: round(v, 2) for kk, v in e.items() if kk not in ("bytes", "per_step")})
        sets = None
        cp.get_default_memory_pool().free_all_blocks()
        save()

    # ---- decode-layer chain: 8 GDN layers, distinct weights, one graph
    layers = 8
    chain = []
    for _ in range(layers):
        k_scale = {K: 1 / (8 * np.sqrt(K)), 6144: 1 / (8 * np.sqrt(6144)), 17408: 1 / (8 * np.sqrt(17408))}
        chain.append({
            "multi": [make_weight(f, r, K, k_scale[K]) for f, r, _ in LAUNCHES["gdn multi q|k|v,z,a,b"][2]],
            "out": make_weight(Q5, 5120, 6144, k_scale[6144]),
            "gate": make_weight(Q4, 17408, K, k_scale[K]), "up": make_weight(Q4, 17408, K, k_scale[K]),
            "down": make_weight(Q5, 5120, 17408, k_scale[17408]),
        })
    layer_bytes = (sum(weight_bytes(f, r, K) for f, r, _ in LAUNCHES["gdn multi q|k|v,z,a,b"][2])
                   + weight_bytes(Q5, 5120, 6144) + 2 * weight_bytes(Q4, 17408, K) + weight_bytes(Q5, 5120, 17408))
    for b in (1, 8):
        xs = [bf16_rand((b, K))[0] for _ in range(layers + 1)]
        qkv, z, ga, gb = (cp.zeros((b, n), dtype=cp.uint16) for n in (10240, 6144, 48, 48))
        h, m = cp.zeros((b, K), dtype=cp.uint16), cp.zeros((b, 17408), dtype=cp.uint16)
        mspec = LAUNCHES["gdn multi q|k|v,z,a,b"][2]

        def run_chain(_i, b=b, xs=xs, qkv=qkv, z=z, ga=ga, gb=gb, h=h, m=m, mspec=mspec, tag="v5"):
            for li, w in enumerate(chain):
                v5.run(stream, PLAIN, xs[li], b, K, [(f, r, *pl, o) for (f, r, o), pl in zip(mspec, w["multi"], strict=True)],
                       [qkv, z, ga, gb], tag=tag)
                v5.run(stream, ADD, z, b, 6144, [(Q5, 5120, *w["out"], 0)], [h], residual=xs[li], tag=tag)
                v5.run(stream, SWIGLU, h, b, K, [(Q4, 17408, *w["gate"], 0), (Q4, 17408, *w["up"], 0)], [m], tag=tag)
                v5.run(stream, ADD, m, b, 17408, [(Q5, 5120, *w["down"], 0)], [xs[li + 1]], residual=h, tag=tag)

        outs_old = {n: cp.zeros((b, n), dtype=cp.uint16) for n in (2048, 6144, 48, 5120, 17408)}

        def run_old_chain(_i, b=b, xs=xs, mspec=mspec, outs=outs_old):
            for li, w in enumerate(chain):
                for (f, r, _), pl in zip(mspec, w["multi"], strict=True):
                    shipped(f, r, K, pl, xs[li], outs[r], b)
                shipped(Q5, 5120, 6144, w["out"], outs[6144], outs[5120], b)
                shipped(Q4, 17408, K, w["gate"], outs[5120], outs[17408], b)
                shipped(Q4, 17408, K, w["up"], outs[5120], outs[17408], b)
                shipped(Q5, 5120, 17408, w["down"], outs[17408], xs[li + 1], b)

        e = {}
        for pdl in (True, False):
            v5.options(pdl=pdl)
            e["v5 pdl" if pdl else "v5 nopdl"] = graph_us(run_chain, 1) / 1e3  # ms per chain
        v5.options(blocks_per_sm=2)
        e["v5 2/SM pdl"] = graph_us(run_chain, 1) / 1e3
        v5.options()
        e["v5w16 pdl"] = graph_us(lambda i, run_chain=run_chain: run_chain(i, tag="v5w16"), 1) / 1e3
        e["v5d1 pdl"] = graph_us(lambda i, run_chain=run_chain: run_chain(i, tag="v5d1"), 1) / 1e3
        e["shipped"] = graph_us(run_old_chain, 1) / 1e3
        finite = bool(np.isfinite(to_f64(xs[-1])).all())
        e["finite"] = finite
        chain_res[b] = e
        say(f"chain b={b}: {e}")
        save()
    chain = None

    # ---- report
    save()
    say("\nmax |y - ref| / max |ref| (float64 reference; rows sampled for N > 2048):")
    for name in dict.fromkeys(n for n, *_ in errors):
        for t in ("f32", "bf16"):
            row = [(b, e) for (n, tt, b, e) in errors if n == name and tt == t]
            say(f"  {name:28} {t:4} " + " ".join(f"b{b}:{e:.1e}" for b, e in row))
    say(f"\nper launch in a CUDA graph, median of {reps}, weights rotated; read {read_gb_s:.0f} GB/s, copy {copy_gb_s:.0f} GB/s")

    def row(name: str, e: dict, b: int) -> str:
        gbs = e["bytes"] / (e["v5"] * 1e-6) / 1e9
        extra = " ".join(f"{k_}={v:.1f}" for k_, v in e.items() if k_ not in ("bytes", "per_step", "v5", "shipped"))
        return (f"{name:24} b={b} {e['bytes'] / 1e6:7.1f} MB  v5 {e['v5']:7.2f} us  shipped {e['shipped']:7.2f} us  "
                f"{e['shipped'] / e['v5']:4.2f}x  {gbs:5.0f} GB/s {100 * gbs / read_gb_s:3.0f}% read  {extra}")

    for (name, b), e in timings.items():
        say(row(name, e, b))
    for (name, b), e in fused.items():
        say(row(name, e, b))
    step = {b: sum(fused[(n, b)]["v5"] * fused[(n, b)]["per_step"] for n in LAUNCHES) / 1e3 for b in (1, 2, 4, 8)}
    step_old = {b: sum(fused[(n, b)]["shipped"] * fused[(n, b)]["per_step"] for n in LAUNCHES) / 1e3 for b in (1, 2, 4, 8)}
    say("27B step GEMV time from these per-launch times (ms): " + ", ".join(
        f"b={b} v5 {step[b]:.2f} / shipped {step_old[b]:.2f}" for b in (1, 2, 4, 8)))
    say(f"\nchain of {layers} GDN layers ({layers * layer_bytes / 1e9:.2f} GB of weights):")
    for b, e in chain_res.items():
        for key in ("v5 pdl", "v5 nopdl", "v5 2/SM pdl", "v5w16 pdl", "v5d1 pdl", "shipped"):
            gbs = layers * layer_bytes / (e[key] * 1e-3) / 1e9
            say(f"  b={b} {key:9} {e[key]:7.3f} ms  {gbs:5.0f} GB/s  {100 * gbs / read_gb_s:3.0f}% of read, "
                f"{100 * gbs / copy_gb_s:3.0f}% of copy")
    if 1 in chain_res and 8 in chain_res:
        for key in ("v5 pdl", "v5 2/SM pdl", "shipped"):
            say(f"  8-request aggregate ({key}): {8 * chain_res[1][key] / chain_res[8][key]:.2f}x one request")
    say(f"numerics {'ok' if ok else 'FAILED'}; total {time.perf_counter() - t_start:.0f} s")
    log.close()
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["fatbins", "cupy"])
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--smoke", action="store_true", help="cupy: a few checks only (plumbing)")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/qgemv5-out")))
    args = parser.parse_args()
    if args.action == "fatbins":
        fatbins()
        return 0
    return cupy_check(args.out, args.reps, args.smoke)


if __name__ == "__main__":
    raise SystemExit(main())
