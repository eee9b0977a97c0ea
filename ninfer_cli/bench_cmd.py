"""`ninfer bench PKG [--prompt-len N] [--decode-tokens N] [--decode-context N] [--concurrency 1,2,4,8] [--json FILE]`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click


def _levels(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a comma-separated list of integers") from None
    if not levels or any(c < 1 for c in levels):
        raise click.BadParameter("concurrency levels must be positive integers")
    return levels


@click.command("bench")
@click.argument("package", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--prompt-len", type=click.IntRange(min=1), default=7680, show_default=True, help="Prompt tokens of the prefill measurement.")
@click.option("--decode-tokens", type=click.IntRange(min=1), default=256, show_default=True, help="Timed decode steps per concurrency level.")
@click.option("--decode-context", type=click.IntRange(min=1), default=64, show_default=True,
              help="Tokens each decode sequence holds (prefilled) before its timed steps.")
@click.option("--concurrency", default="1,2,4,8", show_default=True, help="Comma-separated numbers of concurrent sequences.")
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True, help="Prefill repeats (the median is reported).")
@click.option("--context-bytes", type=click.IntRange(min=1), help="Context pool bytes (default: the runner's).")
@click.option("--artifact", type=click.Path(dir_okay=False, path_type=Path), help="The artifact, if it moved.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), help="Also write the results as JSON.")
def bench(package: Path, prompt_len: int, decode_tokens: int, decode_context: int, concurrency: str, repeats: int,
          context_bytes: int | None, artifact: Path | None, json_path: Path | None) -> None:
    """Measure prefill and decode speed of PACKAGE and compare decode with the copy-bandwidth roofline."""
    from ninfer_runtime.bench import run_bench
    from ninfer_runtime.package import PackageError
    from ninfer_runtime.runner import ModelRunner, RunnerOptions

    levels = _levels(concurrency)
    try:
        runner = ModelRunner(package, artifact=artifact, options=RunnerOptions(max_active=max(levels), context_bytes=context_bytes))
        report = run_bench(runner, prompt_len=prompt_len, decode_tokens=decode_tokens, concurrency=levels, repeats=repeats,
                           decode_context=decode_context)
    except (PackageError, ValueError) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    click.echo(report.table())
    if json_path:
        json_path.write_text(json.dumps(report.as_json(), indent=2) + "\n")
