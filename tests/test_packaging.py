"""The distribution lists every package, and the runtime never imports the compiler."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMPORT_NAMES = {"runtime": "ninfer_runtime"}


def _package_dirs() -> set[str]:
    found = set()
    for top in ("ninfer_compiler", "ninfer_cli", "runtime"):
        for init in (ROOT / top).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT).parts
            found.add(".".join((IMPORT_NAMES.get(rel[0], rel[0]), *rel[1:])))
    return found


def test_pyproject_lists_every_package():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = set(config["tool"]["setuptools"]["packages"])
    assert listed == _package_dirs()


def test_runtime_never_imports_the_compiler():
    offenders = []
    for path in (ROOT / "runtime").rglob("*.py"):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] in ("ninfer_compiler", "ninfer_cli")]
    assert not offenders, offenders
