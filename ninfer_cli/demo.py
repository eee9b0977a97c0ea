"""The main job on the embedded default model: build, convert, compile for `cpu`, answer a prompt.

`python -m ninfer_cli.demo` (run by `scripts/setup.sh`) goes through the whole product with the
tiny random Qwen3.5 Dense model that the project generates itself:

    ninfer testmodel qwen3_5 -o out/tiny/hf
    ninfer convert out/tiny/hf -o out/tiny/model.ninfer --recipe groupwise-int
    ninfer compile out/tiny/model.ninfer --target cpu -o out/tiny/pkg
    ninfer run --config examples/configs/cpu-tiny.toml --prompt "..."

Steps whose output already exists are skipped, so re-running is quick. The weights are random, so
the answer is nonsense; what the run shows is the pipeline and the report.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from click.testing import CliRunner

from .main import cli

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "out" / "tiny"
PROMPT = "Name three rivers and one fact about each."


def _step(args: list[str]) -> None:
    print("$ ninfer " + " ".join(args), file=sys.stderr, flush=True)
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    if result.exit_code != 0:
        sys.exit(result.exit_code)


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    hf, artifact, package = OUT / "hf", OUT / "model.ninfer", OUT / "pkg"
    if not (hf / "config.json").exists():
        shutil.rmtree(hf, ignore_errors=True)
        _step(["testmodel", "qwen3_5", "-o", str(hf)])
    if not artifact.exists():
        _step(["convert", str(hf), "-o", str(artifact), "--recipe", "groupwise-int"])
    if not (package / "manifest.json").exists():
        shutil.rmtree(package, ignore_errors=True)
        _step(["compile", str(artifact), "--target", "cpu", "-o", str(package)])
    _step(["inspect", str(artifact)])
    _step(["run", str(package), "--config", str(ROOT / "examples" / "configs" / "cpu-tiny.toml"), "--prompt", PROMPT])


if __name__ == "__main__":
    main()
