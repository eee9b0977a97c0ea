#!/usr/bin/env python3
"""Qwen3.6-27B-shaped decode and prefill on an H200, against the device's measured limits.

Two steps, because a 15 GB artifact cannot be shipped to the GPU machine but can be rebuilt there
bit for bit (`ninfer synth` output, including its artifact_id, is a function of its arguments):

    # build machine (project venv; writes the artifact to --artifact, ~15 GB, and stages ~25 MiB):
    .venv/bin/python tests/gpu/bench_27b.py prepare --artifact /tmp/perf/27b.ninfer
    # GPU machine, repository + .cache/ninfer/perf-27b copied over:
    python3 tests/gpu/bench_27b.py run --out $OUT

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
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STAGE = ROOT / ".cache" / "ninfer" / "perf-27b"
LIKE, RECIPE, SEED = "qwen3.6-27b", "groupwise-int", 0
MAX_CONTEXT, PREFILL_CHUNK = 65536 + 1024, 8192  # the 7,680- and 65,536-token prompts


def prepare(artifact: Path) -> None:
    sys.path.insert(0, str(ROOT / "tests" / "gpu"))
    from check_h200_tiny import _stage_runtime

    from ninfer_compiler.compile import CompileOptions, compile_artifact
    from ninfer_compiler.convert.synth import _tokenizer_resources, synthesize

    shutil.rmtree(STAGE, ignore_errors=True)
    STAGE.mkdir(parents=True)
    resources = _tokenizer_resources()
    (STAGE / "resources.json").write_text(json.dumps({k: v.decode() for k, v in resources.items()}))
    if not artifact.exists():
        synthesize(artifact, LIKE, RECIPE, seed=SEED, resources=resources)
    start = time.perf_counter()
    report = compile_artifact(artifact, STAGE / "pkg", CompileOptions(target="h200", max_context=MAX_CONTEXT,
                                                                      prefill_chunk=PREFILL_CHUNK, max_batch=8))
    print(f"compiled in {time.perf_counter() - start:.1f} s: {report.stage_seconds}", flush=True)
    _stage_runtime(STAGE)
    print(f"staged {STAGE}")


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


def run_inner(out: Path) -> int:
    rate = float(subprocess.run([sys.executable, "-c", "import bench_27b; print(bench_27b._matmul_rate())"],
                        cwd=str(Path(__file__).parent), capture_output=True, text=True,
                        env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TVM_USE_RUNTIME_LIB")}
                        ).stdout.strip() or "nan")
    from ninfer_compiler.convert.synth import synthesize
    from ninfer_runtime.bench import run_bench
    from ninfer_runtime.runner import ModelRunner, RunnerOptions

    artifact = Path("/tmp/perf-27b.ninfer")
    if not artifact.exists():
        resources = {k: v.encode() for k, v in json.loads((STAGE / "resources.json").read_text()).items()}
        start = time.perf_counter()
        synthesize(artifact, LIKE, RECIPE, seed=SEED, resources=resources)
        print(f"synthesized {artifact} in {time.perf_counter() - start:.1f} s", flush=True)
    start = time.perf_counter()
    runner = ModelRunner(STAGE / "pkg", artifact=artifact, options=RunnerOptions(max_active=8, context_bytes=24 << 30))
    print(f"loaded in {time.perf_counter() - start:.1f} s", flush=True)
    report = run_bench(runner, prompt_len=PROMPT_LEN, decode_tokens=32, concurrency=[1, 2, 4, 8], repeats=3)
    results = {"bf16_matmul_tflops": rate, "bench": report.as_json()}
    print(report.table(), flush=True)
    if LONG_PROMPT:
        long = run_bench(runner, prompt_len=LONG_PROMPT, decode_tokens=32, concurrency=[], repeats=1, warmup=0)
        results["long_prompt"] = long.as_json()
        print(long.table(), flush=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print(f"bf16 matmul (torch, 8192^3): {rate:.0f} TFLOP/s")
    return 0


PROMPT_LEN = int(os.environ.get("NINFER_BENCH_PROMPT", "7680"))
LONG_PROMPT = int(os.environ.get("NINFER_BENCH_LONG_PROMPT", "65536"))  # 0 skips it


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=["prepare", "run", "run-inner"])
    parser.add_argument("--artifact", type=Path, default=Path("/tmp/perf/27b.ninfer"))
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/perf-out")))
    args = parser.parse_args()
    if args.step == "prepare":
        prepare(args.artifact)
        return 0
    if args.step == "run":
        return run_outer(args.out)
    return run_inner(args.out)


if __name__ == "__main__":
    sys.exit(main())
