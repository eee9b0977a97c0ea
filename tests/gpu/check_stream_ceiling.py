#!/usr/bin/env python3
"""The streaming ceiling of a decode step made of one launch per projection (`stream_ceiling.cu`).

    .venv/bin/python tests/gpu/check_stream_ceiling.py build        # build machine: nvcc, sm_90a
    python3 tests/gpu/check_stream_ceiling.py run --out $OUT         # GPU machine: the CUDA runtime only

The program replays the Qwen3.6-27B decode step's launch sequence with kernels that only read the
weight bytes of each projection (and spin kernels in place of the small kernels between them) in one
CUDA graph, PDL off / after the wait / partly / wholly before it, and prints ms per step against one
launch reading all 15.39 GB; then the same chain with no bytes to read (what the launches and their
dependencies cost alone). What it answers: how close to the copy bandwidth a step of ~257
projection launches can get at all, before any GEMV math, i.e. what the per-launch structure costs
(docs/performance.md, "eleventh pass").
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STAGE = ROOT / ".cache" / "ninfer" / "stream-ceiling"
SOURCE = Path(__file__).with_name("stream_ceiling.cu")
BINARY = STAGE / "stream_ceiling"


def build() -> int:
    sys.path.insert(0, str(ROOT))
    from ninfer_compiler.codegen.toolchain import nvcc_path

    STAGE.mkdir(parents=True, exist_ok=True)
    cmd = [str(nvcc_path()), "-O3", "-std=c++17", "-arch=sm_90a", "-o", str(BINARY), str(SOURCE)]
    subprocess.run(cmd, check=True)
    print(f"built {BINARY} ({BINARY.stat().st_size // 1024} KiB)")
    return 0


def run(out: Path, reps: int) -> int:
    if not BINARY.exists():
        print(f"{BINARY} is missing: run `check_stream_ceiling.py build` on the build machine and carry "
              f"{STAGE.relative_to(ROOT)}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([str(BINARY), str(reps)], capture_output=True, text=True, check=False)
    (out / "stream_ceiling.log").write_text(proc.stdout + proc.stderr)
    print(proc.stdout + proc.stderr, end="")
    if proc.returncode != 0:
        return proc.returncode
    line = next(x for x in proc.stdout.splitlines() if x.startswith("json "))
    (out / "stream_ceiling.json").write_text(json.dumps(json.loads(line[5:]), indent=1))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("build")
    r = sub.add_parser("run")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--reps", type=int, default=9)
    a = ap.parse_args()
    if a.cmd == "run" and a.reps < 1:
        ap.error("--reps must be at least 1")
    return build() if a.cmd == "build" else run(a.out, a.reps)


if __name__ == "__main__":
    raise SystemExit(main())
