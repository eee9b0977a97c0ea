"""Binding names of the Qwen3.5 Dense `text` component <-> module parameters of `model.py`.

The model's module paths mirror the binding names (`layers.3.attention.query` is
`text/layers/3/attention/query`), so the binder is a name transform plus two checks: every
parameter the model declares has a binding of the right size, and every binding's stored format
is one the target's kernels consume. The weight plan handed to the model is read off the
artifact, so weights are consumed in the format they are stored in, never re-encoded.
"""

from __future__ import annotations

from ninfer_runtime.artifact import Artifact, ArtifactError
from ninfer_runtime.targets import Target
from ninfer_runtime.weights import ParamEntry

from ..options import WeightPlan
from .config import Qwen35TextConfig

PLANES = ("base", "high", "scales", "codes", "block_scales", "divisor", "row_scales")  # grouped-int, nvfp4, fp8 row
# artifact format -> the weight plan's name for it
PLAN_FORMATS = {"bf16": "bfloat16", "fp32": "float32", "q4_g64_fp16": "q4_g64_fp16", "q5_g64_fp16": "q5_g64_fp16",
                "q6_g64_fp16": "q6_g64_fp16", "q8_g32_fp16": "q8_g32_fp16", "nvfp4": "nvfp4",
                "fp8_e4m3fn_row_bf16": "fp8_e4m3fn_row_bf16"}


class BindingError(ValueError):
    """The artifact's bindings do not fit the model (missing, wrong size, unsupported format)."""


def model_config(art: Artifact) -> Qwen35TextConfig:
    text = art.components.get("text")
    if text is None:
        raise BindingError("the artifact has no text component")
    return Qwen35TextConfig.from_dict(text.config)


def module_path(binding: str) -> str:
    return binding.removeprefix("text/").replace("/", ".")


def binding_of(param_name: str) -> tuple[str, str]:
    """`layers.0.gdn.query.base` -> (`text/layers/0/gdn/query`, `base`); dense -> plane `value`."""
    parts = param_name.split(".")
    plane = "value"
    if parts[-1] in PLANES:
        plane = parts.pop()
    elif parts[-1] == "weight":
        parts.pop()
    return "text/" + "/".join(parts), plane


def weight_plan(art: Artifact, target: Target) -> WeightPlan:
    """One exact override per text binding: its stored format."""
    overrides = []
    for name, binding in art.bindings.items():
        if not name.startswith("text/"):
            continue
        formats = {art.tensor_object(p.object).format for p in binding.parts}
        if len(formats) != 1:
            raise BindingError(f"binding {name} mixes formats {sorted(formats)}")
        fmt = formats.pop()
        if fmt not in target.formats or fmt not in PLAN_FORMATS:
            raise BindingError(
                f"binding {name} is stored as {fmt}, which is not supported on target {target.name} "
                f"(supported: {', '.join(f for f in target.formats if f in PLAN_FORMATS)})"
            )
        if fmt == "int32":
            continue
        overrides.append((module_path(name), PLAN_FORMATS[fmt]))
    return WeightPlan(default="float32", overrides=tuple(overrides))


def param_entries(art: Artifact, params) -> list[ParamEntry]:
    """Manifest entries for the exported parameters, checked against the artifact's bindings."""
    entries = []
    for p in params:
        binding, plane = binding_of(p.name)
        if binding not in art.bindings:
            raise BindingError(f"the model needs binding {binding} (parameter {p.name}), the artifact has none")
        entry = ParamEntry(p.name, binding, plane, tuple(p.shape), p.dtype)
        if plane == "value":
            have = art.binding(binding).elements
            want = 1
            for d in entry.shape:
                want *= d
            if have != want:
                raise BindingError(f"binding {binding} has {have} elements, parameter {p.name} {list(entry.shape)} needs {want}")
        entries.append(entry)
    return entries


def check_loadable(art: Artifact, entries: list[ParamEntry]) -> None:
    """Read the first parameter of each kind once, so layout mistakes fail at compile time."""
    from ninfer_runtime.weights import load_param

    seen = set()
    for entry in entries:
        stored = art.tensor_object(art.binding(entry.binding).parts[0].object).format  # nvfp4 and fp8 share `codes`
        key = (stored, entry.plane, entry.dtype)
        if key in seen:
            continue
        seen.add(key)
        try:
            load_param(art, entry)
        except ArtifactError as exc:
            raise BindingError(str(exc)) from None
