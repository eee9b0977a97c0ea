"""`ninfer serve PKG [--config FILE] [flags]`: OpenAI- and Anthropic-compatible HTTP server."""

from __future__ import annotations

import sys

import click

from ninfer_runtime.config import ResolvedConfig

from .config_options import config_options


@click.command("serve")
@config_options(model_argument=True)
def serve(config: ResolvedConfig) -> None:
    """Serve a compiled package (PKG or model.path) over OpenAI- and Anthropic-compatible HTTP.

    Loopback only unless --host says otherwise; see docs/serve.md.
    """
    from ninfer_runtime.serve.server import run

    sys.exit(run(config.config, sys.argv))
