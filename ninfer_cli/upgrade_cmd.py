"""`ninfer upgrade OLD.ninfer -o NEW.ninfer`: one-way v2 -> v3 container upgrade."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ninfer_runtime.artifact import ArtifactError
from ninfer_runtime.artifact.framing import DEFAULT_SHARD_LIMIT
from ninfer_runtime.artifact.upgrade import upgrade as run_upgrade

from .progress import byte_progress


@click.command("upgrade")
@click.argument("old", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, path_type=Path), help="New v3 entry file.")
@click.option("--chat-template", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Replacement chat template (placed last, as the upstream upgrade does).")
@click.option("--shard-limit", type=click.IntRange(min=8192), default=DEFAULT_SHARD_LIMIT, show_default=True,
              help="Largest file of the new set, in bytes.")
def upgrade(old: Path, output: Path, chat_template: Path | None, shard_limit: int) -> None:
    """Upgrade the v2 artifact OLD to container v3 (only registered upstream identities)."""
    template = chat_template.read_bytes() if chat_template else None
    try:
        with byte_progress("upgrading", old.stat().st_size) as advance:
            path = run_upgrade(old, output, chat_template=template, shard_limit=shard_limit, progress=advance)
    except ArtifactError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except FileExistsError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    click.echo(f"wrote {path}", err=True)
