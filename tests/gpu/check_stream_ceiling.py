#!/usr/bin/env python3
"""The streaming ceiling of a decode step made of one launch per projection (`stream_ceiling.cu`),
of one projection's bytes at the decode GEMV's launch geometry by copy mechanism
(`copy_geometry.cu`, `--program copy_geometry`), and of the step with L2 prefetches of the next
projection's weights during the small kernels (`l2_window.cu`, `--program l2_window`).

    .venv/bin/python tests/gpu/check_stream_ceiling.py build        # build machine: nvcc, sm_90a, all three
    python3 tests/gpu/check_stream_ceiling.py run --out $OUT [--program copy_geometry|l2_window]   # GPU machine

The program replays the Qwen3.6-27B decode step's launch sequence with kernels that only read the
weight bytes of each projection (and spin kernels in place of the small kernels between them) in one
CUDA graph, PDL off / after the wait / partly / wholly before it, and prints ms per step against one
launch reading all 15.39 GB; then the same chain with no bytes to read (what the launches and their
dependencies cost alone). What it answers: how close to the copy bandwidth a step of ~257
projection launches can get at all, before any GEMV math, i.e. what the per-launch structure costs
(docs/performance.md, "eleventh pass"). `copy_geometry.cu` reads the 27B's mid-size projections'
weight planes in the v4 GEMV's pattern and grid with per-lane cp.async rings, register loads and
bulk copies (TMA) of rows or of contiguous stages, against a grid-stride read of the same bytes
(docs/kernels/decode-gemv-v4.md, "twelfth pass"). `l2_window.cu`: docs/performance.md,
"twenty-third pass".
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STAGE = ROOT / ".cache" / "ninfer" / "stream-ceiling"
PROGRAMS = ("stream_ceiling", "copy_geometry", "l2_window")  # <name>.cu next to this script -> STAGE / <name>


def build() -> int:
    sys.path.insert(0, str(ROOT))
    from ninfer_compiler.codegen.toolchain import nvcc_path

    STAGE.mkdir(parents=True, exist_ok=True)
    for name in PROGRAMS:
        binary = STAGE / name
        cmd = [str(nvcc_path()), "-O3", "-std=c++17", "-arch=sm_90a", "-o", str(binary),
               str(Path(__file__).with_name(f"{name}.cu"))]
        subprocess.run(cmd, check=True)
        print(f"built {binary} ({binary.stat().st_size // 1024} KiB)")
    return 0


def run(out: Path, reps: int, program: str = "stream_ceiling") -> int:
    binary = STAGE / program
    if not binary.exists():
        print(f"{binary} is missing: run `check_stream_ceiling.py build` on the build machine and carry "
              f"{STAGE.relative_to(ROOT)}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([str(binary), str(reps)], capture_output=True, text=True, check=False)
    (out / f"{program}.log").write_text(proc.stdout + proc.stderr)
    print(proc.stdout + proc.stderr, end="")
    if proc.returncode != 0:
        return proc.returncode
    line = next(x for x in proc.stdout.splitlines() if x.startswith("json "))
    (out / f"{program}.json").write_text(json.dumps(json.loads(line[5:]), indent=1))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("build")
    r = sub.add_parser("run")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--reps", type=int, default=9)
    r.add_argument("--program", choices=PROGRAMS, default="stream_ceiling")
    a = ap.parse_args()
    if a.cmd == "run" and a.reps < 1:
        ap.error("--reps must be at least 1")
    return build() if a.cmd == "build" else run(a.out, a.reps, a.program)


if __name__ == "__main__":
    raise SystemExit(main())
