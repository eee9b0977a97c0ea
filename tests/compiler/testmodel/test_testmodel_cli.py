"""`ninfer testmodel ARCH -o DIR [--seed N]`."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from ninfer_cli.main import cli
from ninfer_cli.testmodel_cmd import ARCHS as CLI_ARCHS
from ninfer_compiler.testmodel.configs import ARCHS
from ninfer_compiler.testmodel.factory import weight_stats


def test_cli_builds_model(tmp_path: Path) -> None:
    out = tmp_path / "glm"
    result = CliRunner().invoke(cli, ["testmodel", "glm5_next", "-o", str(out), "--seed", "1"])
    assert result.exit_code == 0, result.output
    count, size = weight_stats(out)
    lines = result.output.strip().splitlines()
    assert lines == [f"glm5_next (seed 1): {count:,} parameters, {size:,} bytes -> {out}"]
    assert (out / "config.json").is_file() and (out / "tokenizer.json").is_file()


def test_cli_rejects_unknown_arch(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["testmodel", "llama", "-o", str(tmp_path)])
    assert result.exit_code == 2
    assert "llama" in result.output


def test_cli_lists_every_arch() -> None:
    assert CLI_ARCHS == ARCHS
    result = CliRunner().invoke(cli, ["--help"])
    assert "testmodel" in result.output
