#!/usr/bin/env python3
"""Per-kernel time of one decode step and one prefill chunk of a Qwen3.6-27B-shaped model (ncu).

A proxy with fewer layers but the real dims (`synthesize(..., layers=4)`: 3 GDN layers and 1
attention layer, as in every group of 4 of the 64) has the same per-layer kernels, rebuilds in
seconds and profiles fast. Several packages of that artifact can be compared (e.g. `base` and
`fix`), each in its own folder under `.cache/ninfer/perf-27b-l4/`:

    # build machine: the 4-layer artifact (~3.3 GB, ~30 s) and a package of it under NAME
    .venv/bin/python tests/gpu/profile_27b.py prepare --name fix
    # GPU machine (repository + .cache/ninfer/perf-27b (staged runtime) + .cache/ninfer/perf-27b-l4):
    python3 tests/gpu/profile_27b.py run --out $OUT

`run` rebuilds the artifact, then for each package: ncu over one eager batch-1 decode step and
one 1,024-token prefill chunk (`--clock-control none`, kernel time and DRAM bytes), `ninfer
bench`'s measurement, and logits of a fixed scenario; last it compares the packages' logits.
It writes `kernels_<name>.csv` (ncu's raw output), `summary.json` and prints per-kernel tables.
`report CSV` turns such a CSV into markdown tables scaled to the 64-layer model (per-layer kernels
x 16, embedding / last token / output head once). `kernels [--dump F1,F2 --out DIR]` (no GPU) lists
the schedule each kernel gets and writes the CUDA source of the named ones.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STAGE = ROOT / ".cache" / "ninfer" / "perf-27b-l4"
RUNTIME_STAGE = ROOT / ".cache" / "ninfer" / "perf-27b"  # bench_27b.py prepare: TVM runtime + wheels
LIKE, RECIPE, SEED, LAYERS = "qwen3.6-27b", "groupwise-int", 0, 4
# the prefill chunk profiled (and the packages' chunk size): 7,680 is the issue's prompt, 1,024 the
# size the earlier breakdowns used (NINFER_PROFILE_PREFILL selects it at prepare and at run)
PREFILL_CHUNK = int(os.environ.get("NINFER_PROFILE_PREFILL", "7680"))
MAX_CONTEXT = max(8192, PREFILL_CHUNK + 512)
METRICS = "gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum"
CONTEXT_BYTES = 4 << 30


def prepare(artifact: Path, name: str, reference: bool = False) -> None:
    """A package of the proxy under `name`; `reference` builds it with the TIR reference kernels
    only (the package the tuned one's logits are compared with)."""
    import contextlib

    from ninfer_compiler.compile import CompileOptions, compile_artifact
    from ninfer_compiler.convert.synth import synthesize
    from ninfer_compiler.ops.common import reference_kernels

    if not artifact.exists():
        synthesize(artifact, LIKE, RECIPE, layers=LAYERS, seed=SEED)
    shutil.rmtree(STAGE / name, ignore_errors=True)
    start = time.perf_counter()
    with reference_kernels() if reference else contextlib.nullcontext():
        compile_artifact(artifact, STAGE / name, CompileOptions(target="h200", max_context=MAX_CONTEXT,
                                                                 prefill_chunk=PREFILL_CHUNK, max_batch=8))
    print(f"compiled {STAGE / name} in {time.perf_counter() - start:.1f} s")


def kernels(artifact: Path, dump: list[str], out: Path) -> None:
    """No GPU: which schedule each PrimFunc of the h200 model gets, and the CUDA of `dump` kernels.

    Runs the pipeline's fusion passes and low-batch pass, then tries dlight's default rules one
    at a time on each function still unscheduled (the pipeline applies the first that matches).
    """
    import tvm
    import tvm_ffi
    from tvm import tirx
    from tvm.s_tir import dlight as dl

    from ninfer_compiler.build import export_module
    from ninfer_compiler.codegen.graphs import add_graph_variants
    from ninfer_compiler.codegen.toolchain import ensure_cuda_codegen
    from ninfer_compiler.compile import tvm_target
    from ninfer_compiler.frontend.options import ModelOptions
    from ninfer_compiler.frontend.qwen3_5 import binding
    from ninfer_compiler.frontend.qwen3_5 import model as model_mod
    from ninfer_compiler.passes.low_batch import schedule_low_batch
    from ninfer_compiler.passes.pipeline import _fusion_passes
    from ninfer_runtime import targets
    from ninfer_runtime.artifact import Artifact

    target = targets.load("h200")
    ttarget = tvm_target(target)
    with Artifact(artifact) as art:
        cfg, plan = binding.model_config(art), binding.weight_plan(art, target)
    model = model_mod.Qwen35ForCausalLM(cfg, ModelOptions(dtype=target.activation_dtype, weights=plan))
    rules = [("Matmul", dl.gpu.Matmul()), ("GEMV", dl.gpu.GEMV()), ("Reduction", dl.gpu.Reduction()),
             ("GeneralReduction", dl.gpu.GeneralReduction()), ("Fallback", dl.gpu.Fallback())]
    with ttarget:
        mod, _ = export_module(model, model.upper_bounds(max_prefill_tokens=PREFILL_CHUNK, max_batch=8))
        mod = tvm.transform.Sequential(_fusion_passes())(add_graph_variants(mod))
        low = schedule_low_batch(mod)
        for gv, func in sorted(low.functions.items(), key=lambda kv: kv[0].name_hint):
            if not isinstance(func, tirx.PrimFunc):
                continue
            if func.attrs.get("tirx.is_scheduled"):
                rule = "LowBatchGEMV" if not mod[gv].attrs.get("tirx.is_scheduled") else "own TIR"
            else:
                rule = "none"
                for name, r in rules:
                    if dl.ApplyDefaultSchedule(r)(tvm.IRModule({gv: func}))[gv].attrs.get("tirx.is_scheduled"):
                        rule, func = name, dl.ApplyDefaultSchedule(r)(tvm.IRModule({gv: func}))[gv]
                        break
            print(f"{rule:17s} {gv.name_hint}")
            if gv.name_hint in dump:
                ensure_cuda_codegen()
                code: list[str] = []

                def keep(src: str, *_: object, code: list[str] = code) -> bytes:
                    code.append(str(src))
                    raise RuntimeError("source kept; not compiled")

                tvm_ffi.register_global_func("tvm_callback_cuda_compile", keep, override=True)
                try:
                    tvm.tirx.build(tvm.IRModule({gv: func.with_attr("global_symbol", gv.name_hint)}), target=ttarget)
                except Exception:  # noqa: BLE001 (the callback stops the build once it has the source)
                    pass
                out.mkdir(parents=True, exist_ok=True)
                (out / f"{gv.name_hint}.cu").write_text(code[-1] if code else "")


# ---- GPU machine --------------------------------------------------------------------------------


def _env() -> dict[str, str]:
    site = Path("/tmp/ninfer-perf-site")
    if not (site / "ninfer_runtime").exists():
        shutil.rmtree(site, ignore_errors=True)
        site.mkdir(parents=True)
        wheels = sorted((RUNTIME_STAGE / "wheels").glob("*.whl"))
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        "--target", str(site), *map(str, wheels)], check=True)
        (site / "ninfer_runtime").symlink_to(ROOT / "runtime")
        (site / "ninfer_compiler").symlink_to(ROOT / "ninfer_compiler")
    return {**os.environ, "TVM_USE_RUNTIME_LIB": "1", "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join([str(site), str(RUNTIME_STAGE / "site")])}


def _runner(package: Path, artifact: Path, graphs: bool):  # noqa: ANN202 (ModelRunner, imported late)
    from ninfer_runtime.runner import ModelRunner, RunnerOptions

    return ModelRunner(package, artifact=artifact,
                       options=RunnerOptions(max_active=8, context_bytes=CONTEXT_BYTES, cuda_graphs=graphs))


def step(package: Path, artifact: Path) -> int:
    """Under ncu (`--profile-from-start off`): one eager decode step (batch 1, 64 tokens of
    context), then one prefill chunk of `PREFILL_CHUNK` tokens, each inside a profiler range."""
    import ctypes

    import numpy as np

    cuda = ctypes.CDLL("libcuda.so.1")
    runner = _runner(package, artifact, graphs=False)
    rng = np.random.default_rng(0)
    seq = runner.pool.acquire()
    runner.prefill(seq, rng.integers(2, 30000, 64))
    runner.decode([seq], rng.integers(2, 30000, 1))  # warm-up: module load, first launches
    runner.device.sync()
    assert cuda.cuProfilerStart() == 0
    runner.decode([seq], rng.integers(2, 30000, 1))
    runner.device.sync()
    other = runner.pool.acquire()
    runner.prefill(other, rng.integers(2, 30000, PREFILL_CHUNK))
    runner.device.sync()
    assert cuda.cuProfilerStop() == 0
    return 0


def scenario(package: Path, artifact: Path, out: Path) -> dict:
    """Bench numbers and the logits of a fixed scenario (prefill, decode at batch 1 and 5)."""
    import numpy as np

    from ninfer_runtime.bench import run_bench

    runner = _runner(package, artifact, graphs=True)
    rng = np.random.default_rng(1)
    seqs = [runner.pool.acquire() for _ in range(5)]
    logits = {"prefill": runner.prefill(seqs[0], rng.integers(2, 30000, 300))}
    for i, s in enumerate(seqs[1:]):
        runner.prefill(s, rng.integers(2, 30000, 20 + 7 * i))
    logits["decode1"] = runner.decode(seqs[:1], rng.integers(2, 30000, 1))
    logits["decode5"] = runner.decode(seqs, rng.integers(2, 30000, 5))
    runner._decode_graph, runner.graph_buckets = None, []  # the eager entry, on the same state
    logits["decode5_eager"] = runner.decode(seqs, rng.integers(2, 30000, 5))
    for s in seqs:
        runner.pool.release(s)
    np.savez(out / f"logits_{package.name}.npz", **logits)
    greedy = _greedy_check(runner, rng)
    print(f"greedy on the device vs argmax of the logits: {greedy}", flush=True)
    del runner
    runner = _runner(package, artifact, graphs=True)
    report = run_bench(runner, prompt_len=PREFILL_CHUNK, decode_tokens=16, concurrency=[1, 8], repeats=2)
    print(report.table(), flush=True)
    eager_runner = runner
    eager_runner._decode_graph, eager_runner.graph_buckets = None, []
    eager = run_bench(eager_runner, prompt_len=16, decode_tokens=8, concurrency=[1], repeats=1)
    return {"bench": report.as_json(), "eager_decode_ms": eager.decode[0].step_ms, "greedy": greedy}


def _greedy_check(runner, rng) -> dict:  # noqa: ANN001 (a ModelRunner)
    """Pairs of sequences with the same prompt: one decodes for logits, the other for the device's
    greedy choice, in the same step positions; the tokens must be the logits' argmax."""
    import numpy as np

    if not runner.device_greedy:
        return {"device_greedy": False}
    pairs = [(runner.pool.acquire(), runner.pool.acquire()) for _ in range(3)]
    try:
        for i, (a, b) in enumerate(pairs):
            prompt = rng.integers(2, 30000, 30 + 11 * i)
            runner.prefill(a, prompt)
            runner.prefill(b, prompt)
        same, worst = 0, 0.0
        for _ in range(4):
            tokens = rng.integers(2, 30000, len(pairs))
            logits = runner.decode([a for a, _ in pairs], tokens).astype(np.float64)
            ids, logprobs = runner.decode_greedy([b for _, b in pairs], tokens)
            same += int((ids == logits.argmax(-1)).sum())
            top = logits.max(-1)
            lse = top + np.log(np.exp(logits - top[:, None]).sum(-1))
            worst = max(worst, float(np.abs(logprobs - (logits[np.arange(len(ids)), ids] - lse)).max()))
        return {"device_greedy": True, "tokens_equal": same, "of": 4 * len(pairs), "logprob_max_abs_err": worst}
    finally:
        for a, b in pairs:
            runner.pool.release(a)
            runner.pool.release(b)


def _time_us(value: str, unit: str) -> float:
    scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3,
             "second": 1e6, "s": 1e6}[unit]
    return float(value.replace(",", "")) * scale


def _bytes(value: str, unit: str) -> float:
    scale = {"byte": 1, "B": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9}[unit]
    return float(value.replace(",", "")) * scale


def parse_ncu(text: str) -> list[dict]:
    """ncu `--csv` rows -> one dict per launch: name, block, grid, us, read/write bytes."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    launches: dict[str, dict] = {}
    for row in csv.DictReader(io.StringIO("\n".join(lines))):
        k = launches.setdefault(row["ID"], {"id": int(row["ID"]), "name": row["Kernel Name"].split("(")[0],
                                            "block": row["Block Size"], "grid": row["Grid Size"]})
        metric, unit, value = row["Metric Name"], row["Metric Unit"], row["Metric Value"]
        if metric.startswith("gpu__time_duration"):
            k["us"] = _time_us(value, unit)
        elif metric.startswith("dram__bytes_read"):
            k["read"] = _bytes(value, unit)
        elif metric.startswith("dram__bytes_write"):
            k["write"] = _bytes(value, unit)
    return sorted(launches.values(), key=lambda k: k["id"])


def split_phases(launches: list[dict]) -> dict[str, list[dict]]:
    """Decode step, then prefill chunk: the prefill starts at the second embedding kernel."""
    starts = [i for i, k in enumerate(launches) if k["name"].startswith("dequant_embedding")
              or k["name"].startswith("embedding")]
    cut = starts[1] if len(starts) > 1 else len(launches)
    return {"decode": launches[:cut], "prefill": launches[cut:]}


def table(launches: list[dict], copy_gb_s: float = 4155.0) -> tuple[str, list[dict]]:
    groups: dict[str, dict] = defaultdict(lambda: {"count": 0, "us": 0.0, "bytes": 0.0})
    for k in launches:
        g = groups[k["name"]]
        g["count"] += 1
        g["us"] += k.get("us", 0.0)
        g["bytes"] += k.get("read", 0.0) + k.get("write", 0.0)
        g["block"], g["grid"] = k["block"], k["grid"]
    total = sum(g["us"] for g in groups.values()) or 1.0
    rows = sorted(({"kernel": n, **g} for n, g in groups.items()), key=lambda r: -r["us"])
    out = [f"total {total / 1e3:.3f} ms over {len(launches)} launches",
           f"{'kernel':58s} {'n':>3} {'ms':>9} {'share':>6} {'MB':>9} {'GB/s':>7} {'%bw':>5}  block / grid"]
    for r in rows:
        gbs = r["bytes"] / (r["us"] * 1e-6) / 1e9 if r["us"] else 0.0
        out.append(f"{r['kernel'][:58]:58s} {r['count']:>3} {r['us'] / 1e3:>9.3f} {100 * r['us'] / total:>5.1f}% "
                   f"{r['bytes'] / 1e6:>9.1f} {gbs:>7.0f} {100 * gbs / copy_gb_s:>4.0f}%  {r['block']} / {r['grid']}")
    return "\n".join(out), rows


def _is_once(launches: list[dict], i: int) -> bool:
    """Kernels that run once per call, not once per layer: embedding, last token, the output head
    (the last matmul of the call) and what follows it (logits cast, the greedy choice)."""
    name = launches[i]["name"]
    if name.startswith(("dequant_embedding", "embedding", "last_token")):
        return True
    matmuls = [j for j, k in enumerate(launches)
               if any(tag in k["name"] for tag in ("matmul", "dense_nt", "qgemv", "qgemm", "gemv", "gemm"))]
    return bool(matmuls) and i >= matmuls[-1]


def extrapolate(launches: list[dict], proxy_layers: int = LAYERS, full_layers: int = 64) -> list[dict]:
    """The proxy's launches scaled to the full model: per-layer kernels x full/proxy layers."""
    scale = full_layers / proxy_layers
    return [{**k, "weight": 1.0 if _is_once(launches, i) else scale} for i, k in enumerate(launches)]


def markdown(launches: list[dict], copy_gb_s: float = 4155.0) -> str:
    """A markdown table of `extrapolate`d launches grouped by kernel: count, ms, share, MB, % of bandwidth."""
    groups: dict[str, dict] = defaultdict(lambda: {"count": 0.0, "us": 0.0, "bytes": 0.0})
    for k in launches:
        g = groups[k["name"]]
        w = k.get("weight", 1.0)
        g["count"] += w
        g["us"] += w * k.get("us", 0.0)
        g["bytes"] += w * (k.get("read", 0.0) + k.get("write", 0.0))
        g["launch"] = f"{k['grid']} x {k['block']}"
    total = sum(g["us"] for g in groups.values())
    lines = [f"total {total / 1e3:.2f} ms", "",
             "| kernel | launches | ms | share | DRAM MB | GB/s | % of copy bw | grid x block |",
             "|---|---|---|---|---|---|---|---|"]
    for name, g in sorted(groups.items(), key=lambda kv: -kv[1]["us"]):
        if g["us"] < 0.002 * total:
            continue
        gbs = g["bytes"] / (g["us"] * 1e-6) / 1e9 if g["us"] else 0.0
        lines.append(f"| `{name.removesuffix('_kernel')}` | {g['count']:.0f} | {g['us'] / 1e3:.2f} | "
                     f"{100 * g['us'] / total:.1f}% | {g['bytes'] / 1e6:.0f} | {gbs:.0f} | {100 * gbs / copy_gb_s:.0f}% | "
                     f"{g['launch']} |")
    return "\n".join(lines)


def run_outer(out: Path, artifact: Path, full: bool, names: list[str] | None = None,
              ncu_names: list[str] | None = None) -> int:
    import numpy as np

    out.mkdir(parents=True, exist_ok=True)
    work = Path("/tmp/perf-work")  # logits and per-package JSON (few files come back from $OUT)
    work.mkdir(parents=True, exist_ok=True)
    env = _env()
    me = str(Path(__file__).resolve())
    if not artifact.exists():
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "from ninfer_compiler.convert.synth import synthesize; "
                        f"synthesize('{artifact}', '{LIKE}', '{RECIPE}', layers={LAYERS}, seed={SEED})"],
                       env=env, cwd="/tmp", check=True)
        print(f"synthesized {artifact} in {time.perf_counter() - start:.1f} s", flush=True)
    summary: dict = {}
    packages = sorted(p for p in STAGE.iterdir() if (p / "manifest.json").exists()
                      and (names is None or p.name in names))
    ncu = shutil.which("ncu") or next(iter(sorted(Path("/").glob("opt/nvidia/nsight-compute/*/ncu"))),
                                      "/usr/local/cuda/bin/ncu")
    for pkg in packages:
        entry: dict = {}
        if ncu_names is None or pkg.name in ncu_names:
            start = time.perf_counter()
            log = out / f"kernels_{pkg.name}.csv"
            with log.open("w") as fh:  # ncu prints its CSV report on stdout when the program ends
                proc = subprocess.run([ncu, "--clock-control", "none", "--profile-from-start", "off", "--metrics",
                                       METRICS, "--csv", "--print-units", "base", sys.executable, me, "step",
                                       "--package", str(pkg), "--artifact", str(artifact)],
                                      env=env, cwd="/tmp", stdout=fh, timeout=240)
            print(f"ncu {pkg.name}: rc {proc.returncode} in {time.perf_counter() - start:.1f} s", flush=True)
            phases = split_phases(parse_ncu(log.read_text()))
            for phase, launches in phases.items():
                text, rows = table(launches)
                print(f"== {pkg.name} {phase}\n{text}", flush=True)
                entry[phase] = rows
        res = subprocess.run([sys.executable, me, "scenario", "--package", str(pkg), "--artifact", str(artifact),
                              "--out", str(work)], env=env, cwd="/tmp", capture_output=True, text=True, timeout=240)
        print(res.stdout[-3000:], res.stderr[-3000:], flush=True)
        if (work / f"scenario_{pkg.name}.json").exists():
            entry["scenario"] = json.loads((work / f"scenario_{pkg.name}.json").read_text())
        summary[pkg.name] = entry
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
    names = [p.name for p in packages]
    for other in names[1:]:
        if not (work / f"logits_{names[0]}.npz").exists() or not (work / f"logits_{other}.npz").exists():
            print(f"no logits to compare for {names[0]} / {other}", flush=True)
            continue
        a, b = np.load(work / f"logits_{names[0]}.npz"), np.load(work / f"logits_{other}.npz")
        for key in a.files:
            x, y = a[key].astype(np.float64), b[key].astype(np.float64)
            rel = float(np.linalg.norm(x - y) / np.linalg.norm(x))
            same = float((x.argmax(-1) == y.argmax(-1)).mean())
            summary.setdefault("compare", {})[f"{names[0]}-{other}:{key}"] = {"rel": rel, "argmax_agree": same}
            print(f"logits {names[0]} vs {other} {key}: rel {rel:.2e}, argmax agree {same:.2f}", flush=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    if full:  # bench_27b.py rebuilds the 27B artifacts itself
        subprocess.run([sys.executable, str(Path(__file__).with_name("bench_27b.py")), "run-inner",
                        "--out", str(out)], env=env, cwd="/tmp", timeout=int(os.environ.get("NINFER_FULL_TIMEOUT", "420")))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["prepare", "kernels", "run", "step", "scenario", "report"])
    parser.add_argument("csv", nargs="?", type=Path, help="report: an ncu CSV written by run")
    parser.add_argument("--artifact", type=Path, default=None)
    parser.add_argument("--package", type=Path)
    parser.add_argument("--name", default="pkg")
    parser.add_argument("--full", action="store_true", help="run: also bench the 27B package (bench_27b.py)")
    parser.add_argument("--reference", action="store_true", help="prepare: TIR reference kernels only")
    parser.add_argument("--packages", help="run: comma-separated package names (default: all)")
    parser.add_argument("--ncu", help="run: packages to profile with ncu (default: all of them)")
    parser.add_argument("--dump", default="", help="kernels: comma-separated PrimFuncs whose CUDA to write")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/perf-out")))
    args = parser.parse_args()
    if args.action == "prepare":
        prepare(args.artifact or Path("/tmp/perf/27b-l4.ninfer"), args.name, args.reference)
    elif args.action == "run":
        names = args.packages.split(",") if args.packages else None
        ncu_names = args.ncu.split(",") if args.ncu else None
        return run_outer(args.out, args.artifact or Path("/tmp/perf-27b-l4.ninfer"), args.full, names, ncu_names)
    elif args.action == "kernels":
        kernels(args.artifact or Path("/tmp/perf/27b-l4.ninfer"), [d for d in args.dump.split(",") if d], args.out)
    elif args.action == "report":  # markdown tables scaled to the 64-layer model
        for phase, launches in split_phases(parse_ncu(args.csv.read_text())).items():
            print(f"### {phase}\n\n{markdown(extrapolate(launches))}\n")
    elif args.action == "step":
        return step(args.package, args.artifact)
    else:
        result = scenario(args.package, args.artifact, args.out)
        (args.out / f"scenario_{args.package.name}.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
