"""`ninfer synth --like qwen3.6-27b --recipe groupwise-int -o FILE`: a full-size synthetic artifact."""

from __future__ import annotations

import sys
from pathlib import Path

import click


@click.command("synth")
@click.option("--like", type=click.Choice(["qwen3.6-27b", "qwen3.8-27b"]), required=True, help="Official model whose shapes to copy.")
@click.option("--recipe", type=click.Choice(["groupwise-int", "nvfp4"]), default="groupwise-int", show_default=True)
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, path_type=Path), help="Artifact to write.")
@click.option("--layers", type=click.IntRange(min=1), help="Keep only the first N layers (quick experiments).")
@click.option("--seed", type=int, default=0, show_default=True)
def synth(like: str, recipe: str, output: Path, layers: int | None, seed: int) -> None:
    """Write an artifact with the official shapes, formats and bindings and random valid weights."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from ninfer_compiler.convert.errors import ConversionError
    from ninfer_compiler.convert.synth import synthesize
    from ninfer_runtime.artifact import ArtifactError

    columns = (TextColumn("synthesizing"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"))
    try:
        with Progress(*columns, console=Console(stderr=True), transient=True, disable=not sys.stderr.isatty()) as bar:
            task = bar.add_task("", total=None)
            summary = synthesize(output, like, recipe, layers=layers, seed=seed,
                                 progress=lambda name, done, total: bar.update(task, completed=done, total=total, description=name))
    except (ConversionError, ArtifactError, FileExistsError) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    parts = ", ".join(f"{fmt} {n / 1e9:.2f} GB" for fmt, n in sorted(summary["bytes_by_format"].items()))
    click.echo(f"wrote {output}: {summary['objects']} objects, {summary['bytes'] / 1e9:.2f} GB ({parts}) "
               f"in {summary['seconds']:.1f} s", err=True)
