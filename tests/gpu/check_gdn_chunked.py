#!/usr/bin/env python3
"""Chunked gated delta rule kernels (`ops/gdn_chunked_triton.py`) on one GPU: numerics, speed, peers.

    .venv/bin/python tests/gpu/check_gdn_chunked.py prepare     # build machine: AOT cubins (Triton 3.9)
    python3 tests/gpu/check_gdn_chunked.py run --out $OUT       # GPU machine: carry .cache/ninfer/gdn
    TRITON_INTERPRET=1 .venv/bin/python tests/gpu/check_gdn_chunked.py small   # the run's logic on a CPU

`prepare` compiles the sm_90a images a package embeds, for several launch shapes (`VARIANTS`:
column slice, walk warps and stages, prep warps, fp32 operands; q/k and v dtypes), and the
previous kernel (`OLD_REV`'s two-kernel tf32x3 form) for the before/after, into `STAGE`.
`run` launches those cubins through cupy as the package's launcher does (no JIT of ours on the
device), with 27B shapes (Hk 16, Hv 48, dk = dv = 128, B = 1): q, k L2-normalised (q scaled by
dk^-1/2), v random and bf16-exact (the layer's v is bf16 upcast), g = -exp(A_log) softplus(a)
clipped to [-8, 0] with A_log spread over the heads, beta = sigmoid(x). Outputs and workspaces
start as NaN; output and final state of four heads are compared with a float64 token-by-token
recurrence at T = 1,024 (nonzero start state; also keys correlated inside each chunk), 7,680
(`seq_lens == 0` over a NaN slot) and 8,192 (nonzero state); other slots must stay untouched.
Then every variant, the old kernels and fla-core's `chunk_gated_delta_rule` (bf16 q/k/v, with its
in-kernel L2 norm as the layer does it, and without) are timed with CUDA events (median, L2
flushed before each launch). Prints a table last; everything goes to $OUT/gdn_chunked.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
STAGE = ROOT / ".cache" / "ninfer" / "gdn"
OLD_REV = "0c501ff"  # the tf32x3 prep + state-walk kernels measured at 4.0 ms per layer (7,680 tokens)
HK, HV, DK, DV = 16, 48, 128, 128
HEADS = (0, 1, 29, 47)  # value heads checked against float64 (key heads 0, 0, 9, 15)
LAYER, SLOT = 2, 1
DEVICE = "cuda"
# name: (q/k dtype, v dtype, (BV, walk warps, walk stages, prep warps, fp32 operands))
VARIANTS = {
    "f32in_b32w4s1": ("float32", "float32", (32, 4, 1, 4, False)),
    "f32in_b32w4s2": ("float32", "float32", (32, 4, 2, 4, False)),
    "f32in_b16w4s1": ("float32", "float32", (16, 4, 1, 4, False)),
    "f32in_b32w8s1": ("float32", "float32", (32, 8, 1, 4, False)),
    "f32in_b64w4s2": ("float32", "float32", (64, 4, 2, 4, False)),
    "f32in_b64w8s1": ("float32", "float32", (64, 8, 1, 4, False)),
    "f32in_b64w8s2": ("float32", "float32", (64, 8, 2, 4, False)),
    "f32in_b32w4s1p8": ("float32", "float32", (32, 4, 1, 8, False)),
    "f32in_tf32x3": ("float32", "float32", (32, 4, 1, 8, True)),
    "f16qk_bf16v_b32w4s1": ("float16", "bfloat16", (32, 4, 1, 4, False)),
    "f16qk_bf16v_b32w4s2": ("float16", "bfloat16", (32, 4, 2, 4, False)),
    "f16qk_bf16v_b16w4s1": ("float16", "bfloat16", (16, 4, 1, 4, False)),
    "f16qk_bf16v_b64w8s2": ("float16", "bfloat16", (64, 8, 2, 4, False)),
}
OLD = ("old_tf32x3", (32, 4, 4, "tf32x3"))  # (BV, state warps, prep warps, precision) of OLD_REV
SHIPPED = ("f32in_b64w4s2", "f16qk_bf16v_b32w4s2")  # gdn_chunked_triton.config_for("sm_90a", fp32 / bf16 v)


# ---------------------------------------------------------------- build machine
def prepare() -> None:
    """AOT images of every variant and of the old kernels (this machine's Triton), into STAGE."""
    import importlib.util

    from ninfer_compiler.ops import gdn_chunked_triton as gdn
    from ninfer_compiler.ops.triton_aot import compile_kernel

    STAGE.mkdir(parents=True, exist_ok=True)
    for name in SHIPPED:  # the shapes a package uses are among those measured
        qk, v, cfg = VARIANTS[name]
        assert gdn.Config(*cfg) == gdn.config_for("sm_90a", v), (name, gdn.config_for("sm_90a", v))
    index = {}

    def keep(key: str, img) -> dict:
        (STAGE / f"{key}.cubin").write_bytes(img.cubin)
        return {"file": f"{key}.cubin", "name": img.name, "shared": img.shared, "threads": img.threads}

    for name, (qk, v, cfg) in VARIANTS.items():
        config = gdn.Config(*cfg)
        prep, walk = gdn.images("sm_90a", HK, HV, DK, DV, qk, v, config)
        copy = gdn.copies_qk(qk, config.f32)
        index[name] = {"kind": "new", "qk": qk, "v": v, "cfg": list(cfg), "copy_qk": copy,
                       "ws": [gdn.workspace_width(HK, HV, DK, copy, config.f32), gdn.workspace_dtype(config.f32)],
                       "prep": keep(f"{name}_prep", prep), "walk": keep(f"{name}_walk", walk)}
        print(f"{name}: prep shared {prep.shared}, walk shared {walk.shared}", flush=True)
    # the previous kernels, from git (one module file, loaded on its own)
    old_src = subprocess.run(["git", "-C", str(ROOT), "show", f"{OLD_REV}:ninfer_compiler/ops/gdn_chunked_triton.py"],
                             check=True, capture_output=True, text=True).stdout
    old_path = STAGE / "gdn_chunked_old.py"
    old_path.write_text(old_src)
    spec = importlib.util.spec_from_file_location("gdn_chunked_old", old_path)
    old = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(old)
    bv, warps, prep_warps, precision = OLD[1]
    heads = {"HK": HK, "HV": HV, "DK": DK, "DV": DV, "BT": 64, "PRECISION": precision}
    x = "*fp32"
    oprep = compile_kernel(old.prep_kernel, arch="sm_90a", num_warps=prep_warps, num_stages=1,
                           signature={"q_ptr": x, "k_ptr": x, "v_ptr": x, "g_ptr": x, "beta_ptr": x, "ws_ptr": x,
                                      "n_tok": "i32"}, constants=heads)
    ostep = compile_kernel(old.state_kernel, arch="sm_90a", num_warps=warps, num_stages=1,
                           signature={"q_ptr": x, "k_ptr": x, "g_ptr": x, "ws_ptr": x, "state_ptr": x,
                                      "slots_ptr": "*i32", "lens_ptr": "*i32", "o_ptr": x, "n_tok": "i32",
                                      "n_slots": "i32", "layer": "i32"}, constants={**heads, "BV": bv})
    index[OLD[0]] = {"kind": "old", "qk": "float32", "v": "float32", "cfg": list(OLD[1]), "rev": OLD_REV,
                     "ws": [HV * (DK + DV + 64), "float32"],
                     "prep": keep("old_prep", oprep), "walk": keep("old_state", ostep)}
    (STAGE / "index.json").write_text(json.dumps(index, indent=1))
    print(f"wrote {len(index)} variants to {STAGE}")


# ---------------------------------------------------------------- shared by run and small
def make_inputs(t: int, seed: int, correlated: bool = False):
    """Random layer inputs of one sequence: (q_raw, k_raw, q, k, v, g, beta), fp32."""
    import torch

    gen = torch.Generator(device=DEVICE).manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=DEVICE)

    q_raw = randn(1, t, HK, DK)
    k_raw = randn(1, t, HK, DK)
    if correlated:  # keys of a chunk close to one direction: A near strictly-lower ones
        base = randn(1, (t + 63) // 64, HK, DK).repeat_interleave(64, dim=1)[:, :t]
        k_raw = base + 0.05 * k_raw
    q = q_raw / q_raw.norm(dim=-1, keepdim=True) * DK**-0.5
    k = k_raw / k_raw.norm(dim=-1, keepdim=True)
    v = randn(1, t, HV, DV).bfloat16().float()
    a_log = torch.linspace(-3.0, 1.5, HV, device=DEVICE)
    g = (-torch.exp(a_log) * torch.nn.functional.softplus(randn(1, t, HV) - 1.0)).clamp(min=-8.0)
    beta = torch.sigmoid(randn(1, t, HV))
    return q_raw, k_raw, q, k, v, g, beta


def reference(q, k, v, g, beta, s0):
    """float64 recurrence for the heads in HEADS; s0 [len(HEADS), DK, DV]. Returns (o, state)."""
    import torch

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


TORCH_DTYPE = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16"}


class Case:
    """One input set with its reference, the start state and the tensors each dtype variant reads."""

    def __init__(self, t: int, seed: int, correlated: bool, reset: bool):
        import torch

        self.t, self.correlated, self.reset = t, correlated, reset
        self.q_raw, self.k_raw, self.q, self.k, self.v, self.g, self.beta = make_inputs(t, seed, correlated)
        self.state0 = torch.randn(3, 2, HV, DK, DV, device=DEVICE) * 0.1
        if reset:
            self.state0[LAYER, SLOT] = float("nan")  # must be ignored: the sequence starts from zero
        s_init = (torch.zeros(len(HEADS), DK, DV, device=DEVICE) if reset
                  else self.state0[LAYER, SLOT, list(HEADS)].clone())
        self.s_init_all = torch.zeros(HV, DK, DV, device=DEVICE) if reset else self.state0[LAYER, SLOT].clone()
        self.ref_o, self.ref_s = reference(self.q, self.k, self.v, self.g, self.beta, s_init)
        self.lens = torch.tensor([0 if reset else 5], dtype=torch.int32, device=DEVICE)
        self.slots = torch.tensor([SLOT], dtype=torch.int32, device=DEVICE)
        self._cast = {}

    def qkv(self, qk: str, v: str):
        import torch

        key = (qk, v)
        if key not in self._cast:
            self._cast[key] = (self.q.to(getattr(torch, qk)).contiguous(), self.k.to(getattr(torch, qk)).contiguous(),
                               self.v.to(getattr(torch, v)).contiguous())
        return self._cast[key]

    def check(self, o, state) -> dict:
        """Errors of o / final state against float64 and whether the other slots were kept."""
        import torch

        hs = list(HEADS)
        others = torch.equal(state[[0, 1]], self.state0[[0, 1]]) and torch.equal(state[LAYER, 0], self.state0[LAYER, 0])
        finite = bool(torch.isfinite(o).all()) and bool(torch.isfinite(state[LAYER, SLOT]).all())
        return {"o_err": rel(o[0][:, hs].float(), self.ref_o), "state_err": rel(state[LAYER, SLOT, hs], self.ref_s),
                "others_kept": bool(others), "finite": finite}


def timed(fn, reps: int, flush=None, marks: int = 0) -> list[float]:
    """Median milliseconds of `fn(events)` after two warm-ups (L2 flushed before each launch).

    `fn` records `marks` extra events in between (e.g. between two kernels); the result is the
    median total followed by the median of each span.
    """
    import torch

    spans: list[list[float]] = []
    for i in range(reps + 2):
        if flush is not None:
            flush()
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(marks + 2)]
        ev[0].record()
        fn(ev[1:-1])
        ev[-1].record()
        ev[-1].synchronize()
        if i >= 2:
            spans.append([ev[0].elapsed_time(ev[-1])] + [ev[j].elapsed_time(ev[j + 1]) for j in range(marks + 1)])
    return [statistics.median(x[j] for x in spans) for j in range(marks + 2)]


# ---------------------------------------------------------------- GPU machine
def run(out: Path, reps: int, skip_fla: bool, budget_s: float) -> int:
    import numpy as np
    import torch

    sys.path.insert(0, str(ROOT / "tests" / "gpu"))
    from cupy_bench import run_log

    out.mkdir(parents=True, exist_ok=True)
    say, t_start = run_log(out / "check_gdn_chunked.log"), time.time()

    import cupy as cp
    import triton

    say(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__} cupy {cp.__version__}")
    index = json.loads((STAGE / "index.json").read_text())
    kernels, results = {}, {"variants": {}, "fla": {}, "resources": {}}
    for name, meta in index.items():
        fns = []
        for part in ("prep", "walk"):
            m = meta[part]
            module = cp.RawModule(path=str(STAGE / m["file"]))
            fn = module.get_function(m["name"])
            if m["shared"] > 48 * 1024:
                fn.max_dynamic_shared_size_bytes = m["shared"]
            fns.append((fn, m, module))
            results["resources"][f"{name}.{part}"] = {"regs": fn.num_regs, "local_bytes": fn.local_size_bytes,
                                                     "shared": m["shared"], "threads": m["threads"]}
        kernels[name] = fns
    say("resources (regs / local bytes / shared): " + ", ".join(
        f"{k} {v['regs']}/{v['local_bytes']}/{v['shared']}" for k, v in results["resources"].items()))

    ptr = lambda x: np.uint64(x.data_ptr())  # noqa: E731
    null = (np.uint64(0), np.uint64(0))  # Triton's two scratch pointers

    def launcher(name: str, case: Case, o, state, ws):
        meta, ((pf, pm, _), (wf, wm, _)) = index[name], kernels[name]
        q, k, v = case.qkv(meta["qk"], meta["v"])
        t, nt = np.int32(case.t), -(-case.t // 64)
        bv = meta["cfg"][0]
        if meta["kind"] == "old":
            prep_args = (ptr(q), ptr(k), ptr(v), ptr(case.g), ptr(case.beta), ptr(ws), t, *null)
            walk_args = (ptr(q), ptr(k), ptr(case.g), ptr(ws), ptr(state), ptr(case.slots), ptr(case.lens), ptr(o),
                         t, np.int32(state.shape[1]), np.int32(LAYER), *null)
        else:
            prep_args = (ptr(q), ptr(k), ptr(case.g), ptr(case.beta), ptr(ws), t, *null)
            walk_args = (ptr(q), ptr(k), ptr(v), ptr(case.beta), ptr(ws), ptr(state), ptr(case.slots), ptr(case.lens),
                         ptr(o), t, np.int32(state.shape[1]), np.int32(LAYER), *null)

        def go(marks=()):
            pf((nt, HV, 1), (pm["threads"], 1, 1), prep_args, shared_mem=pm["shared"])
            if marks:
                marks[0].record()
            wf((DV // bv, HV, 1), (wm["threads"], 1, 1), walk_args, shared_mem=wm["shared"])
        return go

    flush_buf = torch.empty(256 * 2**20, dtype=torch.uint8, device=DEVICE)
    flush = flush_buf.zero_
    cases = [("1024", Case(1024, 1, False, False)), ("1024 corr", Case(1024, 2, True, False)),
             ("7680", Case(7680, 3, False, True)), ("8192", Case(8192, 4, False, False))]
    say(f"references done ({time.time() - t_start:.0f} s)")
    failed = 0
    try:
        for label, case in cases:
            for name, meta in index.items():
                if case.correlated and name not in (*SHIPPED, "f32in_b32w4s1", "f32in_tf32x3", OLD[0]):
                    continue
                q, k, v = case.qkv(meta["qk"], meta["v"])
                ws = torch.empty(1, case.t, meta["ws"][0], dtype=getattr(torch, meta["ws"][1]), device=DEVICE)
                o = torch.full_like(v, float("nan"))
                state = case.state0.clone()
                ws.fill_(float("nan"))
                go = launcher(name, case, o, state, ws)
                try:
                    go()
                    torch.cuda.synchronize()
                except Exception as exc:  # report and go on with the other variants
                    say(f"T={label} {name}: launch failed {exc!r}"[:300])
                    failed += 1
                    continue
                chk = case.check(o, state)
                # bf16 outputs carry their rounding (up to 2^-8 of the range) on top of the kernel's error
                o_tol = 2e-3 + (2**-8 if meta["v"] == "bfloat16" else 0.0)
                ok = chk["finite"] and chk["others_kept"] and chk["o_err"] <= o_tol and chk["state_err"] <= 2e-3
                failed += not ok
                row = {**chk, "ok": ok}
                if not case.correlated:
                    def step(marks, go=go, state=state):
                        go(marks)  # the state keeps evolving across repeats: same work, finite values
                    ms = timed(step, reps, flush, marks=1)
                    row.update({"ms": ms[0], "prep_ms": ms[1], "walk_ms": ms[2]})
                results["variants"].setdefault(name, {})[label] = row
                tail = f" {row['ms']:.3f} ms (prep {row['prep_ms']:.3f}, walk {row['walk_ms']:.3f})" if "ms" in row else ""
                say(f"T={label} {name}: o_err {chk['o_err']:.2e} state_err {chk['state_err']:.2e} "
                    f"{'ok' if ok else 'FAIL'}{tail}")
                del ws, o, state
            (out / "gdn_chunked.json").write_text(json.dumps(results, indent=1))
        if not skip_fla:
            fla_runs(cases, reps, flush, results, say, deadline=t_start + budget_s)
    finally:
        (out / "gdn_chunked.json").write_text(json.dumps(results, indent=1))
        summary(results, say)
    say(f"{'FAILED' if failed else 'all checks ok'} ({time.time() - t_start:.0f} s)")
    return 1 if failed else 0


def fla_runs(cases, reps: int, flush, results: dict, say, deadline: float) -> None:
    """fla-core's chunk_gated_delta_rule on the same inputs (bf16 q/k/v, fp32 g, beta, state)."""
    import torch

    try:
        import fla
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except Exception as exc:  # not installed or not importable with this Triton
        say(f"fla-core not importable: {exc!r}"[:400])
        results["fla"]["error"] = repr(exc)[:400]
        return
    say(f"fla-core {fla.__version__}")
    order = {"7680": 0, "8192": 1, "1024": 2}  # the prompt length that matters first
    for label, case in sorted((c for c in cases if c[0] in order), key=lambda c: order[c[0]]):
        bf = torch.bfloat16
        h0 = case.s_init_all[None].contiguous()
        modes = {"fla_l2norm_in_kernel": (case.q_raw.to(bf), case.k_raw.to(bf), DK**-0.5, True),
                 "fla_prenormalized": ((case.q * DK**0.5).to(bf), case.k.to(bf), DK**-0.5, False)}
        for mode, (q, k, scale, l2) in modes.items():
            if time.time() > deadline:
                say(f"T={label} {mode}: skipped (time budget)")
                continue
            v = case.v.to(bf)

            def call(marks=(), q=q, k=k, v=v, scale=scale, l2=l2, case=case, h0=h0):
                return chunk_gated_delta_rule(q, k, v, case.g, case.beta, scale=scale, initial_state=h0,
                                              output_final_state=True, use_qk_l2norm_in_kernel=l2)
            try:
                t0 = time.time()
                with torch.inference_mode():
                    o, ht = call()
                    torch.cuda.synchronize()
                    first_s = time.time() - t0
                    hs = list(HEADS)
                    eo, es = rel(o[0][:, hs].float(), case.ref_o), rel(ht[0, hs].float(), case.ref_s)
                    ms = timed(call, reps, flush)[0]
            except Exception as exc:  # report and go on
                say(f"T={label} {mode}: failed {exc!r}"[:400])
                results["fla"].setdefault(mode, {})[label] = {"error": repr(exc)[:400]}
                continue
            results["fla"].setdefault(mode, {})[label] = {"ms": ms, "o_err": eo, "state_err": es, "first_call_s": first_s}
            say(f"T={label} {mode}: o_err {eo:.2e} state_err {es:.2e} {ms:.3f} ms (first call {first_s:.1f} s)")


def summary(results: dict, say) -> None:
    """The table: per length, every variant's ms per layer and errors, and the ratio to fla-core."""
    say("\n| T | kernel | prep ms | walk ms | ms per layer | x48 layers (ms) | / fla | o err | state err |")
    say("|---|---|---|---|---|---|---|---|---|")
    for label in ("1024", "7680", "8192"):
        fla = results["fla"].get("fla_l2norm_in_kernel", {}).get(label, {}).get("ms")
        for name, rows in results["variants"].items():
            r = rows.get(label)
            if not r or "ms" not in r:
                continue
            ratio = f"{r['ms'] / fla:.2f}" if fla else "-"
            say(f"| {label} | {name} | {r['prep_ms']:.3f} | {r['walk_ms']:.3f} | {r['ms']:.3f} | {48 * r['ms']:.1f} | "
                f"{ratio} | {r['o_err']:.1e} | {r['state_err']:.1e} |")
        for mode, rows in results["fla"].items():
            r = rows.get(label) if isinstance(rows, dict) else None
            if r and "ms" in r:
                say(f"| {label} | {mode} | - | - | {r['ms']:.3f} | {48 * r['ms']:.1f} | "
                    f"{r['ms'] / fla if fla else float('nan'):.2f} | {r['o_err']:.1e} | {r['state_err']:.1e} |")
    for name, rows in results["variants"].items():
        r = rows.get("1024 corr")
        if r:
            say(f"correlated keys T=1024 {name}: o err {r['o_err']:.1e}, state err {r['state_err']:.1e}")


# ---------------------------------------------------------------- CPU smoke run
def small() -> int:
    """The run's case logic on tiny shapes with Triton's interpreter (no cupy, no cubins)."""
    global HK, HV, DK, DV, HEADS, DEVICE
    import torch

    from ninfer_compiler.ops import gdn_chunked_triton as gdn

    HK, HV, DK, DV, HEADS, DEVICE = 2, 4, 16, 32, (0, 3), "cpu"
    failed = 0
    for t, reset in ((70, False), (130, True)):
        case = Case(t, t, False, reset)
        for qk, v, cfg in (("float32", "float32", (16, 4, 1, 4, False)), ("float16", "bfloat16", (32, 4, 1, 4, False)),
                           ("float32", "float32", (32, 4, 1, 4, True))):
            q, k, vv = case.qkv(qk, v)
            state = case.state0.clone()
            o = torch.full_like(vv, float("nan"))
            gdn.run_torch(q, k, vv, case.g, case.beta, state, case.slots, case.lens, LAYER, out=o,
                          config=gdn.Config(*cfg))
            chk = case.check(o, state)
            ok = chk["finite"] and chk["others_kept"] and chk["o_err"] < 8e-3 and chk["state_err"] < 3e-3
            failed += not ok
            print(f"T={t} reset={reset} {qk}/{v} {cfg}: o_err {chk['o_err']:.1e} state_err {chk['state_err']:.1e} "
                  f"{'ok' if ok else 'FAIL'}")
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("action", choices=["prepare", "run", "small"])
    parser.add_argument("--out", default="out/gdn")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--skip-fla", action="store_true")
    parser.add_argument("--budget", type=float, default=190.0, help="run: seconds after which fla-core is skipped")
    args = parser.parse_args()
    if args.action == "prepare":
        os.environ.pop("TRITON_INTERPRET", None)
        prepare()
        return 0
    if args.action == "small":
        return small()
    return run(Path(args.out), args.reps, args.skip_fla, args.budget)


if __name__ == "__main__":
    sys.exit(main())
