"""Click options for the startup configuration: declare the flags once, receive the config.

    @click.command("serve")
    @config_options(model_argument=True)                      # every field, plus MODEL
    def serve(config: ResolvedConfig) -> None: ...

    @click.command("run")
    @click.option("--prompt")
    @config_options("model", "context", "engine", "speculative", "vision", "offload",
                    "distributed", "sampling", "logging", model_argument=True)
    def run(config: ResolvedConfig, prompt: str | None) -> None: ...

The decorator adds `--config FILE` and one flag per selected field (the flag named in the model,
e.g. `--kv-dtype`, `--spec`, `--vision/--no-vision`), all defaulting to "not given". When the
command runs it resolves defaults < file (--config, else $NINFER_CONFIG) < NINFER_* environment
< given flags, and passes the result as `config`; an invalid configuration exits 1 listing every
problem. Flag values are parsed by the configuration model, so errors name the flag, the key and
the allowed values the same way for files, environment and flags.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path

import click

from ninfer_runtime.config import (
    FIELDS,
    SECTIONS,
    ConfigError,
    FieldSpec,
    ResolvedConfig,
    load_config,
)
from ninfer_runtime.config.values import Bool, TextList


def option_fields(*selectors: str) -> list[FieldSpec]:
    """Fields named by section ("context") or key ("server.port"); no selector: every field."""
    unknown = [s for s in selectors if s not in SECTIONS and s not in FIELDS]
    if unknown:
        raise ValueError(f"unknown configuration sections or keys: {', '.join(unknown)}")
    if not selectors:
        return list(FIELDS.values())
    return [spec for key, spec in FIELDS.items() if key in selectors or spec.section in selectors]


def param_name(spec: FieldSpec) -> str:
    """The click parameter name of a field's flag ("server.port" -> "server__port")."""
    return spec.key.replace(".", "__")


def _option(spec: FieldSpec) -> Callable:
    env = f", ${spec.env}" if spec.env else ""
    help_text = f"{spec.doc} [{spec.key}{env}]"
    name = param_name(spec)
    if isinstance(spec.kind, Bool):
        return click.option(f"{spec.flag}/--no-{spec.flag[2:]}", name, default=None, help=help_text)
    multiple = isinstance(spec.kind, TextList)
    return click.option(spec.flag, name, default=None, multiple=multiple, metavar=spec.kind.metavar,
                        help=help_text + (" (repeatable)" if multiple else ""))


def resolve(config_file: Path | None, overrides: dict[str, object],
            flag_names: dict[str, str] | None = None) -> ResolvedConfig:
    """load_config with the process environment; errors become a click error (exit 1)."""
    try:
        return load_config(config_file, os.environ, overrides, flag_names=flag_names)
    except ConfigError as e:
        raise click.ClickException(f"invalid configuration:\n{e}") from None


def config_options(*selectors: str, model_argument: bool = False) -> Callable[[Callable], Callable]:
    """Add --config and the selected fields' flags; call the command with `config=ResolvedConfig`.

    `model_argument` adds an optional positional MODEL that sets model.path (then --model is
    not added).
    """
    specs = [s for s in option_fields(*selectors) if not (model_argument and s.key == "model.path")]

    def decorate(func: Callable) -> Callable:
        @functools.wraps(func)
        def wrapper(*args: object, **kwargs: object) -> object:
            config_file = kwargs.pop("config_file")
            overrides = {spec.key: kwargs.pop(param_name(spec)) for spec in specs}
            names = {spec.key: f"--no-{spec.flag[2:]}" for spec in specs if overrides[spec.key] is False}
            if model_argument:
                overrides["model.path"], names["model.path"] = kwargs.pop("model"), "MODEL"
            return func(*args, config=resolve(config_file, overrides, names), **kwargs)

        for spec in reversed(specs):
            wrapper = _option(spec)(wrapper)
        wrapper = click.option(
            "--config", "config_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
            help="Startup configuration TOML; flags override it [$NINFER_CONFIG].")(wrapper)
        if model_argument:
            wrapper = click.argument("model", required=False, type=click.Path(path_type=Path))(wrapper)
        return wrapper

    return decorate
