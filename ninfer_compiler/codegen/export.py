"""Write a compiled executable as one shared library, cross-linking for foreign hosts.

The host code's machine comes from the TVM target's host (`mtriple`); when it is not this
machine's, the objects are linked by `<triple>-g++` (Debian's `g++-aarch64-linux-gnu` for the
DGX Spark), which `scripts/setup.sh` installs.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from ninfer_runtime.targets import Target

from .targets import is_cross
from .toolchain import ToolchainError


def cross_compiler(target: Target) -> str | None:
    """The C++ driver that links `target`'s host code, or None for this machine's default."""
    if not is_cross(target):
        return None
    cc = f"{target.host_triple}-g++"
    if shutil.which(cc) is None:
        raise ToolchainError(
            f"target {target.name} has {target.host_triple} host code, which needs the cross compiler {cc} "
            f"(Debian: apt-get install g++-{target.host_triple.replace('_', '-')}; scripts/setup.sh does this as root)"
        )
    return cc


def export_library(executable: Any, path: str | Path, target: Target) -> Path:
    """`executable.export_library(path)`, with the cross linker when the host is foreign."""
    path = Path(path)
    cc = cross_compiler(target)
    if cc is None:
        executable.export_library(str(path))
    else:
        executable.export_library(str(path), cc=cc)
    return path
