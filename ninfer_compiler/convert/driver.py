"""`ninfer convert`: a Hugging Face checkpoint directory -> a `.ninfer` v3 artifact.

The architecture's converter makes a plan; completeness is checked before anything is written;
objects are then encoded one by one (quantized per the recipe) and streamed into the artifact
writer, which publishes the files only after everything is written and validated.
"""

from __future__ import annotations

import importlib
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import ml_dtypes
import numpy as np

from ninfer_runtime.artifact import ArtifactWriter
from ninfer_runtime.artifact.framing import DEFAULT_SHARD_LIMIT
from ninfer_runtime.artifact.quantize import quantize_fp8_row, quantize_grouped, quantize_nvfp4

from . import recipes
from .errors import ConversionError
from .hf_dir import HFModelDir, load_hf_dir
from .plan import ConversionPlan, ObjectSpec, Sources, check_complete

# HF top-level model_type -> module with `plan(hf: HFModelDir, recipe: str) -> ConversionPlan`
ARCHITECTURES = {
    "qwen3_5": "ninfer_compiler.frontend.qwen3_5.convert",
    "qwen3_5_text": "ninfer_compiler.frontend.qwen3_5.convert",
    "qwen3_5_moe": "ninfer_compiler.frontend.qwen3_5_moe.convert",
    "qwen3_5_moe_text": "ninfer_compiler.frontend.qwen3_5_moe.convert",
    "qwen4_exp": "ninfer_compiler.frontend.qwen4_exp.convert",
    "qwen4_exp_text": "ninfer_compiler.frontend.qwen4_exp.convert",
    "glm5_next": "ninfer_compiler.frontend.glm5_next.convert",
}


@dataclass
class ConversionReport:
    path: Path
    architecture: str
    recipe: str
    objects: int = 0
    bindings: int = 0
    bytes_by_format: Counter = field(default_factory=Counter)
    fallbacks: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    def summary(self) -> str:
        total = sum(self.bytes_by_format.values())
        parts = ", ".join(f"{fmt} {n / 1e6:.2f} MB" for fmt, n in sorted(self.bytes_by_format.items()))
        text = (f"{self.path}: {self.architecture}, recipe {self.recipe}, {self.objects} objects, "
                f"{self.bindings} bindings, {total / 1e6:.2f} MB ({parts}) in {self.seconds:.1f} s")
        if self.fallbacks:
            text += f"; {len(self.fallbacks)} object(s) kept in another format (shape does not fit the recipe)"
        return text


def make_plan(hf: HFModelDir, recipe: str) -> ConversionPlan:
    recipes.check_recipe(recipe)
    module_name = ARCHITECTURES.get(hf.model_type)
    if module_name is None:
        raise ConversionError(
            f"{hf.path / 'config.json'}: unknown model_type {hf.model_type!r}; "
            f"supported: {', '.join(sorted(k for k in ARCHITECTURES if not k.endswith('_text')))}"
        )
    return importlib.import_module(module_name).plan(hf, recipe)


def convert(
    hf_path: str | Path,
    out: str | Path,
    recipe: str = "bf16",
    *,
    shard_limit: int = DEFAULT_SHARD_LIMIT,
    progress: Callable[[str, int, int], None] | None = None,
) -> ConversionReport:
    """Convert; on any error nothing is left under the output name."""
    start = time.monotonic()
    out = Path(out)
    if out.exists():
        raise ConversionError(f"{out} already exists; refusing to overwrite it")
    hf = load_hf_dir(hf_path)
    try:
        plan = make_plan(hf, recipe)
        check_complete(plan, hf.checkpoint)
        report = ConversionReport(out, plan.architecture, recipe)
        family = plan.family or _family(plan)
        provenance = {
            "converter": "ninfer convert",
            "recipe": recipe,
            "source": {"model_type": hf.model_type, "architectures": hf.config.get("architectures", [])},
            "unused_source_tensors": dict(sorted(plan.unused.items())),
        }
        name = hf.config.get("_name_or_path") or hf.path.name
        with ArtifactWriter(out, shard_limit=shard_limit, metadata={"name": str(name)}, provenance=provenance) as writer:
            resource_ids = _write_resources(writer, plan)
            sources = Sources(hf.checkpoint)
            for i, obj in enumerate(plan.objects):
                _write_object(writer, obj, sources, recipe, family, report)
                sources.clear()
                if progress:
                    progress(obj.id, i + 1, len(plan.objects))
            for comp in plan.components:
                writer.add_component(comp.name, comp.config, target=comp.target, resources=resource_ids.get(comp.name),
                                     proposal=comp.proposal)
            if report.fallbacks:
                writer.provenance["format_fallbacks"] = report.fallbacks
            report.bindings = len(writer.bindings)
        report.seconds = time.monotonic() - start
        return report
    finally:
        hf.close()


def _family(plan: ConversionPlan) -> str:
    return "moe" if any(o.role.startswith("moe.") for o in plan.objects) else "dense"


def _write_resources(writer: ArtifactWriter, plan: ConversionPlan) -> dict[str, dict[str, str]]:
    ids: dict[str, dict[str, str]] = {}
    for comp in plan.components:
        for role, data in comp.resources.items():
            oid = f"resource/{comp.name}/{role}"
            writer.add_resource(oid, data)
            ids.setdefault(comp.name, {})[role] = oid
    return ids


def _stored_values(obj: ObjectSpec, sources: Sources) -> np.ndarray:
    pieces = []
    for param in obj.params:
        value = param.load(sources)
        if tuple(value.shape) != tuple(param.shape):
            if value.size != int(np.prod(param.shape)):
                raise ConversionError(
                    f"source for {param.name} has shape {list(value.shape)}, expected {list(param.shape)} "
                    f"(from {', '.join(s for s, _ in param.consumes)})"
                )
            value = value.reshape(param.shape)
        pieces.append(value)
    shape = obj.stored_shape
    if len(pieces) == 1:
        return pieces[0].reshape(shape)
    dtypes = {p.dtype for p in pieces}
    if len(dtypes) > 1:
        pieces = [p.astype(np.float32) for p in pieces]
    flat = [p.reshape(-1) if len(shape) == 1 else p.reshape(p.shape[0], -1) for p in pieces]
    return np.concatenate(flat, axis=0).reshape(shape)


def _encode(values: np.ndarray, fmt: str):
    if fmt == "bf16":
        if values.dtype == np.dtype(ml_dtypes.bfloat16):
            return values
        return values.astype(np.float32)
    if fmt == "fp32":
        return values.astype(np.float32)
    if fmt == "int32":
        if not np.issubdtype(values.dtype, np.integer) or values.min(initial=0) < -(2**31) or values.max(initial=0) >= 2**31:
            raise ConversionError("integer tensor does not fit int32")
        return values.astype(np.int32)
    x = values.astype(np.float32)
    if not np.all(np.isfinite(x)):
        raise ConversionError("non-finite weights cannot be quantized")
    if fmt == recipes.NVFP4:
        return quantize_nvfp4(x)
    if fmt == "fp8_e4m3fn_row_bf16":
        return quantize_fp8_row(x)
    return quantize_grouped(x, fmt)


def _write_object(writer: ArtifactWriter, obj: ObjectSpec, sources: Sources, recipe: str, family: str,
                  report: ConversionReport) -> None:
    values = _stored_values(obj, sources)
    shape = tuple(values.shape)
    if obj.kind in ("fp32", "int32"):
        fmt = obj.kind
    else:
        fmt = recipes.format_for(recipe, family, obj.role, obj.layer)
        if not recipes.fits(fmt, shape):
            report.fallbacks[obj.id] = f"{fmt} does not fit shape {list(shape)}; stored as q8_g32_fp16"
            fmt = recipes.Q8 if len(shape) == 2 else "bf16"
    try:
        writer.add_tensor(obj.id, fmt, recipes.layout_for(fmt), shape, _encode(values, fmt))
    except ConversionError as exc:
        raise ConversionError(f"object {obj.id}: {exc}") from None
    report.objects += 1
    report.bytes_by_format[fmt] += writer.tensor(obj.id).bytes
    policy = recipes.activation_policy(fmt)
    if len(obj.params) == 1 and tuple(obj.params[0].shape) == shape:
        writer.bind(obj.params[0].name, obj.id)
    else:
        begin = 0
        for param in obj.params:
            n = int(np.prod(param.shape))
            writer.bind_parts(param.name, [(obj.id, begin, begin + n)])
            begin += n
    for alias in obj.aliases:
        writer.bind(alias, obj.id)
    for param in obj.params:
        for site in param.inputs:
            writer.add_use(param.name, site, policy)
