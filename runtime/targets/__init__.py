"""Declarative target descriptions (one TOML file per target), shared by compiler and runtime.

The compiler reads them to choose code generation; the runtime reads the target a package was
built for to check that it runs on a matching device.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from importlib import resources

FIELDS = {
    "name", "description", "device", "cuda_arch", "host_triple", "memory_bytes", "sm_count",
    "max_shared_memory_per_block", "activation_dtype", "kv_dtype", "formats", "tensor_core_formats",
}


class TargetError(ValueError):
    """An unknown target name or a malformed target description."""


@dataclass(frozen=True)
class Target:
    name: str
    description: str
    device: str  # "cpu" or "cuda"
    host_triple: str
    activation_dtype: str
    kv_dtype: str
    formats: tuple[str, ...]
    tensor_core_formats: tuple[str, ...] = ()
    cuda_arch: str | None = None
    memory_bytes: int | None = None
    sm_count: int | None = None
    max_shared_memory_per_block: int | None = None

    @property
    def is_cuda(self) -> bool:
        return self.device == "cuda"


def names() -> list[str]:
    return sorted(p.name.removesuffix(".toml") for p in resources.files(__name__).iterdir() if p.name.endswith(".toml"))


def load(name: str) -> Target:
    """The target called `name` (`cpu`, `h200`, `rtx5090`, `dgx-spark`)."""
    path = resources.files(__name__) / f"{name}.toml"
    if not path.is_file():
        raise TargetError(f"unknown target {name!r}; choose one of {', '.join(names())}")
    raw = tomllib.loads(path.read_text())
    unknown = set(raw) - FIELDS
    if unknown:
        raise TargetError(f"target file {name}.toml has unknown field(s) {', '.join(sorted(unknown))}")
    if raw.get("name") != name:
        raise TargetError(f"target file {name}.toml names itself {raw.get('name')!r}")
    if raw.get("device") not in ("cpu", "cuda"):
        raise TargetError(f"target {name}: device must be 'cpu' or 'cuda'")
    if raw["device"] == "cuda" and not raw.get("cuda_arch"):
        raise TargetError(f"target {name}: a cuda target needs cuda_arch")
    raw["formats"] = tuple(raw.get("formats", ()))
    raw["tensor_core_formats"] = tuple(raw.get("tensor_core_formats", ()))
    return Target(**raw)
