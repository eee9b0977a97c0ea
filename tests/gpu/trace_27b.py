#!/usr/bin/env python3
"""Where one Qwen3.6-27B-shaped decode step's time goes inside its CUDA graph, kernel by kernel.

ncu times kernels one at a time, so it cannot show what the PDL chain overlaps. This traces the real
graph: CUPTI's kernel records (through torch.profiler, in the same process as TVM's runtime) give
each kernel's start and end on the GPU clock. Per kernel kind it reports the duration and the
*advance*: how far the kernel moves the step's last end (end minus the latest end of the kernels
launched before it); the advances add up to the step time, so they are each kind's share of the
critical path, overlap included. `lead` is how early a kernel starts before its predecessor ends
(its PDL prologue: weight copies, state reads), `idle` how long the GPU ran nothing before it.

    # build machine: the packages, as for bench_27b.py
    .venv/bin/python tests/gpu/bench_27b.py prepare --folder /tmp/perf --recipes groupwise-int
    # GPU machine (carry .cache/ninfer/perf-27b); NINFER_TRACE_PACKAGES: pkg and/or pkg-var-NAME
    python3 tests/gpu/trace_27b.py --out $OUT/trace [--concurrency 1,8] [--steps 5] [--prefill 7680]

`--rounds N` traces the packages N times, the order reversed every other round, and prints each
package's step time per round last: the package traced first on a machine has measured up to 1%
off its own time in a later position, the size of the differences an A/B looks for.
Each package's median step is also written kernel by kernel (`timeline-PKG-C.csv` beside
trace.json: kind, grid, start, duration, advance, lead, gap), the view in which one projection's launches
can be told apart by their place in a layer; the tables add the decode GEMVs by the kernel launched
before each.
`--budget SECONDS` starts no package trace that would end past that many seconds of tracing (judged by the
longest trace so far) and prints the tables of what it traced: set it under the device call's limit.
`--engine` also times the engine generating greedily and sampling (`bench_27b.engine_token_ms`)
with the first package, untraced. `--prefill N` also traces the prefill of an N-token prompt (one chunk up to the package's prefill
chunk, 8,192 tokens), all of its kernels as one timeline, median of 3 after a warm-up: the
per-kernel breakdown of a prefill chunk on the real 64 layers.

Prints a table per package and concurrency (and prefill) last; writes `trace.json` (per kind) under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_27b  # noqa: E402  (paths and the runtime staging of the benchmark)

GAP_US = 30.0  # kernels further apart than this belong to different steps (steps are synchronised)


def kind(name: str, grid: list | None = None) -> str:
    """A kernel's kind: its symbol without TVM's fused-function suffixes; the decode GEMVs also by
    grid size (one launch shape per projection)."""
    base = name.split("(")[0].strip()
    for cut in ("_kernel", "_compute_"):
        if cut in base and not base.startswith("ninfer_"):
            base = base.split(cut)[0]
    if base.startswith("ninfer_qgemv") and grid:
        base = f"{base} [{grid[0]}]"
    return base[:60]


def split_steps(kernels: list[dict]) -> list[list[dict]]:
    steps: list[list[dict]] = []
    last_end = None
    for k in sorted(kernels, key=lambda k: k["ts"]):
        if last_end is None or k["ts"] - last_end > GAP_US:
            steps.append([])
        steps[-1].append(k)
        last_end = k["ts"] + k["dur"] if last_end is None else max(last_end, k["ts"] + k["dur"])
    return steps


def timeline(step: list[dict]) -> list[dict]:
    """One step's kernels in start order: kind, grid, start (us from the step's first kernel),
    duration, advance (how far it moves the latest end so far), lead (how early it starts before
    that end) and gap (how long the GPU ran nothing before it): the per-launch view of a step."""
    rows = []
    latest = None
    t0 = min(k["ts"] for k in step)
    for k in sorted(step, key=lambda k: k["ts"]):
        end = k["ts"] + k["dur"]
        grid = k.get("args", {}).get("grid")
        rows.append({"kind": kind(k["name"], grid), "grid": "x".join(map(str, grid or [])),
                     "start_us": k["ts"] - t0, "dur_us": k["dur"],
                     "advance_us": k["dur"] if latest is None else max(0.0, end - latest),
                     "lead_us": 0.0 if latest is None else max(0.0, latest - k["ts"]),
                     "gap_us": 0.0 if latest is None else max(0.0, k["ts"] - latest)})
        latest = end if latest is None else max(latest, end)
    return rows


def analyse(step: list[dict]) -> dict:
    """Per kind: launches, total duration, total advance, lead and gap (us) of one step."""
    out: dict = {}
    rows = timeline(step)
    for r in rows:
        row = out.setdefault(r["kind"], {"n": 0, "dur": 0.0, "advance": 0.0, "lead": 0.0, "gap": 0.0})
        row["n"] += 1
        row["dur"] += r["dur_us"]
        row["advance"] += r["advance_us"]
        row["lead"] += r["lead_us"]
        row["gap"] += r["gap_us"]
    return {"span_us": max(r["start_us"] + r["dur_us"] for r in rows), "kinds": out}


def by_predecessor(rows: list[dict]) -> dict:
    """The decode GEMVs of a timeline by the kernel launched before each: one projection shape can
    follow different kernels (the q5 output projections follow the GDN step or the attention
    combine), and what runs before a PDL launch decides where its blocks can start."""
    out: dict = {}
    for prev, row in zip(rows, rows[1:], strict=False):
        if row["kind"].startswith("ninfer_qgemv"):
            entry = out.setdefault(f"{row['kind']} after {prev['kind']}", {"n": 0, "advance": 0.0, "dur": 0.0})
            entry["n"] += 1
            entry["advance"] += row["advance_us"]
            entry["dur"] += row["dur_us"]
    return out


def timeline_csv(rows: list[dict]) -> str:
    fields = ["kind", "grid", "start_us", "dur_us", "advance_us", "lead_us", "gap_us"]
    def cell(v: object) -> str:
        return f"{v:.2f}" if isinstance(v, float) else str(v)
    return "\n".join([",".join(fields), *(",".join(cell(r[f]) for f in fields) for r in rows)]) + "\n"


def host_phases(runner, step_fn, seqs, tokens, steps: int = 30) -> dict:  # noqa: ANN001
    """Wall time of a decode step as `ninfer bench` takes it (host to host), and the host calls in
    it: the graph inputs' upload, the graph function's call (which returns once the graph is queued)
    and everything before the read-back of the chosen tokens (which waits for the GPU)."""
    import time

    import ninfer_runtime.runner as rmod

    spent = {"write": 0.0, "call": 0.0, "queued": 0.0}
    write, call, decode = rmod._GraphInputs.step, runner._decode_graph, runner._decode

    def timed(key, fn):  # noqa: ANN001, ANN202
        def wrapper(*a):  # noqa: ANN002, ANN202
            t = time.perf_counter()
            try:
                return fn(*a)
            finally:
                spent[key] += time.perf_counter() - t
        return wrapper

    rmod._GraphInputs.step = timed("write", write)
    runner._decode_graph = timed("call", call)
    runner._decode = timed("queued", decode)
    walls = []
    try:
        for _ in range(steps):
            t = time.perf_counter()
            step_fn(seqs, tokens())
            walls.append(time.perf_counter() - t)
    finally:
        rmod._GraphInputs.step = write
        runner._decode_graph = call
        del runner._decode  # back to the class's method
    result = {"wall_us": statistics.median(walls) * 1e6, **{f"{k}_us": v / steps * 1e6 for k, v in spent.items()}}
    if runner.device_greedy:  # greedy generation as the engine queues it (`ninfer bench`'s step)
        from ninfer_runtime.bench import queued_step_seconds

        result["queued_wall_us"] = statistics.median(queued_step_seconds(runner, seqs, tokens(), steps) for _ in range(3)) * 1e6
    return result


def _kernel_records(prof, path: Path) -> list[dict]:  # noqa: ANN001
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    return [e for e in events if e.get("cat") == "kernel" and "dur" in e]


def trace_prefill(runner, rng, vocab: int, prompt_len: int, repeats: int = 3) -> dict:  # noqa: ANN001
    """One prompt's prefill, every kernel of it one timeline (the host may leave gaps: they are
    the `idle` column), after a warm-up prefill of the same length; the median of `repeats`."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    per = []
    for i in range(repeats + 1):
        seq = runner.pool.acquire()
        try:
            tokens = rng.integers(2, vocab, prompt_len)
            torch.cuda.synchronize()
            if i == 0:  # warm-up: first-call costs stay out of the measurement
                runner.prefill(seq, tokens)
                torch.cuda.synchronize()
                continue
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                runner.prefill(seq, tokens)
                torch.cuda.synchronize()
        finally:
            runner.pool.release(seq)
        kernels = _kernel_records(prof, Path("/tmp") / f"trace-prefill-{i}.json")
        if not kernels:
            raise SystemExit("prefill: no kernel records in the trace")
        per.append((analyse(kernels), len(kernels)))
    order = sorted(per, key=lambda p: p[0]["span_us"])
    best, n = order[len(order) // 2]
    return {"prompt_len": prompt_len, "spans_us": [p[0]["span_us"] for p in per], "median": best,
            "kernels_per_step": n}


def trace_package(pkg: Path, artifact: Path, concurrency: list[int], n_steps: int, prefill_len: int = 0,
                  engine: bool = False) -> dict:
    import numpy as np
    import torch
    from torch.profiler import ProfilerActivity, profile

    from ninfer_runtime.runner import ModelRunner, RunnerOptions

    runner = ModelRunner(pkg, artifact=artifact, options=RunnerOptions(max_active=8, context_bytes=24 << 30))
    if prefill_len > runner.prefill_chunk:  # (before any tracing: a bad flag costs no GPU time)
        raise SystemExit(f"--prefill {prefill_len}: more than one chunk of {pkg.name} ({runner.prefill_chunk} tokens)")
    rng = np.random.default_rng(0)
    vocab = min(runner.manifest.raw["model"]["vocab_size"], 1 << 15)
    step_fn = runner.decode_greedy if runner.device_greedy else runner.decode
    result: dict = {}
    for c in concurrency:
        seqs = [runner.pool.acquire() for _ in range(c)]
        try:
            for s in seqs:
                runner.prefill(s, rng.integers(2, vocab, 64))
            for _ in range(3):
                step_fn(seqs, rng.integers(2, vocab, c))
            host = host_phases(runner, step_fn, seqs, lambda c=c: rng.integers(2, vocab, c))
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(n_steps):
                    step_fn(seqs, rng.integers(2, vocab, c))
                    torch.cuda.synchronize()
        finally:
            for s in seqs:
                runner.pool.release(s)
        kernels = _kernel_records(prof, Path("/tmp") / f"trace-{pkg.name}-{c}.json")
        steps = [s for s in split_steps(kernels) if len(s) > 50]  # a decode step has hundreds of kernels
        if not steps:
            raise SystemExit(f"{pkg.name}: no decode step in the trace ({len(kernels)} kernel records); "
                             "does CUPTI see the graph's kernels?")
        per = [analyse(s) for s in steps]
        middle = sorted(range(len(per)), key=lambda i: per[i]["span_us"])[len(per) // 2]  # the median step
        result[str(c)] = {"spans_us": [p["span_us"] for p in per], "median": per[middle],
                          "kernels_per_step": len(steps[0]), "host": host, "timeline": timeline(steps[middle])}
        result[str(c)]["projections"] = by_predecessor(result[str(c)]["timeline"])
    if prefill_len:
        result["prefill"] = trace_prefill(runner, rng, vocab, prefill_len)
    if engine:
        result["engine_ms_per_token"] = bench_27b.engine_token_ms(runner)
    del runner
    return result


def table(name: str, c: str, entry: dict) -> str:
    med = entry["median"]
    spans = ", ".join(f"{s / 1e3:.3f}" for s in entry["spans_us"])
    if c == "prefill":
        n = entry["prompt_len"]
        lines = [f"== {name}, prefill of {n} tokens: span {med['span_us'] / 1e3:.3f} ms on the GPU (median of "
                 f"{len(entry['spans_us'])}: {spans}), {n / med['span_us'] * 1e6:,.0f} tok/s, "
                 f"{entry['kernels_per_step']} kernels"]
    else:
        host = entry["host"]
        lines = [f"== {name}, {c} request(s): step span {med['span_us'] / 1e3:.3f} ms on the GPU (median of "
                 f"{len(entry['spans_us'])}: {spans}), {entry['kernels_per_step']} kernels",
                 f"host to host (untraced) {host['wall_us'] / 1e3:.3f} ms: queued after {host['queued_us']:.1f} us "
                 f"(input upload {host['write_us']:.1f} us, graph call {host['call_us']:.1f} us), the rest waits "
                 "for the GPU and reads the tokens back"
                 + (f"; queued steps (step n + 1 queued before step n is read) {host['queued_wall_us'] / 1e3:.3f} ms"
                    if "queued_wall_us" in host else "")]
    lines += [f"{'kernel kind':<60} {'n':>4} {'dur us':>9} {'us/launch':>9} {'advance us':>10} {'share':>6} "
              f"{'lead us':>8} {'idle us':>8}"]
    rows = sorted(med["kinds"].items(), key=lambda kv: -kv[1]["advance"])
    for k, r in rows:
        lines.append(f"{k:<60} {r['n']:>4} {r['dur']:>9.1f} {r['dur'] / r['n']:>9.2f} {r['advance']:>10.1f} "
                     f"{r['advance'] / med['span_us']:>6.1%} {r['lead'] / r['n']:>8.2f} {r['gap'] / r['n']:>8.2f}")
    if entry.get("projections"):
        lines.append(f"{'decode GEMV, after the kernel launched before it':<86} {'n':>4} {'advance/launch':>14} "
                     f"{'dur/launch':>10}")
        for k, r in sorted(entry["projections"].items(), key=lambda kv: -kv[1]["advance"]):
            lines.append(f"{k:<86} {r['n']:>4} {r['advance'] / r['n']:>14.2f} {r['dur'] / r['n']:>10.2f}")
    return "\n".join(lines)


def round_order(names: list[str], rounds: int) -> list[tuple[int, str]]:
    """(round, package) in trace order: the packages forward, then backward, alternating, so that no
    package is always traced first or last."""
    return [(r, name) for r in range(rounds) for name in (names if r % 2 == 0 else names[::-1])]


def rounds_table(spans: dict[str, dict[str, list[float]]]) -> str:
    """Step ms per package and request count, one column per round (the median traced step of each
    run) and their median: the A/B with each package's spread beside it."""
    cs = sorted({c for per_c in spans.values() for c in per_c}, key=int)
    lines = ["== decode step ms on the GPU per round (rounds alternate the package order): "
             + "; ".join(f"{c} request(s)" for c in cs)]
    width = max(len(n) for n in spans)
    for name, per_c in spans.items():
        cells = []
        for c in cs:
            ms = [v / 1e3 for v in per_c.get(c, [])]
            cells.append(" ".join(f"{v:.3f}" for v in ms) + (f" (median {statistics.median(ms):.3f})" if ms else ""))
        lines.append(f"{name:<{width}}  " + "  |  ".join(cells))
    return "\n".join(lines)


def fits(now: float, longest: float, deadline: float | None) -> bool:
    """Whether another package trace, as long as the longest one so far, ends before `deadline` (None:
    no budget)."""
    return deadline is None or now + longest <= deadline


def inner(out: Path, concurrency: list[int], n_steps: int, prefill_len: int = 0, engine: bool = False,
          rounds: int = 1, budget: float = 0.0) -> int:
    names = os.environ.get("NINFER_TRACE_PACKAGES", "pkg").split(",")
    artifact = bench_27b.artifact_path(Path("/tmp"), "groupwise-int")
    if not artifact.exists():
        job = bench_27b._synthesize_in_background("groupwise-int")
        if job.wait() != 0:
            raise SystemExit("synthesis failed")
    print(f"device: {bench_27b.device_name()}", flush=True)
    for name in names:  # (before any tracing)
        if not (bench_27b.STAGE / name / "manifest.json").exists():
            raise SystemExit(f"{bench_27b.STAGE / name}: no package (run bench_27b.py prepare first)")
    results: dict = {}
    spans: dict[str, dict[str, list[float]]] = {name: {} for name in names}
    deadline = time.monotonic() + budget if budget > 0 else None
    longest = 0.0
    for r, name in round_order(names, rounds):
        first = r == 0
        if not fits(time.monotonic(), longest, deadline):  # the tables of what was traced, not a timeout
            print(f"== --budget {budget:.0f} s: stopped before round {r + 1} of {name}", flush=True)
            break
        start = time.monotonic()
        got = trace_package(bench_27b.STAGE / name, artifact, concurrency, n_steps, prefill_len if first else 0,
                            engine and first and name == names[0])
        longest = max(longest, time.monotonic() - start)
        if first:  # the kernel tables are the first round's, the median step's timeline a file of its own
            for c in map(str, concurrency):
                (out / f"timeline-{name}-{c}.csv").write_text(timeline_csv(got[c].pop("timeline")))
            results[name] = got
        for c in map(str, concurrency):
            spans[name].setdefault(c, []).append(got[c]["median"]["span_us"])
        (out / "trace.json").write_text(json.dumps({**results, "rounds": spans}, indent=1))
    for name, per_c in results.items():
        for c, entry in per_c.items():
            if c == "engine_ms_per_token":
                print(f"== {name}, the engine generating (ms per token per request): "
                      + ", ".join(f"{k} request(s) {v:.3f}" for k, v in entry.items()), flush=True)
            else:
                print(table(name, c, entry), flush=True)
    traced = {name: per_c for name, per_c in spans.items() if per_c}
    if rounds > 1 and traced:
        print(rounds_table(traced), flush=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/trace-out")))
    parser.add_argument("--concurrency", default="1", help="comma-separated request counts")
    parser.add_argument("--steps", type=int, default=5, help="traced decode steps per concurrency")
    parser.add_argument("--prefill", type=int, default=0, metavar="N",
                        help="also trace the prefill of an N-token prompt (one chunk; 0: none)")
    parser.add_argument("--engine", action="store_true", help="also time the engine generating (greedy, sampled)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="trace the packages this many times, the order reversed every other round")
    parser.add_argument("--budget", type=float, default=0.0, metavar="SECONDS",
                        help="start no package trace that would, as long as the longest so far, end after this "
                             "many seconds of tracing (0: none): a call's time limit then still gets the tables")
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.budget < 0:
        parser.error("--budget must be 0 (none) or a number of seconds")
    if args.prefill < 0:
        parser.error("--prefill must be 0 (none) or a prompt length")
    try:
        concurrency = [int(c) for c in args.concurrency.split(",")]
    except ValueError:
        parser.error(f"--concurrency {args.concurrency!r}: comma-separated integers")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.inner:
        return inner(args.out, concurrency, args.steps, args.prefill, args.engine, args.rounds, args.budget)
    # the benchmark's environment (TVM's runtime staged next to the packages), this script inside it
    site = Path("/tmp/ninfer-trace-site")
    shutil.rmtree(site, ignore_errors=True)
    site.mkdir(parents=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--target", str(site), *map(str, sorted((bench_27b.STAGE / "wheels").glob("*.whl")))], check=True)
    for mod, src in (("ninfer_runtime", "runtime"), ("ninfer_compiler", "ninfer_compiler")):
        (site / mod).symlink_to(bench_27b.ROOT / src)
    env = {**os.environ, "TVM_USE_RUNTIME_LIB": "1", "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join([str(site), str(bench_27b.STAGE / "site")])}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--inner", "--out", str(args.out),
           "--concurrency", args.concurrency, "--steps", str(args.steps), "--prefill", str(args.prefill),
           "--rounds", str(args.rounds), "--budget", str(args.budget), *(["--engine"] if args.engine else [])]
    return subprocess.run(cmd, env=env, cwd="/tmp").returncode


if __name__ == "__main__":
    sys.exit(main())
