"""Entry point of the `ninfer` command.

Subcommands are imported only when invoked, so `ninfer run` on a runtime-only machine never
imports the compiler (or TVM's compiler library), and `ninfer --help` stays fast.
"""

from __future__ import annotations

import importlib
import sys

import click

# name -> "module:attribute" of a click command
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "bench": ("ninfer_cli.bench_cmd:bench", "Measure prefill and decode speed of a package."),
    "compile": ("ninfer_cli.compile_cmd:compile_", "Compile a .ninfer artifact into a package for one target."),
    "convert": ("ninfer_cli.convert_cmd:convert", "Convert a Hugging Face checkpoint to a .ninfer artifact."),
    "config": ("ninfer_cli.config_cmd:config", "Show the effective startup configuration."),
    "inspect": ("ninfer_cli.inspect_cmd:inspect", "Show or verify a .ninfer artifact; export one tensor."),
    "run": ("ninfer_cli.run_cmd:run", "Run one request on a compiled package."),
    "serve": ("ninfer_cli.serve_cmd:serve", "Serve a compiled package over OpenAI- and Anthropic-compatible HTTP."),
    "upgrade": ("ninfer_cli.upgrade_cmd:upgrade", "Upgrade a v2 .ninfer artifact to container v3."),
    "synth": ("ninfer_cli.synth_cmd:synth", "Write a full-size synthetic artifact for performance work."),
    "testmodel": ("ninfer_cli.testmodel_cmd:testmodel", "Build a tiny random Hugging Face model for tests."),
}


class LazyGroup(click.Group):
    """A click group whose subcommands live in modules imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in SUBCOMMANDS:
            return None
        target, _ = SUBCOMMANDS[name]
        module_name, attr = target.split(":")
        return getattr(importlib.import_module(module_name), attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, SUBCOMMANDS[name][1]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="ninfer")
def cli() -> None:
    """ninfer: compile .ninfer model artifacts into target-specialized packages and run them."""


def main() -> None:
    try:
        cli(standalone_mode=True)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
