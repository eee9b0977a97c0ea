"""`ninfer testmodel`: write a tiny random Hugging Face checkpoint for tests and experiments."""

from __future__ import annotations

from pathlib import Path

import click

# Kept in sync with ninfer_compiler.testmodel.configs.ARCHS (a test checks it); listed here so
# `--help` works without importing torch and transformers.
ARCHS = ("qwen3_5", "qwen3_5_moe", "qwen4_exp", "glm5_next")


@click.command("testmodel")
@click.argument("arch", type=click.Choice(ARCHS))
@click.option(
    "-o",
    "--output",
    "output",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory to write the model into (created if missing).",
)
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the random weights.")
def testmodel(arch: str, output: Path, seed: int) -> None:
    """Build the tiny random ARCH model of the compiler tests (models.md section 9)."""
    from ninfer_compiler.testmodel.factory import build_hf_model, weight_stats

    path = build_hf_model(arch, output, seed=seed)
    count, size = weight_stats(path)
    click.echo(f"{arch} (seed {seed}): {count:,} parameters, {size:,} bytes -> {path}")
