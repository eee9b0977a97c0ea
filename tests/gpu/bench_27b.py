#!/usr/bin/env python3
"""Qwen3.6-27B-shaped decode and prefill on an H200, against the device's measured limits.

Two steps, because a 15 GB artifact cannot be shipped to the GPU machine but can be rebuilt there
bit for bit (`ninfer synth` output, including its artifact_id, is a function of its arguments):

    # build machine (project venv; writes the artifacts under --folder, ~15 GB each, and stages ~30 MiB):
    .venv/bin/python tests/gpu/bench_27b.py prepare --folder /tmp/perf --recipes groupwise-int,nvfp4
    # GPU machine, repository + .cache/ninfer/perf-27b copied over (or its archive, see `unpack`):
    python3 tests/gpu/bench_27b.py run --out $OUT

`prepare` also writes the staged folder as one archive, `.cache/ninfer/perf-27b.tar.xz` (~1.3 MiB a
package instead of ~9): carry that instead and run `python3 tests/gpu/bench_27b.py unpack` first.

`prepare --baseline REV` also compiles the groupwise-int package from git revision REV's compiler
(a worktree) into `pkg-baseline`; `run` then benches it in the same session (decode at 1 and 8
requests, right after the groupwise-int package), for an A/B of a change on the same machine.
`prepare --variant NAME=DEFINE[,DEFINE...]` (repeatable) compiles a measurement variant of the
groupwise-int package whose decode GEMV kernels and launcher get those compile-time switches (e.g.
`empty=NINFER_V4_DIAG=3`, see VARIANT_PREFIX) or kernel features (`mlp=+gemv_int8_mlp`); `run`
benches each at decode (`NINFER_BENCH_VARIANTS` picks some).

`run` first measures the two ceilings in the same run (device copy bandwidth through TVM, and the
bf16 matrix rate with torch on random data, CUDA-event timed), rebuilds the synthetic artifact,
loads the h200 package with TVM's runtime only, and runs `ninfer bench`'s measurement: prefill of
one prompt, decode step time at each concurrency, weight bandwidth per step against the copy
bandwidth. It prints a table last and writes `results.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
STAGE = ROOT / ".cache" / "ninfer" / "perf-27b"
LIKE, SEED = "qwen3.6-27b", 0
RECIPES = ("groupwise-int", "nvfp4")
MAX_CONTEXT, PREFILL_CHUNK = 65536 + 1024, 8192  # the 7,680- and 65,536-token prompts


def artifact_path(folder: Path, recipe: str) -> Path:
    return folder / ("27b.ninfer" if recipe == "groupwise-int" else f"27b-{recipe}.ninfer")


def package_dir(recipe: str) -> Path:
    return STAGE / ("pkg" if recipe == "groupwise-int" else f"pkg-{recipe}")


ARCHIVE = STAGE.parent / "perf-27b.tar.xz"  # `pack`: the staged folder in one file, to carry
BASELINE = STAGE / "pkg-baseline"
# Measurement variants (`prepare --variant NAME=DEFINE,...`): the groupwise-int package with the decode
# GEMV's compile-time switches changed in its kernels and launcher, e.g. `loads-only=NINFER_V4_DIAG=1`
# (the math compiled out: the weight stream and activation loads stay, the outputs are wrong) or
# `rings=NINFER_V4_STAGES_Q4=3,NINFER_V4_STAGES_Q5=4`. `run` benches each at decode after the package.
VARIANT_PREFIX = "pkg-var-"


def _compile_baseline(artifact: Path, rev: str) -> None:
    """The groupwise-int package as git revision `rev`'s compiler builds it with its default kernels
    (a worktree of it on PYTHONPATH ahead of this checkout, NINFER_KERNELS unset: it may name
    features that revision lacks; kernels come from the shared content-addressed cache)."""
    found = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=12", f"{rev}^{{commit}}"],
                           capture_output=True, text=True)
    if found.returncode != 0:
        raise SystemExit(f"--baseline {rev!r}: not a commit of {ROOT} ({found.stderr.strip()})")
    rev = found.stdout.strip()  # (a worktree per commit, not per name)
    tree = Path("/tmp") / f"ninfer-baseline-{rev}"
    if not tree.exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), rev], check=True)
    code = ("from pathlib import Path; from ninfer_compiler.compile import CompileOptions, compile_artifact; "
            f"compile_artifact(Path('{artifact}'), Path('{BASELINE}'), CompileOptions(target='h200', "
            f"max_context={MAX_CONTEXT}, prefill_chunk={PREFILL_CHUNK}, max_batch=8))")
    env = {**{k: v for k, v in os.environ.items() if k != "NINFER_KERNELS"},
           "PYTHONPATH": os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")])}
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=env, cwd=str(tree), check=True)
    print(f"baseline {rev}: compiled in {time.perf_counter() - start:.1f} s", flush=True)


def parse_variant(spec: str) -> tuple[str, list[str]]:
    """`NAME=DEFINE[,DEFINE...]` -> (NAME, [DEFINE, ...]); each define NAME or NAME=VALUE, C identifiers."""
    import re

    name, _, rest = spec.partition("=")
    defines = rest.split(",") if rest else []
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
        raise ValueError(f"--variant {spec!r}: the name must be letters, digits, '.', '_' or '-'")
    if not defines or not all(re.fullmatch(r"[A-Za-z_]\w*(=[\w.-]+)?|[+-]\w+", d) for d in defines):
        raise ValueError(f"--variant {spec!r}: expected NAME=DEFINE[,DEFINE...], each DEFINE a C macro name "
                         "with an optional =VALUE, or +FEATURE / -FEATURE (a kernel feature, as NINFER_KERNELS)")
    from ninfer_compiler.ops.common import KERNEL_FEATURES

    unknown = [d for d in defines if d[0] in "+-" and d[1:] not in KERNEL_FEATURES]
    if unknown:
        raise ValueError(f"--variant {spec!r}: no kernel feature {', '.join(u[1:] for u in unknown)} "
                         f"(known: {', '.join(sorted(KERNEL_FEATURES))})")
    return name, defines


def variant_hooks(defines: list[str]):  # noqa: ANN201 (two functions replacing qgemv.fatbin / host_source)
    """qgemv's fatbin with `defines` added, and its launcher source with the `#define`s of the same
    names (the ring depths, which kernel and launcher must agree on) set to their values. A define
    the launcher also spells must be found there: a depth changed in the kernel alone would size
    the shared memory wrongly."""
    import re

    import ninfer_compiler.ops.qgemv as q
    from ninfer_compiler.codegen.toolchain import nvcc_fatbin

    host = q.host_source

    def fatbin(arch: str, dense: bool = False) -> bytes:  # the package's own switches, then the variant's
        return nvcc_fatbin(q.DEVICE_SOURCE, arch, (*q.fatbin_defines(dense), *defines), tag="qgemv")

    def host_source(arch: str, dense: bool = False) -> str:
        text = host(arch, dense)
        for d in defines:
            name, _, value = d.partition("=")
            text, found = re.subn(rf"#define {name} \S+", f"#define {name} {value or 1}", text)
            if not found and name.startswith("NINFER_V4_STAGES"):
                raise ValueError(f"variant define {name}: not in the launcher source")
        return text

    return fatbin, host_source


def _variant_child(artifact: str, out: str, defines: list[str]) -> None:
    """In the child of `_compile_variant`: the package with `variant_hooks(defines)` in place."""
    import ninfer_compiler.ops.qgemv as q
    from ninfer_compiler.compile import CompileOptions, compile_artifact

    q.fatbin, q.host_source = variant_hooks(defines)
    compile_artifact(Path(artifact), Path(out), CompileOptions(
        target="h200", max_context=MAX_CONTEXT, prefill_chunk=PREFILL_CHUNK, max_batch=8))


def _compile_variant(artifact: Path, name: str, defines: list[str]) -> None:
    """STAGE / pkg-var-NAME (see VARIANT_PREFIX), compiled in a child process; `+F` / `-F` entries
    of `defines` are kernel features, added to the child's NINFER_KERNELS."""
    out = STAGE / (VARIANT_PREFIX + name)
    features = [d for d in defines if d[0] in "+-"]
    defines = [d for d in defines if d[0] not in "+-"]
    code = f"import bench_27b; bench_27b._variant_child({str(artifact)!r}, {str(out)!r}, {defines!r})"
    start = time.perf_counter()
    kernels = ",".join(filter(None, [os.environ.get("NINFER_KERNELS", ""), *features]))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "NINFER_KERNELS": kernels}
    subprocess.run([sys.executable, "-c", code], cwd=str(Path(__file__).parent), env=env, check=True)
    print(f"variant {name} ({', '.join(features + defines)}): compiled in {time.perf_counter() - start:.1f} s",
          flush=True)


def prepare(folder: Path, recipes: list[str], baseline: str | None = None, variants: list[str] = ()) -> None:
    sys.path.insert(0, str(ROOT / "tests" / "gpu"))
    from check_h200_tiny import _stage_runtime

    from ninfer_compiler.compile import CompileOptions, compile_artifact
    from ninfer_compiler.convert.synth import _tokenizer_resources, synthesize

    STAGE.mkdir(parents=True, exist_ok=True)
    for old in STAGE.glob("pkg*"):
        shutil.rmtree(old)
    resources = _tokenizer_resources()
    (STAGE / "resources.json").write_text(json.dumps({k: v.decode() for k, v in resources.items()}))
    for recipe in recipes:
        artifact = artifact_path(folder, recipe)
        if not artifact.exists():
            synthesize(artifact, LIKE, recipe, seed=SEED, resources=resources)
        start = time.perf_counter()
        report = compile_artifact(artifact, package_dir(recipe), CompileOptions(
            target="h200", max_context=MAX_CONTEXT, prefill_chunk=PREFILL_CHUNK, max_batch=8))
        print(f"{recipe}: compiled in {time.perf_counter() - start:.1f} s: {report.stage_seconds}", flush=True)
    if baseline:
        _compile_baseline(artifact_path(folder, "groupwise-int"), baseline)
    for spec in variants:
        _compile_variant(artifact_path(folder, "groupwise-int"), *parse_variant(spec))
    _stage_runtime(STAGE)
    pack()
    print(f"staged {STAGE} ({ARCHIVE.stat().st_size / 2**20:.1f} MiB as {ARCHIVE.name})")


def pack() -> None:
    """The staged folder as one xz archive: the packages' fatbins compress ~7x, so a device call that
    carries the archive (and runs `unpack` first) fits many more variants in its 64 MiB."""
    with tarfile.open(ARCHIVE, "w:xz", preset=6) as tar:
        tar.add(STAGE, arcname=STAGE.name)


def unpack() -> None:
    """The staged folder from `pack`'s archive (on the GPU machine, before `run`), replacing any there."""
    if not ARCHIVE.exists():
        raise SystemExit(f"unpack: no {ARCHIVE} (run prepare on the build machine and carry it)")
    shutil.rmtree(STAGE, ignore_errors=True)
    with tarfile.open(ARCHIVE, "r:xz") as tar:
        tar.extractall(STAGE.parent, filter="data")
    print(f"unpacked {ARCHIVE.name}: {', '.join(sorted(p.name for p in STAGE.iterdir()))}")


def run_outer(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    site = Path("/tmp/ninfer-perf-site")
    shutil.rmtree(site, ignore_errors=True)
    site.mkdir(parents=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--target", str(site), *map(str, sorted((STAGE / "wheels").glob("*.whl")))], check=True)
    (site / "ninfer_runtime").symlink_to(ROOT / "runtime")
    (site / "ninfer_compiler").symlink_to(ROOT / "ninfer_compiler")
    env = {**os.environ, "TVM_USE_RUNTIME_LIB": "1", "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join([str(site), str(STAGE / "site")])}
    cmd = [sys.executable, str(Path(__file__).resolve()), "run-inner", "--out", str(out)]
    return subprocess.run(cmd, env=env, cwd="/tmp").returncode


def _matmul_rate() -> float:
    """bf16 dense matmul TFLOP/s on random data, CUDA events, median of repeats."""
    import torch

    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    times.sort()
    return 2 * n**3 / times[len(times) // 2] / 1e12


def _synthesize_in_background(recipe: str) -> subprocess.Popen:
    """Rebuild the artifact on this machine (bit-identical to the build machine's) in a child."""
    code = ("import json, pathlib; from ninfer_compiler.convert.synth import synthesize; "
            f"r = json.loads(pathlib.Path('{STAGE}/resources.json').read_text()); "
            f"synthesize('{artifact_path(Path('/tmp'), recipe)}', '{LIKE}', '{recipe}', seed={SEED}, "
            "resources={k: v.encode() for k, v in r.items()})")
    return subprocess.Popen([sys.executable, "-c", code], cwd="/tmp")


PROBE_ROWS = (1, 3, 6)  # decode batch sizes of the numerics probe (int8 activations at 1 and 3; 6 pads to the 8-row graph)


def probe_logits(runner) -> dict[int, np.ndarray]:  # noqa: ANN001 (a ModelRunner)
    """Decode logits on fixed inputs, for comparing packages built from one artifact: per batch size
    in PROBE_ROWS, 32 prompt tokens per sequence, then 4 decode steps (the CUDA graph); `[4, b, vocab]`
    float32. A kernel change shows here as a difference from the other package's logits."""
    rng = np.random.default_rng(11)
    vocab = min(runner.manifest.raw["model"]["vocab_size"], 1 << 15)
    out = {}
    for b in PROBE_ROWS:
        seqs = [runner.pool.acquire() for _ in range(b)]
        try:
            for s in seqs:
                runner.prefill(s, rng.integers(2, vocab, 32))
            out[b] = np.stack([runner.decode(seqs, rng.integers(2, vocab, b)) for _ in range(4)]).astype(np.float32)
        finally:
            for s in seqs:
                runner.pool.release(s)
    return out


def compare_logits(ref: dict, got: dict) -> dict:
    """max |got - ref| / max |ref| and the greedy tokens that agree, per probe batch size."""
    return {str(b): {"max_rel": float(np.abs(got[b] - ref[b]).max() / max(float(np.abs(ref[b]).max()), 1e-30)),
                     "greedy_same": int((got[b].argmax(-1) == ref[b].argmax(-1)).sum()),
                     "greedy_of": int(ref[b].shape[0] * ref[b].shape[1])} for b in ref}


def _say_probe(name: str, cmp: dict) -> None:
    print(f"numerics {name} vs the package: " + ", ".join(
        f"b={b}: logits max rel diff {c['max_rel']:.2e}, greedy {c['greedy_same']}/{c['greedy_of']}"
        for b, c in cmp.items()), flush=True)


def device_name() -> str:
    """The GPU this run measures (the lent machine may be an H100 or an H200): nvidia-smi's name."""
    try:
        found = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"unknown ({err})"
    return found.stdout.strip().splitlines()[0] if found.returncode == 0 and found.stdout.strip() else "unknown"


def run_inner(out: Path) -> int:
    device = device_name()
    print(f"device: {device}", flush=True)
    rate = float(subprocess.run([sys.executable, "-c", "import bench_27b; print(bench_27b._matmul_rate())"],
                        cwd=str(Path(__file__).parent), capture_output=True, text=True,
                        env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TVM_USE_RUNTIME_LIB")}
                        ).stdout.strip() or "nan")
    print(f"bf16 matmul (torch, 8192^3): {rate:.0f} TFLOP/s", flush=True)
    from ninfer_runtime.bench import run_bench
    from ninfer_runtime.runner import ModelRunner, RunnerOptions

    recipes = [r for r in RECIPES if (package_dir(r) / "manifest.json").exists()]
    start = time.perf_counter()
    jobs = {r: _synthesize_in_background(r) for r in recipes if not artifact_path(Path("/tmp"), r).exists()}
    results: dict = {"device": device, "bf16_matmul_tflops": rate}
    for recipe in recipes:
        if recipe in jobs and jobs[recipe].wait() != 0:
            print(f"{recipe}: synthesis failed", flush=True)
            continue
        print(f"{recipe}: artifact ready after {time.perf_counter() - start:.1f} s", flush=True)
        t0 = time.perf_counter()
        runner = ModelRunner(package_dir(recipe), artifact=artifact_path(Path("/tmp"), recipe),
                             options=RunnerOptions(max_active=8, context_bytes=24 << 30))
        print(f"{recipe}: loaded in {time.perf_counter() - t0:.1f} s", flush=True)
        report = run_bench(runner, prompt_len=PROMPT_LEN, decode_tokens=32, concurrency=[1, 2, 4, 8], repeats=3)
        entry = {"bench": report.as_json()}
        print(f"== {recipe}\n{report.table()}", flush=True)
        if LONG_PROMPT:
            long = run_bench(runner, prompt_len=LONG_PROMPT, decode_tokens=32, concurrency=[1], repeats=1, warmup=0,
                             decode_context=LONG_PROMPT)  # decode at the long context
            entry["long_prompt"] = long.as_json()
            print(f"== {recipe}, long prompt\n{long.table()}", flush=True)
        if recipe == "groupwise-int":
            entry["engine"] = engine_token_ms(runner)
            print("engine generating (ms per token per request): " + ", ".join(
                f"{k} request(s) {v:.3f}" for k, v in entry["engine"].items()), flush=True)
        results[recipe] = entry
        probe = probe_logits(runner) if recipe == "groupwise-int" else None
        (out / "results.json").write_text(json.dumps(results, indent=1))
        del runner
        if recipe == "groupwise-int" and (BASELINE / "manifest.json").exists():
            runner = ModelRunner(BASELINE, artifact=artifact_path(Path("/tmp"), recipe),
                                 options=RunnerOptions(max_active=8, context_bytes=24 << 30))
            report = run_bench(runner, prompt_len=PROMPT_LEN, decode_tokens=32, concurrency=[1, 8], repeats=3)
            results["baseline"] = {"bench": report.as_json(), "numerics": compare_logits(probe, probe_logits(runner))}
            print(f"== baseline ({recipe})\n{report.table()}", flush=True)
            _say_probe("baseline", results["baseline"]["numerics"])
            (out / "results.json").write_text(json.dumps(results, indent=1))
            del runner
        chosen = os.environ.get("NINFER_BENCH_VARIANTS")  # comma-separated names; unset: every staged variant
        for pkg in sorted(STAGE.glob(VARIANT_PREFIX + "*")) if recipe == "groupwise-int" else []:
            name = pkg.name[len(VARIANT_PREFIX):]
            if chosen is not None and name not in chosen.split(","):
                continue
            runner = ModelRunner(pkg, artifact=artifact_path(Path("/tmp"), recipe),
                                 options=RunnerOptions(max_active=8, context_bytes=24 << 30))
            report = run_bench(runner, prompt_len=512, decode_tokens=32, concurrency=[1, 2, 4, 8], repeats=3)
            results.setdefault("variants", {})[name] = {"bench": report.as_json(),
                                                        "numerics": compare_logits(probe, probe_logits(runner))}
            print(f"== variant {name} ({recipe})\n{report.table()}", flush=True)
            _say_probe(f"variant {name}", results["variants"][name]["numerics"])
            (out / "results.json").write_text(json.dumps(results, indent=1))
            del runner
    return 0


def engine_token_ms(runner, tokens: int = 48) -> dict:  # noqa: ANN001
    """What a user of `ninfer run` / `serve` gets: the engine generating (64-token random prompts,
    EOS ignored) for 1 and 8 requests at once, greedily and sampling (temperature 0.7, top-p 0.9:
    drawn on the device where the package has `sample`, steps queued ahead as greedy ones; else on
    the host, synchronous steps); ms per token of each request while all
    of them are decoding (from the step every request has its first token to the first finish)."""
    from ninfer_runtime.engine import Engine, GenerationParams
    from ninfer_runtime.package import load_tokenizer
    from ninfer_runtime.sampling import SamplingParams

    engine = Engine(runner, load_tokenizer(runner.package), max_active=8)
    rng = np.random.default_rng(7)
    modes = {"greedy": SamplingParams(temperature=0.0, greedy=True),
             "sampled": SamplingParams(temperature=0.7, top_p=0.9, seed=1)}
    out = {}
    for mode, sampling in modes.items():
        params = GenerationParams(max_tokens=tokens, sampling=sampling, ignore_eos=True)
        for c in (1, 8):
            for _ in range(2):  # a warm-up round, then the measured one
                handles = [engine.submit(rng.integers(2, 30000, 64).tolist(), params) for _ in range(c)]
                while any(h.stats.generated_tokens == 0 for h in handles):
                    engine.step()
                start, before = time.perf_counter(), sum(h.stats.generated_tokens for h in handles)
                while not any(h.finished for h in handles):
                    engine.step()
                made = sum(h.stats.generated_tokens for h in handles) - before
                elapsed = time.perf_counter() - start
                engine.run_until_idle()
            out[f"{mode} {c}"] = elapsed / (made / c) * 1e3 if made else float("nan")
    return out


PROMPT_LEN = int(os.environ.get("NINFER_BENCH_PROMPT", "7680"))
LONG_PROMPT = int(os.environ.get("NINFER_BENCH_LONG_PROMPT", "65536"))  # 0 skips it


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=["prepare", "unpack", "run", "run-inner"])
    parser.add_argument("--folder", type=Path, default=Path("/tmp/perf"), help="prepare: where the artifacts are written")
    parser.add_argument("--recipes", default=",".join(RECIPES), help="prepare: comma-separated recipes")
    parser.add_argument("--baseline", help="prepare: also build the groupwise-int package from this git revision")
    parser.add_argument("--variant", action="append", default=[],
                        help="prepare: also build a measurement variant NAME=DEFINE[,DEFINE...] of the groupwise-int package")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/perf-out")))
    args = parser.parse_args()
    if args.step == "prepare":
        for spec in args.variant:  # before minutes of synthesis and compilation
            try:
                parse_variant(spec)
            except ValueError as exc:
                parser.error(str(exc))
        prepare(args.folder, args.recipes.split(","), args.baseline, args.variant)
        return 0
    if args.step == "unpack":
        unpack()
        return 0
    if args.step == "run":
        return run_outer(args.out)
    return run_inner(args.out)


if __name__ == "__main__":
    sys.exit(main())
