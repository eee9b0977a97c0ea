#!/usr/bin/env python3
"""The fused GDN decode step (`ops/gdn_decode_fused.py`) on one GPU: numerics and speed per batch.

    .venv/bin/python tests/gpu/check_gdn_decode.py prepare     # build machine: sm_90a cubins (Triton 3.9)
    python3 tests/gpu/check_gdn_decode.py run --out $OUT       # GPU machine: carry .cache/ninfer/gdn-decode
    .venv/bin/python tests/gpu/check_gdn_decode.py small       # the run's logic on a CPU (Triton's interpreter)

`prepare` compiles the kernel as a 27B package embeds it (16 key / 48 value heads, dk = dv = 128,
gate projections folded from a 5,120-wide layer input, int8 activations out) in several launch
shapes (`VARIANTS`: whole state slice per program, or column chunks of BV with so many warps and
what they load ahead). `run` launches those cubins through cupy as the package's launcher does, at batches
1, 2, 4 and 8: every variant's output, new state and int8 activations on one layer against a
float64 composition of the unfused ops (all heads), and against the whole-slice variant; then the
time per launch inside a CUDA graph of 48 launches, each on its own layer's state and gate weights
(as a decode step walks them: nothing stays in L2), and on one layer over and over (`hot`: the
state stays in L2). Bytes per launch: the state read and written, the gate weights, the rows in and
out. Prints a table last; everything goes to $OUT/gdn_decode.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
STAGE = ROOT / ".cache" / "ninfer" / "gdn-decode"
HK, HV, DK, DV, GATE_K = 16, 48, 128, 128, 5120
LAYERS, SLOTS = 48, 8
CHECK_LAYER = 5
BATCHES = (1, 2, 4, 8)
EPS = 1e-6
STATE_TOL = 1e-3  # new state against float64, relative to its largest element
# name: (BV (0: the whole slice), warps, gate columns per step (0: all, loaded before the wait),
# prefetch the next chunk); the package's shapes (gdn_decode_fused.SHAPES) are among them
VARIANTS = {
    "whole_w8": (0, 8, 0, False),
    "c32_w4": (32, 4, 1024, False),
    "c64_w4": (64, 4, 1024, False),
    "c64_w4_g2k": (64, 4, 2048, False),
    "c64_w4_g0": (64, 4, 0, False),
    "c64_w4_pf": (64, 4, 1024, True),
    "c64_w4_g0_pf": (64, 4, 0, True),
    "c64_w8_g0_pf": (64, 8, 0, True),
    "c32_w4_pf": (32, 4, 1024, True),
    "c32_w4_g0_pf": (32, 4, 0, True),
    "c32_w8_g0_pf": (32, 8, 0, True),
}
REFERENCE_VARIANT = "whole_w8"
DEVICE = "cuda"


# ---------------------------------------------------------------- build machine
def prepare() -> None:
    """AOT images of every variant (this machine's Triton), into STAGE."""
    from ninfer_compiler.ops import gdn_decode_fused as fused

    STAGE.mkdir(parents=True, exist_ok=True)
    index = {}
    for old in STAGE.glob("*.cubin"):
        old.unlink()
    shipped = {(sh.bv, sh.warps, sh.gate_bk, sh.prefetch) for sh in (fused.shape_for(r, DV) for r in fused.SHAPES)}
    assert shipped <= set(VARIANTS.values()), f"package shapes not measured here: {shipped - set(VARIANTS.values())}"
    for name, (bv, warps, gate_bk, prefetch) in VARIANTS.items():
        img = fused.image(HK, HV, DK, DV, "bfloat16", "float32", "sm_90a", GATE_K, True, bv, warps,
                          gate_bk=gate_bk, prefetch=prefetch)
        (STAGE / f"{name}.cubin").write_bytes(img.cubin)
        index[name] = {"file": f"{name}.cubin", "name": img.name, "shared": img.shared, "threads": img.threads,
                       "cfg": [bv, warps, gate_bk, prefetch]}
        print(f"{name}: shared {img.shared}, threads {img.threads}", flush=True)
    (STAGE / "index.json").write_text(json.dumps(index, indent=1))
    print(f"wrote {len(index)} variants to {STAGE}")


# ---------------------------------------------------------------- shared by run and small
class Inputs:
    """One batch's tensors (every layer's state and gate weights), on DEVICE."""

    def __init__(self, batch: int, seed: int):
        import torch

        gen = torch.Generator(device=DEVICE).manual_seed(seed)

        def randn(*shape, scale=1.0, dtype=torch.bfloat16):
            return (torch.randn(*shape, generator=gen, device=DEVICE) * scale).to(dtype)

        self.batch = batch
        c = 2 * HK * DK + HV * DV
        self.mixed = randn(batch, c)
        self.h = randn(batch, GATE_K)
        self.wa = randn(LAYERS, HV, GATE_K, scale=GATE_K**-0.5)
        self.wb = randn(LAYERS, HV, GATE_K, scale=GATE_K**-0.5)
        self.a_log = torch.linspace(-3.0, 1.5, HV, device=DEVICE)
        self.dt_bias = randn(HV, dtype=torch.float32)
        self.z = randn(batch, HV * DV, scale=2.0)
        self.norm_w = (1.0 + randn(DV, scale=0.1, dtype=torch.float32)).bfloat16()
        self.state0 = randn(LAYERS, SLOTS, HV, DK, DV, scale=0.1, dtype=torch.float32)
        self.slots = torch.arange(SLOTS - 1, SLOTS - 1 - batch, -1, dtype=torch.int32, device=DEVICE)
        lens = [3 + i for i in range(batch)]
        if batch > 1:
            lens[1] = 0  # a sequence that starts here: its slot's old state must not be read
            self.state0[:, int(self.slots[1])] = float("nan")
        self.lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
        width = HV * DV
        self.xq_bytes = width * 8 + width // 256 * 64

    def bytes_per_launch(self) -> int:
        b = self.batch
        return (b * HV * DK * DV * 4 * 2 + 2 * HV * GATE_K * 2
                + b * 2 * (2 * HK * DK + HV * DV + GATE_K + 2 * HV * DV))

    def reference(self, layer: int):
        """float64 composition of the unfused ops for one layer: (out [B, HV*DV], new state [B, HV, DK, DV])."""
        import torch

        def bf16(x):
            return x.float().bfloat16().double()

        b = self.batch
        m = self.mixed.double()
        rep = HV // HK
        q = m[:, :HK * DK].view(b, HK, DK).repeat_interleave(rep, 1)
        k = m[:, HK * DK:2 * HK * DK].view(b, HK, DK).repeat_interleave(rep, 1)
        v = m[:, 2 * HK * DK:].view(b, HV, DV)
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + EPS) * DK**-0.5
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + EPS)
        # the gate dots in float32 as the kernel sums them (a float64 sum would round to the other
        # bf16 neighbour now and then, and one beta a bf16 step off moves that head's state by 4e-3)
        a_pre = bf16(self.h.float() @ self.wa[layer].float().T)
        b_pre = bf16(self.h.float() @ self.wb[layer].float().T)
        x = a_pre + self.dt_bias.double()
        g = -torch.exp(self.a_log.double()) * torch.where(x > 20, x, torch.log1p(torch.exp(x)))
        beta = bf16(torch.sigmoid(b_pre))
        s = self.state0[layer, self.slots.long()].double()
        s = torch.where((self.lens == 0).view(b, 1, 1, 1), torch.zeros_like(s), s) * torch.exp(g)[..., None, None]
        u = beta[..., None] * (v - torch.einsum("bhkv,bhk->bhv", s, k))
        s = s + k[..., :, None] * u[..., None, :]
        o = bf16(torch.einsum("bhkv,bhk->bhv", s, q))
        normed = bf16(o / torch.sqrt((o * o).mean(-1, keepdim=True) + 1e-5))
        z = self.z.double().view(b, HV, DV)
        out = normed * self.norm_w.double() * z * torch.sigmoid(z)
        return out.reshape(b, HV * DV), s


def rel(a, b) -> float:
    return float((a.double() - b).abs().max() / b.abs().max())


def check_one(inp: Inputs, launch, name: str, results: dict, say, keep: dict) -> bool:
    """One launch on CHECK_LAYER against float64 and against the reference variant's bytes."""
    import torch

    state = inp.state0.clone()
    out = torch.full((inp.batch, HV * DV), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    xq = torch.full((inp.xq_bytes,), 0x5A, dtype=torch.uint8, device=DEVICE)
    launch(CHECK_LAYER, state, out, xq)
    ref_out, ref_state = inp.reference(CHECK_LAYER)
    new_state = state[CHECK_LAYER, inp.slots.long()]
    others = state.clone()
    others[CHECK_LAYER, inp.slots.long()] = inp.state0[CHECK_LAYER, inp.slots.long()]
    kept = torch.equal(torch.nan_to_num(others, nan=7.0), torch.nan_to_num(inp.state0, nan=7.0))
    out_err, state_err = rel(out.float(), ref_out), rel(new_state, ref_state)
    finite = bool(torch.isfinite(out.float()).all()) and bool(torch.isfinite(new_state).all())
    row = {"out_err": out_err, "state_err": state_err, "others_kept": kept, "finite": finite}
    if name == REFERENCE_VARIANT:
        keep[inp.batch] = (out.clone(), new_state.clone(), xq.clone())
    elif inp.batch in keep:
        r_out, r_state, r_xq = keep[inp.batch]
        row["out_differs"] = int((out != r_out).sum())
        row["state_vs_whole"] = rel(new_state, r_state.double())
        row["xq_differs"] = int((xq != r_xq).sum())
    written = bool((xq != 0x5A).any())
    row["xq_written"] = written
    ok = (finite and kept and out_err <= 2e-2 and state_err <= STATE_TOL and written == (inp.batch <= 4)
          and row.get("out_differs", 0) <= out.numel() // 1000 and row.get("state_vs_whole", 0.0) <= 1e-5)
    row["ok"] = ok
    results.setdefault(name, {})[str(inp.batch)] = row
    extra = (f", vs {REFERENCE_VARIANT}: {row['out_differs']} outputs differ, state {row['state_vs_whole']:.1e}, "
             f"{row['xq_differs']} xq bytes differ") if "out_differs" in row else ""
    say(f"B={inp.batch} {name}: out {out_err:.2e} state {state_err:.2e} kept {kept} xq written {written}{extra} "
        f"{'ok' if ok else 'FAIL'}")
    return ok


# ---------------------------------------------------------------- GPU machine
def run(out_dir: Path, reps: int) -> int:
    import numpy as np
    import torch

    sys.path.insert(0, str(ROOT / "tests" / "gpu"))
    import cupy as cp
    from cupy_bench import graph_us, run_log

    out_dir.mkdir(parents=True, exist_ok=True)
    say, t0 = run_log(out_dir / "check_gdn_decode.log"), time.time()
    say(f"{torch.cuda.get_device_name()} torch {torch.__version__} cupy {cp.__version__}")
    index = json.loads((STAGE / "index.json").read_text())
    modules = {name: cp.RawModule(path=str(STAGE / meta["file"])) for name, meta in index.items()}
    fns = {name: modules[name].get_function(meta["name"]) for name, meta in index.items()}
    results = {"checks": {}, "times": {}, "resources": {
        name: {"regs": fn.num_regs, "local_bytes": fn.local_size_bytes, "shared": index[name]["shared"],
               "threads": index[name]["threads"]} for name, fn in fns.items()}}
    say("resources (regs / local bytes / shared / threads): " + ", ".join(
        f"{k} {v['regs']}/{v['local_bytes']}/{v['shared']}/{v['threads']}" for k, v in results["resources"].items()))

    # copy bandwidth (read + write) over 1 GiB, the roofline the per-launch figures are stated against
    src = torch.empty(1 << 30, dtype=torch.uint8, device=DEVICE).random_(0, 255)
    dst = torch.empty_like(src)
    times = []
    for i in range(8):
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
        ev[0].record()
        dst.copy_(src)
        ev[1].record()
        ev[1].synchronize()
        if i >= 2:
            times.append(ev[0].elapsed_time(ev[1]))
    copy_gbs = 2 * (1 << 30) / (statistics.median(times) * 1e-3) / 1e9
    del src, dst
    results["copy_gbs"] = copy_gbs
    say(f"copy bandwidth {copy_gbs:,.0f} GB/s")

    ptr = lambda x: np.uint64(x.data_ptr())  # noqa: E731
    null = (np.uint64(0), np.uint64(0))  # Triton's two scratch pointers
    failed = 0
    width = HV * DV
    for batch in BATCHES:
        inp = Inputs(batch, seed=batch)
        keep: dict = {}
        for name, meta in index.items():
            fn = fns[name]

            def launch(layer, state, out, xq, fn=fn, meta=meta, inp=inp):
                args = (ptr(inp.mixed), ptr(inp.wa[layer]), ptr(inp.wb[layer]), ptr(inp.h), ptr(inp.a_log),
                        ptr(inp.dt_bias), ptr(inp.z), ptr(inp.norm_w), ptr(state), ptr(inp.slots), ptr(inp.lens),
                        ptr(out), np.int32(layer), np.int32(SLOTS), np.float32(1e-5), ptr(xq),
                        np.uint64(xq.data_ptr() + width * 8), np.uint64(0), np.uint64(0), np.int32(0), *null)
                fn((inp.batch, HV, 1), (meta["threads"], 1, 1), args, shared_mem=meta["shared"])

            try:
                failed += not check_one(inp, launch, name, results["checks"], say, keep)
            except Exception as exc:  # report and go on with the other variants
                say(f"B={batch} {name}: launch failed {exc!r}"[:300])
                failed += 1
                continue
            state = inp.state0.nan_to_num(0.0)
            out = torch.empty((batch, width), dtype=torch.bfloat16, device=DEVICE)
            xq = torch.empty((inp.xq_bytes,), dtype=torch.uint8, device=DEVICE)
            torch.cuda.synchronize()
            walk = graph_us(lambda i, go=launch, st=state, o=out, x=xq: go(i % LAYERS, st, o, x), LAYERS, reps)
            hot = graph_us(lambda i, go=launch, st=state, o=out, x=xq: go(CHECK_LAYER, st, o, x), LAYERS, reps)
            gb = inp.bytes_per_launch() / 1e9
            row = {"us": walk, "hot_us": hot, "bytes": inp.bytes_per_launch(), "gbs": gb / (walk * 1e-6),
                   "of_copy": gb / (walk * 1e-6) / copy_gbs}
            results["times"].setdefault(name, {})[str(batch)] = row
            say(f"B={batch} {name}: {walk:.2f} us per launch ({row['gbs']:,.0f} GB/s, {row['of_copy']:.0%} of copy), "
                f"hot {hot:.2f} us")
            del state, out, xq
        del inp
        torch.cuda.empty_cache()
        (out_dir / "gdn_decode.json").write_text(json.dumps(results, indent=1))
    summary(results, say)
    say(f"{'FAILED' if failed else 'all checks ok'} ({time.time() - t0:.0f} s)")
    return 1 if failed else 0


def summary(results: dict, say) -> None:
    say("\n| variant | regs | " + " | ".join(f"B={b} us (of copy) / hot" for b in BATCHES) + " | checks |")
    say("|---|---|" + "---|" * len(BATCHES) + "---|")
    for name, rows in results["times"].items():
        cells = [f"{rows[str(b)]['us']:.2f} ({rows[str(b)]['of_copy']:.0%}) / {rows[str(b)]['hot_us']:.2f}"
                 if str(b) in rows else "-" for b in BATCHES]
        ok = all(r["ok"] for r in results["checks"].get(name, {}).values())
        say(f"| {name} | {results['resources'][name]['regs']} | " + " | ".join(cells) + f" | {'ok' if ok else 'FAIL'} |")


# ---------------------------------------------------------------- CPU smoke run
def small() -> int:
    """The run's checks on tiny shapes with Triton's interpreter (no cupy, no cubins)."""
    global HK, HV, DK, DV, GATE_K, LAYERS, SLOTS, CHECK_LAYER, DEVICE, STATE_TOL
    import torch

    from ninfer_compiler.ops.gdn_decode_fused import L2_EPS, gdn_decode_kernel
    from ninfer_compiler.ops.gdn_gates import SOFTPLUS_THRESHOLD
    from ninfer_compiler.ops.triton_aot import interpreted

    HK, HV, DK, DV, GATE_K, LAYERS, SLOTS, CHECK_LAYER, DEVICE = 2, 4, 16, 128, 96, 2, 6, 1, "cpu"
    STATE_TOL = 1e-2  # the interpreter truncates its bf16 casts (beta one bf16 step off moves a head's state)
    failed, results = 0, {}
    width = HV * DV
    for batch in (1, 5):
        inp = Inputs(batch, seed=batch)
        keep: dict = {}
        for name, (bv, gate_bk, prefetch) in {"whole_w8": (0, 0, False), "c32_w4": (32, 32, False),
                                               "c32_w4_g0_pf": (32, 0, True)}.items():
            def launch(layer, state, out, xq, bv=bv, gate_bk=gate_bk, prefetch=prefetch, inp=inp):
                out32 = out.float()  # the interpreter truncates bf16 stores
                interpreted(gdn_decode_kernel)[(inp.batch, HV)](
                    inp.mixed, inp.wa[layer], inp.wb[layer], inp.h, inp.a_log, inp.dt_bias, inp.z, inp.norm_w, state,
                    inp.slots, inp.lens, out32, layer, SLOTS, 1e-5, xq.view(torch.int8), xq[width * 8:].view(torch.float32),
                    inp.mixed, inp.mixed, 0, HK=HK, HV=HV, DK=DK, DV=DV, Q_SCALE=DK**-0.5, L2_EPS=L2_EPS, SOFTPLUS_T=SOFTPLUS_THRESHOLD,
                    GATE_K=GATE_K, GATE_KP=128, XQ=True, BV=bv, GATE_BK=gate_bk, PREFETCH=prefetch)
                out.copy_(out32.bfloat16())
            failed += not check_one(inp, launch, name, results, print, keep)
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("action", choices=["prepare", "run", "small"])
    parser.add_argument("--out", default="out/gdn-decode")
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    if args.action == "prepare":
        os.environ.pop("TRITON_INTERPRET", None)
        prepare()
        return 0
    if args.action == "small":
        return small()
    return run(Path(args.out), args.reps)


if __name__ == "__main__":
    sys.exit(main())
