"""`ninfer inspect FILE [--json] [--verify] [--export NAME -o OUT.npy]`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
import numpy as np

from ninfer_runtime.artifact import Artifact, ArtifactError
from ninfer_runtime.artifact.summary import export, summarize, verify

from .progress import byte_progress


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError


def _print_summary(info: dict) -> None:
    out = click.echo
    out(f"artifact   {info['path']}")
    out(f"id         {info['artifact_id']}")
    if info["name"]:
        out(f"name       {info['name']}")
    out(f"payload    {_size(info['payload_bytes'])} in {len(info['files'])} file(s); JSON {info['json_bytes']} bytes")
    out(f"objects    {info['tensors']} tensors, {info['resources']} resources; "
        f"{info['bindings']} bindings, {info['uses']} uses")
    out("")
    out("components")
    for name, comp in info["components"].items():
        target = f" -> {comp['target']}" if comp["target"] else ""
        out(f"  {name}{target}  ({comp['bindings']} bindings, {comp['config_keys']} config keys)")
        for key, value in comp["config"].items():
            out(f"    {key}: {json.dumps(value)}")
        if comp["proposal"]:
            out(f"    proposal: {json.dumps(comp['proposal'])}")
        for role, nbytes in comp["resources"].items():
            out(f"    resource {role}: {_size(nbytes)}")
    out("")
    out("objects by format/layout")
    width = max(len(k) for k in info["by_format"])
    for key, row in info["by_format"].items():
        out(f"  {key:<{width}}  {row['objects']:>7}  {_size(row['bytes']):>12}")
    out("")
    out("files")
    for i, f in enumerate(info["files"]):
        out(f"  [{i}] {f['path']}  payload {_size(f['payload_bytes'])}")


@click.command("inspect")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--verify", "do_verify", is_flag=True, help="Decode every tensor once and report non-finite values.")
@click.option("--strict", is_flag=True, help="Check every object's encoding rules at open.")
@click.option("--export", "export_name", metavar="NAME", help="A binding name or object id to export as float32.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="Output .npy for --export.")
def inspect(file: Path, as_json: bool, do_verify: bool, strict: bool, export_name: str | None, output: Path | None) -> None:
    """Show what FILE holds: components, configs, objects by format/layout, resources and parts."""
    if export_name and output is None:
        raise click.UsageError("--export needs -o/--output OUT.npy")
    if output is not None and not export_name:
        raise click.UsageError("-o/--output is only used with --export NAME")
    try:
        with Artifact(file, strict=strict) as art:
            if export_name:
                values = export(art, export_name)
                np.save(output, values)
                click.echo(f"wrote {output}: {export_name} {values.dtype} {list(values.shape)}", err=True)
                return
            info = summarize(art)
            report = None
            if do_verify:
                total = sum(o.bytes for o in art.objects)
                with byte_progress("verifying", total, enabled=not as_json) as advance:
                    report = verify(art, advance)
                info["verify"] = report.as_json()
    except ArtifactError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    if as_json:
        click.echo(json.dumps(info, indent=2, ensure_ascii=False))
    else:
        _print_summary(info)
        if report is not None:
            click.echo("")
            state = "OK" if report.ok else "PROBLEMS FOUND"
            click.echo(f"verify     {state}: {report.tensors} tensors, {report.elements} values decoded")
            for oid, count in report.nonfinite.items():
                click.echo(f"  non-finite values: {oid}: {count}")
            for oid, message in report.errors.items():
                click.echo(f"  damaged: {oid}: {message}")
    if report is not None and not report.ok:
        sys.exit(1)
