"""`ninfer config show [--config FILE] [--json] [flags]` and `ninfer config validate FILE`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from ninfer_runtime.config import SECTIONS, ConfigError, FieldSpec, ResolvedConfig, load_config
from ninfer_runtime.config.loader import MASK, show_value
from ninfer_runtime.config.values import Auto, Bytes, format_bytes

from .config_options import config_options


@click.group("config")
def config() -> None:
    """Show or check the startup configuration shared by `ninfer run` and `ninfer serve`."""


@config.command("show")
@click.option("--json", "as_json", is_flag=True, help="Print the configuration as JSON.")
@config_options()
def show(config: ResolvedConfig, as_json: bool) -> None:
    """Print every setting, its effective value and where it came from (API keys masked)."""
    if as_json:
        click.echo(json.dumps(config.to_dict(), indent=2))
    else:
        click.echo(render(config))


@config.command("validate")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
def validate(file: Path) -> None:
    """Check FILE on its own (environment and flags ignored); exit 1 listing every problem."""
    try:
        resolved = load_config(file, {}, {})
    except ConfigError as e:
        for issue in e.issues:
            click.echo(str(issue), err=True)
        sys.exit(1)
    given = sum(source != "default" for source in resolved.sources.values())
    click.echo(f"{file}: ok ({given} settings given, the rest default)")


def _display(spec: FieldSpec, value: object) -> str:
    if spec.secret:
        return show_value(MASK)
    is_bytes = isinstance(spec.kind, Bytes) or isinstance(spec.kind, Auto) and isinstance(spec.kind.inner, Bytes)
    if is_bytes and isinstance(value, int):
        value = format_bytes(value)
    return show_value(value)


def render(resolved: ResolvedConfig) -> str:
    """TOML-shaped listing: `key = value  # source`; unset fields appear as comments."""
    lines = [f"# config file: {resolved.file or 'none'}",
             f"# components loaded: {', '.join(resolved.config.components)}"]
    for section in SECTIONS:
        cells = [(f"# {spec.name} is unset" if value is None else f"{spec.name} = {_display(spec, value)}", source)
                 for spec, value, source in resolved.fields() if spec.section == section]
        width = max(len(text) for text, _ in cells)
        lines += ["", f"[{section}]", *(f"{text:<{width}}  # {source}" for text, source in cells)]
    return "\n".join(lines)
