#!/usr/bin/env python3
"""Prefill attention (`ops/attention_prefill.py`) on the H200: numerics, TFLOP/s, against torch SDPA.

    # build machine: the AOT images a package would embed (sm_90a cubins, one per tile config)
    .venv/bin/python tests/gpu/check_attention_prefill.py prepare
    # GPU machine (torch, triton, cupy; no TVM): carry .cache/ninfer/attention-prefill-check
    python3 tests/gpu/check_attention_prefill.py run --out $OUT

`run` fills a two-layer pool (27B shapes: 24 query heads, 4 KV heads, head dim 256, page size 16)
with random bf16 K/V, scatters each sequence's pages (shuffled page table), and runs layer 1 with
the Triton kernel JIT-compiled there and with the staged AOT cubins (launched through cupy like the
package's launcher launches them). Outputs start as NaN; a subset of query rows (first, last and
random ones, all heads) is compared with float64 attention. Times are CUDA-event medians; FLOPs
are the causal ones, 4 * D * Hq * (keys attended, summed over the queries), for the kernel and
for torch SDPA on contiguous K/V (heads expanded) measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STAGE = ROOT / ".cache" / "ninfer" / "attention-prefill-check"
HQ, HKV, D, PS = 24, 4, 256, 16
# (BLOCK_M, BLOCK_N, num_warps, num_stages) tried on the device; the first is the shipped sm_90a one
TILES = [(128, 64, 8, 2), (128, 32, 8, 3), (64, 32, 4, 3), (64, 64, 4, 2)]
# (sequences' context lengths, new tokens per sequence)
CASES = [
    ([0], 1024),
    ([6656], 1024),  # last 1,024-token chunk of a 7,680-token prompt
    ([0], 7680),
    ([0], 8192),
    ([57344], 8192),  # last 8,192-token chunk of a 65,536-token prompt
]
CHECK_CASES = [([0, 700, 3001], 1000)]  # several sequences, T not a multiple of any tile


def prepare() -> None:
    """AOT images of every tile config, as `package` would build them (Triton of this machine)."""
    sys.path.insert(0, str(ROOT))
    from ninfer_compiler.ops import attention_prefill as ap
    from ninfer_compiler.ops.triton_aot import compile_kernel

    STAGE.mkdir(parents=True, exist_ok=True)
    index = {}
    for tile in TILES:
        bm, bn, warps, stages = tile
        img = compile_kernel(
            ap.prefill_kernel,
            signature={"q_ptr": "*bf16", "kv_ptr": "*bf16", "pages_ptr": "*i32", "lens_ptr": "*i32",
                       "o_ptr": "*bf16", "T": "i32", "P": "i32", "qk_scale": "fp32"},
            constants={"HQ": HQ, "HKV": HKV, "D": D, "PS": PS, "BLOCK_M": bm, "BLOCK_N": bn, "F32_DOT": False},
            arch="sm_90a", num_warps=warps, num_stages=stages)
        key = "_".join(map(str, tile))
        (STAGE / f"{key}.cubin").write_bytes(img.cubin)
        index[key] = {"name": img.name, "shared": img.shared, "threads": img.threads}
        print(f"{key}: {img.name} shared={img.shared} threads={img.threads}")
    (STAGE / "index.json").write_text(json.dumps(index, indent=1))


def run(out: Path) -> None:
    import numpy as np
    import torch

    sys.path.insert(0, str(ROOT))
    from ninfer_compiler.ops import attention_prefill as ap

    out.mkdir(parents=True, exist_ok=True)
    log = open(out / "check_attention_prefill.log", "w")  # noqa: SIM115 (whole run)

    def say(msg: str) -> None:
        print(msg, flush=True)
        log.write(msg + "\n")
        log.flush()

    dev = torch.device("cuda")
    say(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {__import__('triton').__version__}")
    scale = 1.0 / math.sqrt(D)

    aot = {}
    index_path = STAGE / "index.json"
    if index_path.exists():
        try:
            import cupy as cp

            for key, meta in json.loads(index_path.read_text()).items():
                module = cp.RawModule(path=str(STAGE / f"{key}.cubin"))
                fn = module.get_function(meta["name"])
                fn.max_dynamic_shared_size_bytes = meta["shared"]
                aot[key] = (fn, meta, module)
        except Exception as err:  # report and go on with the JIT kernel
            say(f"AOT images not loaded: {err!r}")

    def make(lens: list[int], t: int, seed: int):
        gen = torch.Generator(device=dev).manual_seed(seed)
        b = len(lens)
        per_seq = -(-(max(lens) + t) // PS)
        num_pages = b * per_seq + 7
        table = torch.randperm(num_pages, device=dev, generator=gen)[: b * per_seq].view(b, per_seq)
        pool = torch.randn(2, num_pages, 2, HKV, PS, D, device=dev, generator=gen, dtype=torch.bfloat16)
        q = torch.randn(b, t, HQ, D, device=dev, generator=gen, dtype=torch.bfloat16)
        return q, pool, table.to(torch.int32).contiguous(), torch.tensor(lens, dtype=torch.int32, device=dev)

    def dense_kv(pool, table, s: int, n: int):
        pos = torch.arange(n, device=dev)
        page = table[s, pos // PS].long()
        return pool[1][page, 0, :, pos % PS], pool[1][page, 1, :, pos % PS]  # [n, HKV, D]

    def check(o, q, pool, table, lens, rows_per_seq: int = 48) -> float:
        """max |o - ref| / max |ref| over sampled rows (float64 reference), all heads."""
        worst = 0.0
        t = q.shape[1]
        rng = np.random.default_rng(0)
        for s in range(q.shape[0]):
            ctx = int(lens[s])
            k, v = dense_kv(pool, table, s, ctx + t)
            rows = sorted({0, t - 1, *rng.integers(0, t, rows_per_seq).tolist()})
            rows_t = torch.tensor(rows, device=dev)
            pos = torch.arange(ctx + t, device=dev)
            visible = pos[None, :] <= (ctx + rows_t)[:, None]
            for h in range(HQ):
                sc = (q[s, rows_t, h].double() @ k[:, h // (HQ // HKV)].double().T) * scale
                sc = sc.masked_fill(~visible, float("-inf"))
                ref = torch.softmax(sc, -1) @ v[:, h // (HQ // HKV)].double()
                got = o[s, rows_t, h].double()
                if not torch.isfinite(got).all():
                    return float("inf")
                worst = max(worst, ((got - ref).abs().max() / ref.abs().max()).item())
        return worst

    def launch_aot(key, q, pool, table, lens, o):
        import numpy as np

        fn, meta, _ = aot[key]
        bm = int(key.split("_")[0])
        b, t = q.shape[0], q.shape[1]
        args = (np.uint64(q.data_ptr()), np.uint64(pool[1].data_ptr()), np.uint64(table.data_ptr()),
                np.uint64(lens.data_ptr()), np.uint64(o.data_ptr()), np.int32(t), np.int32(table.shape[1]),
                np.float32(ap.qk_scale(D, None)), np.uint64(0), np.uint64(0))
        fn((HQ, -(-t // bm), b), (meta["threads"], 1, 1), args, shared_mem=meta["shared"])

    def timed(fn, budget_s: float = 0.6) -> float:
        fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        est = time.perf_counter() - t0
        reps = max(3, min(20, int(budget_s / max(est, 1e-5))))
        times = []
        for _ in range(reps):
            a, z = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            z.record()
            z.synchronize()
            times.append(a.elapsed_time(z))
        return float(np.median(times))

    def flops(lens: list[int], t: int) -> float:
        return 4.0 * D * HQ * sum(t * (c + 1) + t * (t - 1) / 2 for c in lens)

    rows = []

    def kernel_case(lens: list[int], t: int, timing: bool) -> None:
        q, pool, table, lens_t = make(lens, t, seed=t + sum(lens))
        tag = f"ctx={'/'.join(map(str, lens))} T={t}"
        fl = flops(lens, t)
        for tile in TILES:
            key = "_".join(map(str, tile))
            variants = [("jit", lambda o, tile=tile: ap.run_torch(q, pool[1], table, lens_t, out=o, block=tile))]
            if key in aot:
                variants.append(("aot", lambda o, key=key: launch_aot(key, q, pool, table, lens_t, o)))
            for kind, fn in variants:
                o = torch.full_like(q, float("nan"))
                try:
                    fn(o)
                    torch.cuda.synchronize()
                    err = check(o, q, pool, table, lens_t) if torch.isfinite(o).all() else float("inf")
                    ms = timed(lambda fn=fn, o=o: fn(o)) if timing else float("nan")
                except Exception as exc:  # a config may not compile or launch; report it
                    say(f"{tag} {kind} {key}: error {exc!r}"[:400])
                    continue
                tf = fl / (ms * 1e-3) / 1e12 if timing else float("nan")
                say(f"{tag} {kind} {key}: rel err {err:.2e} {ms:.3f} ms {tf:.1f} TFLOP/s")
                rows.append((tag, f"{kind} {key}", err, ms, tf))
        if timing and len(lens) == 1:
            sdpa_case(q, pool, table, lens_t, lens[0], t, tag, fl)

    def sdpa_case(q, pool, table, lens_t, ctx: int, t: int, tag: str, fl: float) -> None:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.nn.attention.bias import causal_lower_right

        k, v = dense_kv(pool, table, 0, ctx + t)
        kq = k.permute(1, 0, 2).repeat_interleave(HQ // HKV, 0)[None].contiguous()
        vq = v.permute(1, 0, 2).repeat_interleave(HQ // HKV, 0)[None].contiguous()
        qq = q.permute(0, 2, 1, 3).contiguous()
        sdpa = torch.nn.functional.scaled_dot_product_attention
        mask = None if ctx == 0 else causal_lower_right(t, ctx + t)

        def call():
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
                if mask is None:
                    return sdpa(qq, kq, vq, is_causal=True)
                return sdpa(qq, kq, vq, attn_mask=mask)

        try:
            ref = call().permute(0, 2, 1, 3).contiguous()
            err = check(ref, q, pool, table, lens_t, rows_per_seq=16)
            ms = timed(call)
        except Exception as exc:
            say(f"{tag} sdpa: error {exc!r}"[:400])
            return
        tf = fl / (ms * 1e-3) / 1e12
        say(f"{tag} sdpa: rel err {err:.2e} {ms:.3f} ms {tf:.1f} TFLOP/s")
        rows.append((tag, "torch sdpa", err, ms, tf))

    # numerics first (several sequences), then the timed cases
    for lens, t in CHECK_CASES:
        kernel_case(lens, t, timing=False)
    for lens, t in CASES:
        kernel_case(lens, t, timing=True)
        torch.cuda.empty_cache()

    say("")
    say(f"{'case':<22} {'variant':<20} {'rel err':>9} {'ms':>9} {'TFLOP/s':>8}")
    for tag, var, err, ms, tf in rows:
        say(f"{tag:<22} {var:<20} {err:>9.2e} {ms:>9.3f} {tf:>8.1f}")
    log.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("prepare")
    r = sub.add_parser("run")
    r.add_argument("--out", type=Path, default=Path("out/attention-prefill-check"))
    args = parser.parse_args()
    if args.cmd == "prepare":
        prepare()
    else:
        run(args.out)


if __name__ == "__main__":
    main()
