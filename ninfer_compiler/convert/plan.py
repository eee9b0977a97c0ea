"""What a conversion will write, before anything is written.

An architecture's converter turns a Hugging Face checkpoint into a `ConversionPlan`: components
with their configs and resources, and stored objects (`ObjectSpec`), each holding one or more
logical parameters (`ParamSpec`) as consecutive row blocks. Each parameter says which source
tensors (and which part of them) it consumes, so completeness is checked up front: every source
tensor is consumed, or listed as unused with a reason, and no part is consumed twice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

from .errors import ConversionError
from .safetensors_reader import SafetensorsCheckpoint


class Sources:
    """Source tensors by name, loaded once per stored object (a fused source feeds several params)."""

    def __init__(self, checkpoint: SafetensorsCheckpoint) -> None:
        self.checkpoint = checkpoint
        self._cache: dict[str, np.ndarray] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._cache:
            self._cache[name] = self.checkpoint.load(name)
        return self._cache[name]

    def shape(self, name: str) -> tuple[int, ...]:
        info = self.checkpoint.tensors.get(name)
        if info is None:
            raise ConversionError(f"{self.checkpoint.directory}: missing tensor {name!r} in the checkpoint")
        return info.shape

    def clear(self) -> None:
        self._cache.clear()


Loader = Callable[[Sources], np.ndarray]


@dataclass
class ParamSpec:
    """One logical parameter (a binding) and how to compute its values from source tensors."""

    name: str
    shape: tuple[int, ...]
    load: Loader
    consumes: tuple[tuple[str, str], ...]  # (source tensor, which part: "all", "query", "expert3.gate", ...)
    inputs: tuple[str, ...] = ()  # input positions of its Uses (projections only)


@dataclass
class ObjectSpec:
    """One stored tensor holding its parameters as consecutive row blocks (or a 1-D concatenation)."""

    id: str
    role: str  # recipe role, decides the numeric format
    params: list[ParamSpec]
    layer: int | None = None
    kind: str = "weight"  # "weight": the recipe decides; "fp32"; "int32"
    aliases: list[str] = field(default_factory=list)  # more binding names for the whole object (tied head)

    @property
    def stored_shape(self) -> tuple[int, ...]:
        first = self.params[0].shape
        if len(self.params) == 1:
            return first
        if len(first) == 1:
            return (sum(p.shape[0] for p in self.params),)
        trailing = first[1:]
        for p in self.params:
            if p.shape[1:] != trailing:
                raise ConversionError(f"object {self.id}: parameters {self.params[0].name} and {p.name} differ in row width")
        return (sum(p.shape[0] for p in self.params), *trailing)


@dataclass
class ComponentSpec:
    name: str
    config: dict
    target: str | None = None
    resources: dict[str, bytes] = field(default_factory=dict)
    proposal: dict | None = None


@dataclass
class ConversionPlan:
    architecture: str
    components: list[ComponentSpec]
    objects: list[ObjectSpec]
    unused: dict[str, str] = field(default_factory=dict)  # source tensor -> why it is not converted
    family: str | None = None  # recipe family ("dense", "moe"); derived from the roles when None


def check_complete(plan: ConversionPlan, checkpoint: SafetensorsCheckpoint) -> None:
    """Every source tensor is consumed or explicitly unused; no part is consumed twice."""
    available = set(checkpoint.names())
    seen: dict[tuple[str, str], str] = {}
    consumed: set[str] = set()
    for obj in plan.objects:
        for param in obj.params:
            for source, part in param.consumes:
                if source not in available:
                    raise ConversionError(
                        f"{checkpoint.directory}: missing tensor {source!r} (needed for {param.name})"
                    )
                if (source, part) in seen:
                    raise ConversionError(f"tensor {source!r} ({part}) is bound twice: {seen[(source, part)]} and {param.name}")
                if source in plan.unused:
                    raise ConversionError(f"tensor {source!r} is both bound ({param.name}) and listed unused")
                seen[(source, part)] = param.name
                consumed.add(source)
    unknown = sorted(available - consumed - set(plan.unused))
    if unknown:
        more = f" (and {len(unknown) - 5} more)" if len(unknown) > 5 else ""
        raise ConversionError(
            f"{checkpoint.directory}: tensor(s) not bound by the {plan.architecture} converter: {', '.join(unknown[:5])}{more}"
        )


# -- small loaders -------------------------------------------------------------------------------


def whole(source: str, shape: tuple[int, ...] | None = None) -> Loader:
    def load(src: Sources) -> np.ndarray:
        value = src[source]
        return value if shape is None else value.reshape(shape)

    return load


def rows(source: str, begin: int, end: int) -> Loader:
    return lambda src: src[source][begin:end]


def as_float(value: np.ndarray) -> np.ndarray:
    """Source values as a float dtype that keeps them exact (bf16 stays bf16)."""
    if value.dtype in (np.float32, np.dtype(ml_dtypes.bfloat16), np.float16, np.float64):
        return value
    return value.astype(np.float32)
