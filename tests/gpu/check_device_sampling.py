#!/usr/bin/env python3
"""The draw of sampling requests on the device (`ops/device_sampling.py`) on one GPU: the tokens of
every launch shape against the host's draw, and the GPU time of a call by shape, rows and cuts.

    .venv/bin/python tests/gpu/check_device_sampling.py prepare   # build machine: sm_90a cubins
    python3 tests/gpu/check_device_sampling.py run --out $OUT     # GPU machine: carry .cache/ninfer/device-sampling
    .venv/bin/python tests/gpu/check_device_sampling.py small      # the run's logic on a CPU (interpreter)

Why: a call is 28 to 80 launches whose histogram passes each walk a 248,320-wide row with one
program per (row, slice); a program walks its slice serially, so the slice count sets how many
serial steps a pass takes against how much its combination reads. `prepare` compiles the kernels
in several shapes (`SHAPES`: slices per row, elements a step, warps); `run` launches them through
cupy in the package launcher's order on Qwen3.6-wide float32 rows (flat: std 1, peaked: std 4),
compares each row's token and log-probability with `runtime/sampling.sample` given the same
uniform, and times whole calls inside a CUDA graph (GPU time only: the package's launcher adds
its host time, hidden behind the decode step it follows) and single launches of a first pass, a
late pass and a pass of a decided selection (the launch floor). Prints a table last; writes
`$OUT/device_sampling.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
STAGE = ROOT / ".cache" / "ninfer" / "device-sampling"
VOCAB = 248320
SHAPES = {  # name: (slices per row, elements a step, warps); the package's is s256_b128_w4
    "s64_b128_w4": (64, 128, 4),
    "s128_b128_w4": (128, 128, 4),
    "s256_b128_w4": (256, 128, 4),
    "s512_b128_w4": (512, 128, 4),
    "s256_b256_w8": (256, 256, 8),
    "s512_b64_w2": (512, 64, 2),
}
KINDS = {  # temperature, top_k, top_p, min_p
    "T0.7 p0.9": (0.7, 0, 0.9, 0.0),
    "T1.0": (1.0, 0, 1.0, 0.0),
    "T0.7 k50 p0.95 m0.02": (0.7, 50, 0.95, 0.02),
}
SCALES = {"flat": 1.0, "peaked": 4.0}
ROWS = (1, 8)


def prepare() -> None:
    from ninfer_compiler.ops import device_sampling as ds

    STAGE.mkdir(parents=True, exist_ok=True)
    for old in STAGE.glob("*.cubin"):
        old.unlink()
    index = {}
    for name, (slices, block, warps) in SHAPES.items():
        entry = {}
        for key, img in ds.images("sm_90a", VOCAB, slices=slices, block=block, warps=warps).items():
            (STAGE / f"{name}.{key}.cubin").write_bytes(img.cubin)
            entry[key] = {"file": f"{name}.{key}.cubin", "name": img.name, "shared": img.shared,
                          "threads": img.threads}
        index[name] = entry
        print(f"{name}: {len(entry)} kernels", flush=True)
    (STAGE / "index.json").write_text(json.dumps({"passes": ds.passes(VOCAB), "shapes": index}, indent=1))
    print(f"wrote {len(index)} shapes to {STAGE}")


def _runtime_importable() -> None:
    """`ninfer_runtime` (the repository's runtime/) importable where the project is not installed."""
    try:
        import ninfer_runtime  # noqa: F401
    except ImportError:
        site = Path("/tmp/ninfer-sampling-site")
        site.mkdir(exist_ok=True)
        if not (site / "ninfer_runtime").exists():
            (site / "ninfer_runtime").symlink_to(ROOT / "runtime")
        sys.path.insert(0, str(site))


def selections_of(params: np.ndarray) -> int:
    from ninfer_runtime.sampling import device_selections

    return device_selections(params)


class Buffers:
    """A call's tensors (torch, on `device`), scratch poisoned."""

    def __init__(self, torch, rows: int, slices: int, device: str) -> None:  # noqa: ANN001
        f64, i64 = torch.float64, torch.int64
        self.part_f = torch.full((rows, slices, 4), float("nan"), dtype=f64, device=device)
        self.part_i = torch.full((rows, slices, 4), -7, dtype=i64, device=device)
        self.sf = torch.full((rows, 8), float("nan"), dtype=f64, device=device)
        self.si = torch.full((rows, 8), -5, dtype=i64, device=device)
        self.hist_m = torch.full((rows, slices, 16), float("nan"), dtype=f64, device=device)
        self.hist_c = torch.full((rows, slices, 16), -3, dtype=i64, device=device)
        self.hist_k = torch.full((rows, slices, 16), -3, dtype=i64, device=device)
        self.token = torch.full((rows,), -1, dtype=torch.int32, device=device)
        self.logprob = torch.full((rows,), 7.0, dtype=torch.float32, device=device)


def call(launch, rows: int, slices: int, npass: int, selections: int, logits, params, b: Buffers) -> None:  # noqa: ANN001
    """The launcher's sequence (`device_sampling.LAUNCHER`); `launch(key, grid, args)`."""
    launch("stats", (rows, slices), (logits, params, b.part_f, b.part_i, ("i32", VOCAB)))
    launch("stats_combine", (rows, 1), (params, b.part_f, b.part_i, b.sf, b.si, b.token, b.logprob))
    for stage in range(3):
        if stage < 2 and not selections >> stage & 1:
            continue
        for step in range(npass):
            launch(f"pass{stage}", (rows, slices), (logits, params, b.sf, b.si, b.hist_m, b.hist_c, b.hist_k,
                                                    ("i32", VOCAB), ("i32", step)))
            launch(f"combine{stage}", (rows, 1), (logits, params, b.sf, b.si, b.hist_m, b.hist_c, b.hist_k,
                                                  b.token, b.logprob, ("i32", VOCAB), ("i32", step)))


def host_draws(x: np.ndarray, kind: tuple, us: list[float]) -> tuple[np.ndarray, np.ndarray]:
    import ninfer_runtime.sampling as host

    t, k, p, m = kind
    params = host.SamplingParams(temperature=t, top_k=k, top_p=p, min_p=m)
    tokens, logprobs = [], []
    for row, u in zip(x, us, strict=True):
        real = host.uniform_draw
        host.uniform_draw = lambda seed, position, u=u: u  # noqa: ARG005
        try:
            c = host.sample(row, params, position=0)
        finally:
            host.uniform_draw = real
        tokens.append(c.token)
        logprobs.append(c.logprob)
    return np.array(tokens), np.array(logprobs)


def cases(vocab: int, rows: int) -> dict:
    """(scale, kind) -> (logits [rows, vocab] float32, params [rows, 5], us)."""
    rng = np.random.default_rng(5)
    out = {}
    for scale_name, scale in SCALES.items():
        x = (rng.standard_normal((rows, vocab)) * scale).astype(np.float32)
        for kind_name, kind in KINDS.items():
            us = rng.random(rows).tolist()
            params = np.array([[*kind, u] for u in us], np.float64)
            out[(scale_name, kind_name)] = (x, params, us)
    return out


def run(out_dir: Path, reps: int) -> int:
    import torch

    sys.path.insert(0, str(ROOT / "tests" / "gpu"))
    import cupy as cp
    from cupy_bench import graph_us, run_log

    _runtime_importable()
    out_dir.mkdir(parents=True, exist_ok=True)
    say = run_log(out_dir / "check_device_sampling.log")
    say(f"{torch.cuda.get_device_name()} torch {torch.__version__} cupy {cp.__version__}")
    staged = json.loads((STAGE / "index.json").read_text())
    index, npass = staged["shapes"], staged["passes"]
    results: dict = {"device": torch.cuda.get_device_name(), "shapes": {}, "resources": {}}
    refs = {}
    for (scale, kind), (x, _params, us) in cases(VOCAB, max(ROWS)).items():
        refs[(scale, kind)] = host_draws(x, KINDS[kind], us)
    failed = 0
    for name, entry in index.items():
        slices = SHAPES[name][0]
        fns = {key: cp.RawModule(path=str(STAGE / meta["file"])).get_function(meta["name"])
               for key, meta in entry.items()}
        results["resources"][name] = {k: [f.num_regs, f.local_size_bytes] for k, f in fns.items()}

        def launch(key, grid, args, fns=fns, entry=entry):  # noqa: ANN001, ANN202
            vals = [np.int32(a[1]) if isinstance(a, tuple) else np.uint64(a.data_ptr()) for a in args]
            fns[key]((grid[0], grid[1], 1), (entry[key]["threads"], 1, 1), (*vals, np.uint64(0), np.uint64(0)),
                     shared_mem=entry[key]["shared"])

        shape_res: dict = {"checks": {}, "call_us": {}, "launch_us": {}}
        stream = cp.cuda.Stream(non_blocking=True)
        for (scale, kind), (x, params, _us) in cases(VOCAB, max(ROWS)).items():
            logits = torch.tensor(x, device="cuda")
            for rows in ROWS:
                p = torch.tensor(params[:rows], device="cuda")
                b = Buffers(torch, rows, slices, "cuda")
                sel = selections_of(params[:rows])
                with stream:
                    call(launch, rows, slices, npass, sel, logits, p, b)
                    stream.synchronize()
                tok, lp = b.token.cpu().numpy(), b.logprob.cpu().numpy()
                ref_t, ref_lp = refs[(scale, kind)]
                same = bool((tok == ref_t[:rows]).all()) and bool(np.allclose(lp, ref_lp[:rows], rtol=1e-5, atol=1e-5))
                failed += not same
                shape_res["checks"][f"{scale} {kind} b{rows}"] = same
                if not same:
                    say(f"{name} {scale} {kind} b{rows}: MISMATCH tokens {tok.tolist()} vs {ref_t[:rows].tolist()}")
                us_call = graph_us(lambda i, r=rows, sl=slices, s=sel, lg=logits, pp=p, bb=b:  # noqa: ARG005
                                   call(launch, r, sl, npass, s, lg, pp, bb), 10, reps, stream)
                shape_res["call_us"][f"{scale} {kind} b{rows}"] = us_call
                if kind == "T0.7 p0.9":  # single launches on the state this call left (every selection decided)
                    # (a first pass has every key in play whatever the state; the others return at once)
                    for label, key, step in (("first pass", "pass1", 0), ("decided pass", "pass2", 5),
                                             ("decided combine", "combine1", 5)):
                        grid = (rows, slices) if key.startswith("pass") else (rows, 1)
                        args = ((logits, p, b.sf, b.si, b.hist_m, b.hist_c, b.hist_k, ("i32", VOCAB), ("i32", step))
                                if key.startswith("pass") else
                                (logits, p, b.sf, b.si, b.hist_m, b.hist_c, b.hist_k, b.token, b.logprob,
                                 ("i32", VOCAB), ("i32", step)))
                        shape_res["launch_us"][f"{scale} {label} b{rows}"] = graph_us(
                            lambda i, k=key, g=grid, a=args: launch(k, g, a), 20, reps, stream)  # noqa: ARG005
        results["shapes"][name] = shape_res
        say(f"{name}: checks {sum(shape_res['checks'].values())}/{len(shape_res['checks'])}; "
            + ", ".join(f"{k} {v:.1f}" for k, v in shape_res["call_us"].items()))
        (out_dir / "device_sampling.json").write_text(json.dumps(results, indent=1))
    _table(results, say)
    say(f"overall: {'PASS' if failed == 0 else f'FAIL ({failed})'}")
    return 1 if failed else 0


def _table(results: dict, say) -> None:  # noqa: ANN001
    say("")
    say(f"device: {results['device']}; GPU us per call (CUDA graph of 10 calls, median), single launches")
    cols = [f"{s} {k} b{r}" for s in SCALES for k in KINDS for r in ROWS]
    say("shape | " + " | ".join(cols))
    for name, r in results["shapes"].items():
        say(f"{name} | " + " | ".join(f"{r['call_us'].get(c, float('nan')):.1f}" for c in cols))
    lcols = sorted({k for r in results["shapes"].values() for k in r["launch_us"]})
    say("shape | " + " | ".join(lcols))
    for name, r in results["shapes"].items():
        say(f"{name} | " + " | ".join(f"{r['launch_us'].get(c, float('nan')):.1f}" for c in lcols))


def small() -> int:
    """The run's sequence and checks on a narrow vocabulary in Triton's interpreter (no GPU)."""
    global VOCAB
    os.environ["TRITON_INTERPRET"] = "1"  # before Triton is imported: the kernels' helpers interpreted too
    import torch

    from ninfer_compiler.ops import device_sampling as ds
    from ninfer_compiler.ops.triton_aot import interpreted

    VOCAB = 3000
    kernels = {"stats": ds.stats_kernel, "stats_combine": ds.stats_combine_kernel,
               **{f"pass{s}": ds.pass_kernel for s in range(3)}, **{f"combine{s}": ds.combine_kernel for s in range(3)}}
    failed = 0
    for name, (slices, block, _warps) in {"s4_b128": (4, 128, 4), "s8_b64": (8, 64, 2)}.items():
        shape = {"NPASS": ds.passes(VOCAB), "IDX_BITS": ds.index_bits(VOCAB), "SLICES": slices, "DIGIT": ds.DIGIT}

        def launch(key, grid, args, block=block, shape=shape, slices=slices):  # noqa: ANN001, ANN202
            vals = [a[1] if isinstance(a, tuple) else a for a in args]
            if key == "stats":
                const = {"SLICES": slices, "BLOCK": block}
            elif key == "stats_combine":
                const = {"SLICES": slices}
            else:
                const = {**shape, "STAGE": int(key[-1]), **({"BLOCK": block} if key.startswith("pass") else {})}
            interpreted(kernels[key])[(grid[0], grid[1]) if grid[1] > 1 else (grid[0],)](*vals, **const)

        for (scale, kind), (x, params, us) in cases(VOCAB, 3).items():
            b = Buffers(torch, 3, slices, "cpu")
            call(launch, 3, slices, shape["NPASS"], selections_of(params), torch.tensor(x), torch.tensor(params), b)
            ref_t, _ = host_draws(x, KINDS[kind], us)
            same = bool((b.token.numpy() == ref_t).all())
            failed += not same
            print(f"{name} {scale} {kind}: {'ok' if same else 'MISMATCH'}", flush=True)
    print(f"overall: {'PASS' if failed == 0 else 'FAIL'}")
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["prepare", "run", "small"])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/device-sampling")))
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()
    if args.action == "prepare":
        os.environ.pop("TRITON_INTERPRET", None)
        start = time.perf_counter()
        prepare()
        print(f"prepared in {time.perf_counter() - start:.0f} s")
        return 0
    if args.action == "small":
        return small()
    return run(args.out, args.reps)


if __name__ == "__main__":
    sys.exit(main())
