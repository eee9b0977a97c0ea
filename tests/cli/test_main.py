"""Every registered subcommand imports and has help; `ninfer --help` lists them all."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from ninfer_cli.main import SUBCOMMANDS, cli


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_subcommand_help(name):
    result = CliRunner().invoke(cli, [name, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output


def test_top_level_help_lists_commands():
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    for name in SUBCOMMANDS:
        assert name in result.output


def test_unknown_command():
    result = CliRunner().invoke(cli, ["frobnicate"])
    assert result.exit_code == 2 and "No such command" in result.output
