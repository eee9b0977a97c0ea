"""`ninfer convert HF_DIR -o model.ninfer --recipe bf16|groupwise-int|nvfp4`."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ninfer_runtime.artifact import ArtifactError
from ninfer_runtime.artifact.framing import DEFAULT_SHARD_LIMIT


@click.command("convert")
@click.argument("hf_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, path_type=Path), help="Artifact entry file to write.")
@click.option("--recipe", type=click.Choice(["bf16", "groupwise-int", "nvfp4"]), default="bf16", show_default=True,
              help="Numeric formats per role (groupwise-int and nvfp4 follow the official per-role assignment).")
@click.option("--shard-limit", type=click.IntRange(min=8192), default=DEFAULT_SHARD_LIMIT, show_default=True,
              help="Largest file of the artifact, in bytes; larger payloads continue in .part-NNNN files.")
def convert(hf_dir: Path, output: Path, recipe: str, shard_limit: int) -> None:
    """Convert a Hugging Face checkpoint directory (safetensors + config + tokenizer) to .ninfer v3."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from ninfer_compiler.convert.driver import convert as run_convert
    from ninfer_compiler.convert.errors import ConversionError

    console = Console(stderr=True)
    columns = (TextColumn("converting"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"))
    try:
        with Progress(*columns, console=console, transient=True, disable=not sys.stderr.isatty()) as bar:
            task = bar.add_task("", total=None)

            def progress(name: str, done: int, total: int) -> None:
                bar.update(task, completed=done, total=total, description=name)

            report = run_convert(hf_dir, output, recipe, shard_limit=shard_limit, progress=progress)
    except (ConversionError, ArtifactError, FileExistsError) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    click.echo(report.summary(), err=True)
    for oid, why in report.fallbacks.items():
        click.echo(f"  {oid}: {why}", err=True)
