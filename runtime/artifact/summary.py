"""What `ninfer inspect` reports about an artifact: structure summary, verification, export."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .directory import ResourceObject, TensorObject
from .errors import ArtifactError
from .reader import Artifact

CONFIG_KEYS = (
    "architectures", "model_type", "hidden_size", "num_hidden_layers", "vocab_size", "intermediate_size",
    "num_attention_heads", "num_key_value_heads", "head_dim", "num_experts", "num_experts_per_tok", "depth",
)


def summarize(art: Artifact) -> dict:
    """A JSON-ready description: identity, components, objects by format/layout, resources, parts."""
    by_kind: dict[str, dict[str, int]] = defaultdict(lambda: {"objects": 0, "bytes": 0})
    for obj in art.objects:
        key = f"{obj.format}/{obj.layout}" if isinstance(obj, TensorObject) else f"resource/{obj.encoding}"
        by_kind[key]["objects"] += 1
        by_kind[key]["bytes"] += obj.bytes
    components = {}
    for name, comp in art.components.items():
        cfg = comp.config
        components[name] = {
            "config": {k: cfg[k] for k in CONFIG_KEYS if k in cfg},
            "config_keys": len(cfg),
            "target": comp.target,
            "resources": {role: art.directory.objects_by_id[oid].bytes for role, oid in comp.resources.items()},
            "proposal": comp.proposal,
            "bindings": sum(1 for b in art.bindings if b.startswith(f"{name}/")),
        }
    parts = [
        {"path": str(p.name), "payload_bytes": f.payload_bytes}
        for p, f in zip(art.part_paths(), art.directory.files, strict=True)
    ]
    return {
        "path": str(art.path),
        "artifact_id": art.artifact_id,
        "name": art.metadata.get("name"),
        "payload_bytes": art.payload_bytes,
        "json_bytes": art.header.json_bytes,
        "components": components,
        "objects": len(art.objects),
        "tensors": sum(isinstance(o, TensorObject) for o in art.objects),
        "resources": sum(isinstance(o, ResourceObject) for o in art.objects),
        "bindings": len(art.bindings),
        "uses": len(art.uses),
        "by_format": {k: dict(v) for k, v in sorted(by_kind.items())},
        "files": parts,
        "metadata": art.metadata,
        "provenance": art.provenance,
    }


@dataclass
class VerifyReport:
    tensors: int = 0
    elements: int = 0
    nonfinite: dict[str, int] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.nonfinite and not self.errors

    def as_json(self) -> dict:
        return {
            "ok": self.ok, "tensors": self.tensors, "elements": self.elements,
            "nonfinite": self.nonfinite, "errors": self.errors,
        }


def verify(art: Artifact, progress: Callable[[int], None] | None = None) -> VerifyReport:
    """Decode every tensor once (block by block) and count non-finite values.

    Damage in one tensor is recorded and the scan goes on, so one run lists every problem.
    `progress(bytes_done)` is called after each tensor.
    """
    report = VerifyReport()
    for obj in art.objects:
        if not isinstance(obj, TensorObject):
            try:
                art.object(obj.id)
            except ArtifactError as exc:
                report.errors[obj.id] = str(exc)
            if progress:
                progress(obj.bytes)
            continue
        report.tensors += 1
        try:
            bad = 0
            for block in art.iter_row_blocks(obj.id):
                report.elements += block.size
                if block.dtype.kind == "f":
                    bad += int(block.size - np.count_nonzero(np.isfinite(block)))
            if bad:
                report.nonfinite[obj.id] = bad
        except ArtifactError as exc:
            report.errors[obj.id] = str(exc)
        if progress:
            progress(obj.bytes)
    return report


def logical_shape(art: Artifact, name: str) -> tuple[int, ...]:
    """Shape to export a binding in: the object's shape, or whole rows of a common row width."""
    binding = art.binding(name)
    if binding.whole:
        return art.tensor_object(binding.parts[0].object).shape
    trailing = None
    for part in binding.parts:
        shape = art.tensor_object(part.object).shape
        if len(shape) < 2:
            return (binding.elements,)
        row = int(np.prod(shape[1:]))
        if part.begin % row or part.end % row or (trailing is not None and trailing != shape[1:]):
            return (binding.elements,)
        trailing = shape[1:]
    assert trailing is not None
    return (binding.elements // int(np.prod(trailing)), *trailing)


def export(art: Artifact, name: str) -> np.ndarray:
    """Decoded values of a binding (logical parameter) or, failing that, an object id."""
    if name in art.bindings:
        values = art.parameter(name, logical_shape(art, name))
    elif name in art.directory.objects_by_id:
        values = art.decode(name)
    else:
        raise ArtifactError("unknown_name", f"{name!r} is neither a binding nor an object id of the artifact")
    return values if values.dtype == np.int32 else values.astype(np.float32, copy=False)
