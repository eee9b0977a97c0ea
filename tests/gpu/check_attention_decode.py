#!/usr/bin/env python3
"""Split-KV decode attention (`ops/attention_decode.py`) on one GPU: numerics and speed.

    .venv/bin/python tests/gpu/check_attention_decode.py prepare   # build machine: AOT cubins
    python3 tests/gpu/check_attention_decode.py run --out $OUT     # GPU: torch + triton (+ cupy), no TVM

`prepare` writes the sm_90a images the package embeds (`attention_decode.images`) to `STAGE`;
`run` launches those cubins through cupy (the shipped code path: same parameters, two null
scratch pointers) and runs the Triton kernels directly (JIT) on random bf16 pools with shuffled pages, 27B shapes
(Hq 24, Hkv 4, D 256, page 16), contexts 1..65,536 at batch 1 and 8 plus a mixed batch. Every
launch configuration is checked against a float64 torch reference (outputs and workspace
poisoned with NaN first), then timed inside a CUDA graph of `CALLS` steps that rotate over
page tables pointing at different pages (so short contexts are not all served from L2); the
median of the replays is reported with the KV bytes read per call and the rate against a
measured device copy (read + write). Prints a table last.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from ninfer_compiler.ops import attention_decode as ad  # noqa: E402

HQ, HKV, D, PS = 24, 4, 256, 16
CASES = [(1, [n]) for n in (1, 64, 1000, 8192, 65536)] + [(8, [n] * 8) for n in (1, 64, 1000, 8192, 65536)]
CASES.append((8, [1, 64, 1000, 8192, 65536, 300, 5000, 20000]))
# (keys per step, warps, pipeline stages, max splits, target programs); the first is the module's default
CONFIGS = [(ad.BLOCK_N, ad.NUM_WARPS, ad.NUM_STAGES, ad.MAX_SPLITS, ad.TARGET), (32, 4, 3, 128, 264),
           (32, 4, 3, 128, 1056), (32, 4, 3, 64, 528), (32, 4, 3, 32, 528), (64, 8, 3, 128, 528),
           (16, 4, 3, 128, 528), (32, 4, 2, 128, 528)]
CALLS = 20  # steps per captured graph
REPLAYS = 10
ROTATE_BYTES = 512 << 20  # aim for this much distinct KV across the rotated page tables
STAGE = ROOT / ".cache" / "ninfer" / "attention-decode-check"


def prepare() -> None:
    """The AOT images for the 27B shape on sm_90a, with their launch metadata."""
    STAGE.mkdir(parents=True, exist_ok=True)
    meta = {}
    for role, image in zip(("split", "combine"), ad.images("sm_90a", HQ, HKV, D, PS), strict=True):
        (STAGE / f"{role}.cubin").write_bytes(image.cubin)
        meta[role] = {"name": image.name, "shared": image.shared, "threads": image.threads}
    (STAGE / "meta.json").write_text(json.dumps(meta))
    print(f"wrote {STAGE}: {meta}")


def aot_launcher(combine: bool = True):
    """`call(q, pool, table, lens, ws, o)` through the staged cubins (cupy), or None without them.

    `combine=False` launches the split kernel alone (its share of the time; the output is unset).
    """
    try:
        import cupy
        import numpy as np
    except ImportError:
        return None
    if not (STAGE / "meta.json").exists():
        return None
    meta = json.loads((STAGE / "meta.json").read_text())
    fns = {}
    for role in ("split", "combine"):
        module = cupy.RawModule(path=str(STAGE / f"{role}.cubin"))
        fns[role] = module.get_function(meta[role]["name"])
    null = np.uint64(0)
    scale = np.float32(ad.LOG2E / math.sqrt(D))

    def call(q, pool, table, lens, ws, o):
        ptr = [np.uint64(t.data_ptr()) for t in (q, pool, table, lens, ws, o)]
        with cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
            m = meta["split"]
            fns["split"]((ad.MAX_SPLITS, HKV, q.shape[0]), (m["threads"], 1, 1),
                         (*ptr[:5], np.int32(table.shape[1]), scale, null, null), shared_mem=m["shared"])
            m = meta["combine"]
            if not combine:
                return o
            fns["combine"]((HQ, q.shape[0], 1), (m["threads"], 1, 1), (ptr[4], ptr[3], ptr[5], null, null),
                           shared_mem=m["shared"])
        return o

    return call


def copy_bandwidth() -> float:
    """GB/s of a 1 GiB device-to-device copy, read + write counted."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    times = []
    for _ in range(12):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return 2 * src.numel() / statistics.median(times[2:]) / 1e9


def make_case(batch: int, lengths: list[int], gen: torch.Generator):
    """Pool, rotated page tables (pages shuffled), `seq_lens = length - 1`, q."""
    pages_per = [-(-n // PS) for n in lengths]
    needed = sum(pages_per)
    page_bytes = 2 * HKV * PS * D * 2
    rotations = max(1, min(CALLS, -(-ROTATE_BYTES // (needed * page_bytes))))
    total = needed * rotations
    pool = torch.randn((total, 2, HKV, PS, D), generator=gen, device="cuda", dtype=torch.float32).to(torch.bfloat16)
    width = max(pages_per)
    perm = torch.randperm(total, generator=gen, device="cuda").to(torch.int32)
    tables, at = [], 0
    for _ in range(rotations):
        table = torch.zeros((batch, width), dtype=torch.int32, device="cuda")
        for b, n in enumerate(pages_per):
            table[b, :n] = perm[at:at + n]
            at += n
        tables.append(table)
    lens = torch.tensor([n - 1 for n in lengths], dtype=torch.int32, device="cuda")
    q = torch.randn((batch, 1, HQ, D), generator=gen, device="cuda").to(torch.bfloat16)
    return pool, tables, lens, q


def reference(pool, table, lens, q) -> torch.Tensor:
    """float64 attention of each sequence's token over keys 0..seq_lens[b]."""
    out = torch.empty(q.shape, dtype=torch.float64, device="cuda")
    g = HQ // HKV
    for b in range(q.shape[0]):
        n = int(lens[b]) + 1
        j = torch.arange(n, device="cuda")
        rows = pool[table[b, j // PS].long(), :, :, j % PS]  # [n, 2, Hkv, D]
        k, v = rows[:, 0].double(), rows[:, 1].double()
        qq = q[b, 0].double().view(HKV, g, D)
        s = torch.einsum("hgd,nhd->hgn", qq, k) / math.sqrt(D)
        out[b, 0] = torch.einsum("hgn,nhd->hgd", torch.softmax(s, -1), v).reshape(HQ, D)
    return out


def run_config(cfg, pool, tables, lens, q, ref, aot=None):
    bn, nw, st, ns, target = cfg
    ws = torch.full((q.shape[0], ad.workspace_width(HQ, D, ns)), float("nan"), device="cuda")
    out = torch.full_like(q, float("nan"))

    def call(table):
        if aot is not None:
            return aot(q, pool, table, lens, ws, out)
        return ad.launch_torch(q, pool, table, lens, 1.0 / math.sqrt(D), ws, out, splits=ns, target=target,
                               block_n=bn, num_warps=nw, num_stages=st)[0]

    o = call(tables[0])
    torch.cuda.synchronize()
    err = (o.double() - ref).abs().max().item() / ref.abs().max().item()
    finite = bool(torch.isfinite(o).all())
    for t in tables:
        call(t)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            for i in range(CALLS):
                call(tables[i % len(tables)])
    torch.cuda.synchronize()
    times = []
    for _ in range(REPLAYS):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / CALLS)
    return err, finite, statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["prepare", "run"])
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--quick", action="store_true", help="default config only")
    parser.add_argument("--budget", type=float, default=120.0, help="seconds after which the sweep stops")
    args = parser.parse_args()
    if args.mode == "prepare":
        prepare()
        return
    args.out.mkdir(parents=True, exist_ok=True)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    log = open(args.out / "attention_decode.log", "w")  # noqa: SIM115

    def say(msg: str) -> None:
        print(msg, flush=True)
        log.write(msg + "\n")
        log.flush()

    say(f"device {torch.cuda.get_device_name()} torch {torch.__version__}")
    copy = copy_bandwidth()
    say(f"copy bandwidth (read+write) {copy:.0f} GB/s")
    gen = torch.Generator(device="cuda")
    gen.manual_seed(7)
    configs = CONFIGS[:1] if args.quick else list(CONFIGS)
    aot, aot_split = aot_launcher(), aot_launcher(combine=False)
    say(f"AOT cubins: {'launched through cupy' if aot else 'not staged or no cupy: skipped'}")
    results = []
    start = time.time()
    for batch, lengths in CASES:
        if time.time() - start > args.budget:
            configs = CONFIGS[:1]  # keep the default and the AOT images; drop the sweep
        t0 = time.time()
        pool, tables, lens, q = make_case(batch, lengths, gen)
        ref = reference(pool, tables[0], lens, q)
        kv_bytes = sum(lengths) * HKV * D * 2 * 2
        runs = [("jit", cfg, None) for cfg in configs]
        runs += [("aot", CONFIGS[0], aot), ("aot-split-only", CONFIGS[0], aot_split)] if aot else []
        for kind, cfg, launcher in runs:
            try:
                err, finite, us = run_config(cfg, pool, tables, lens, q, ref, launcher)
            except Exception as e:  # noqa: BLE001 (a config Triton refuses is reported, not fatal)
                say(f"B={batch} lens={lengths} cfg={cfg}: failed {type(e).__name__}: {str(e)[:200]}")
                continue
            row = {"kind": kind, "batch": batch, "lengths": lengths, "cfg": cfg, "rel_err": err, "finite": finite, "us": us,
                   "kv_mb": kv_bytes / 1e6, "gbps": kv_bytes / us / 1e3}
            results.append(row)
            say(json.dumps(row))
        say(f"case B={batch} done in {time.time() - t0:.1f}s")
        del pool, tables
        torch.cuda.empty_cache()
    (args.out / "attention_decode.json").write_text(json.dumps({"copy_gbps": copy, "rows": results}, indent=1))
    checked = [r for r in results if r["kind"] != "aot-split-only"]
    ok = all(r["finite"] and r["rel_err"] < 2e-2 for r in checked)
    say("")
    say(f"numerics: {'ok' if ok else 'FAILED'} (max err / max |ref| <= 2e-2 everywhere; "
        f"worst {max(r['rel_err'] for r in checked):.2e})")
    say("per case: fastest launch configuration (all in the log)")
    for batch, lengths in CASES:
        rows = [r for r in results if r["batch"] == batch and r["lengths"] == lengths and r["kind"] == "jit"]
        if rows:
            best = min(rows, key=lambda r: r["us"])
            say(f"  B={batch} {_lens(lengths)}: {tuple(best['cfg'])} {best['us']:.1f} us")
    say(f"{'kind':>14} {'batch':>5} {'lengths':>8} {'us':>9} {'KV MB':>8} {'GB/s':>7} {'% copy':>7} {'err':>8}")
    for r in results:
        if r["kind"] != "jit" or tuple(r["cfg"]) == CONFIGS[0]:
            say(f"{r['kind']:>14} {r['batch']:>5} {_lens(r['lengths']):>8} {r['us']:>9.1f} {r['kv_mb']:>8.2f} "
                f"{r['gbps']:>7.0f} {100 * r['gbps'] / copy:>6.0f}% {r['rel_err']:>8.1e}")


def _lens(lengths: list[int]) -> str:
    return str(lengths[0]) if len(set(lengths)) == 1 else "mixed"


if __name__ == "__main__":
    main()
