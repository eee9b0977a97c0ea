"""`ninfer compile ARTIFACT --target cpu -o PKG [--max-context N]`."""

from __future__ import annotations

import sys
from pathlib import Path

import click

TARGETS = ("cpu", "h200", "rtx5090", "dgx-spark")


@click.command("compile")
@click.argument("artifact", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--target", type=click.Choice(TARGETS), default="cpu", show_default=True, help="Target to compile for.")
@click.option("-o", "--output", required=True, type=click.Path(file_okay=False, path_type=Path), help="Package directory to create.")
@click.option("--max-context", type=click.IntRange(min=1), help="Tokens of one request (prompt + output); default: the model's, at most 32768.")
@click.option("--prefill-chunk", type=click.IntRange(min=16), default=512, show_default=True, help="Prompt tokens per prefill call.")
@click.option("--max-batch", type=click.IntRange(1, 8), default=8, show_default=True, help="Sequences per decode call.")
def compile_(artifact: Path, target: str, output: Path, max_context: int | None, prefill_chunk: int, max_batch: int) -> None:
    """Compile ARTIFACT into a package specialized for one target."""
    from rich.console import Console

    from ninfer_compiler.compile import (
        CompileError,
        CompileOptions,
        compile_artifact,
        remove_package,
    )
    from ninfer_runtime.artifact import ArtifactError

    console = Console(stderr=True)
    existed = output.exists()
    options = CompileOptions(target=target, max_context=max_context, prefill_chunk=prefill_chunk, max_batch=max_batch)
    stages = {"bind": "binding weights", "export": "exporting Relax IR", "compile": "running passes and code generation",
              "package": "writing the package"}
    order = list(stages)
    try:
        with console.status(stages["bind"]) as status:

            def stage(name: str) -> None:
                i = order.index(name)
                console.print(f"  {name:<8} done", highlight=False)
                if i + 1 < len(order):
                    status.update(stages[order[i + 1]])

            report = compile_artifact(artifact, output, options, stage=stage)
    except (CompileError, ArtifactError) as exc:
        if not existed:
            remove_package(output)
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except BaseException:
        if not existed:
            remove_package(output)
        raise
    times = ", ".join(f"{k} {v:.1f} s" for k, v in report.stage_seconds.items())
    click.echo(f"wrote {output} for {report.target} in {report.seconds:.1f} s ({times}); "
               f"library {report.library_bytes / 1e6:.1f} MB", err=True)
