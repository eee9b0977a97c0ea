"""One-way v2 -> v3 upgrade of known upstream artifacts (artifact spec section 6).

The upgrade copies the v2 payload byte for byte (every v2 layout is byte-identical to its v3
counterpart), renames formats and layouts, synthesizes the components, splits fused v2 parents
into logical bindings by row ranges, derives one Use per input position, and turns v2
activation-divisor scalars into Use auxiliaries. Only the registered identities are accepted: the
v2 directory carries no architecture description, so the dimensions come from this registry.

Chat template: upstream replaces the text template with its maintained copy, appended last at a
256-aligned offset. Those maintained templates are not part of this project; pass the replacement
with `chat_template=` to get the upstream placement, otherwise the v2 template is kept in place
(and `provenance.upgraded_from.chat_template` says so).
"""

from __future__ import annotations

import math
import mmap
import os
import re
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from . import formats, framing
from .directory import Binding, Part, ResourceObject, TensorObject, is_id, loads_strict
from .errors import ArtifactError
from .upgrade_registry import IDENTITIES, Identity
from .writer import ArtifactWriter

__all__ = ["IDENTITIES", "Identity", "read_v2", "upgrade", "use_inputs"]

V2_HEADER = struct.Struct("<8sQ")
V2_FORMATS = {
    "BF16": "bf16", "FP32": "fp32", "I32": "int32", "Q4G64_F16S": "q4_g64_fp16", "Q5G64_F16S": "q5_g64_fp16",
    "Q6G64_F16S": "q6_g64_fp16", "W8G32_F16S": "q8_g32_fp16", "NVFP4": "nvfp4",
    "FP8_E4M3FN_ROW_BF16S": "fp8_e4m3fn_row_bf16",
}
V2_LAYOUTS = {
    "contiguous-le-v1": "contiguous_le_v1", "row-split-k128-v1": "row_split_k128_v1",
    "blockscale-k16-m128x4-v1": "block_scale_k16_m128x4_v1", "row-scale-v1": "row_scale_v1",
}
TEXT_ROLES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")
VISION_ROLES = ("preprocessor_config.json", "video_preprocessor_config.json")
DIVISOR_SUFFIX = "/input_scale_divisor"


# ---------------------------------------------------------------------------------------------
# Reading v2


@dataclass(frozen=True)
class V2Object:
    name: str
    kind: str
    offset: int  # relative to the v2 payload
    bytes: int
    shape: tuple[int, ...] = ()
    format: str = ""
    layout: str = ""


@dataclass
class V2File:
    path: Path
    model_id: str
    weights_id: str
    objects: list[V2Object]
    payload_offset: int
    size: int


def read_v2(path: Path, data: bytes | mmap.mmap) -> V2File:
    """Parse and check a v2 file (spec 6.1 and step 1 of 6.2)."""
    p = str(path)
    size = len(data)
    if size < V2_HEADER.size:
        raise ArtifactError("short_file", "file is shorter than the 16-byte v2 header", path=p)
    magic, json_bytes = V2_HEADER.unpack(data[:16])
    if magic == framing.ENTRY_MAGIC:
        raise ArtifactError("already_v3", "this file is already a v3 artifact", path=p)
    if magic != framing.V2_MAGIC:
        raise ArtifactError("magic", f"not a .ninfer v2 file (magic {bytes(magic).hex(' ')})", path=p)
    if not 1 <= json_bytes <= size - 16:
        raise ArtifactError("json_bytes", f"json_bytes {json_bytes} is outside 1..{size - 16}", path=p)
    root = loads_strict(bytes(data[16 : 16 + json_bytes]))
    if type(root) is not dict or set(root) != {"identity", "objects"}:
        raise ArtifactError("v2_root", "the v2 root must have exactly the members identity and objects", path=p)
    ident = root["identity"]
    if type(ident) is not dict or set(ident) != {"model_id", "weights_id"} or not all(
        type(v) is str and v for v in ident.values()
    ):
        raise ArtifactError("v2_identity", "identity must be {model_id, weights_id} with non-empty strings", path=p)
    payload_offset = formats.align_up(16 + json_bytes, framing.PAGE)
    if payload_offset >= size:
        raise ArtifactError("v2_payload", "the file has no payload after its JSON", path=p)
    payload = size - payload_offset
    raw_objects = root["objects"]
    if type(raw_objects) is not list or not raw_objects:
        raise ArtifactError("objects", "objects must be a non-empty array", path=p)
    objects = []
    prev_end = 0
    for i, raw in enumerate(raw_objects):
        objects.append(_v2_object(raw, i, p))
        obj = objects[-1]
        if obj.offset < prev_end or obj.offset + obj.bytes > payload:
            raise ArtifactError("object_order", "v2 objects must be ordered, non-overlapping and inside the file", obj=obj.name, path=p)
        prev_end = obj.offset + obj.bytes
    names = [o.name for o in objects]
    if len(set(names)) != len(names):
        raise ArtifactError("duplicate_id", "a v2 object name is used twice", path=p)
    for obj in objects:
        if obj.name.endswith(DIVISOR_SUFFIX):
            _check_divisor(obj, data, payload_offset, p)
    return V2File(path, ident["model_id"], ident["weights_id"], objects, payload_offset, size)


def _v2_object(raw, i: int, path: str) -> V2Object:
    if type(raw) is not dict:
        raise ArtifactError("json_type", f"objects[{i}] must be an object", path=path)
    name = raw.get("name")
    if not is_id(name):
        raise ArtifactError("id", f"objects[{i}].name must be a non-empty string", path=path)
    kind = raw.get("kind")
    expected = {"tensor": {"name", "kind", "shape", "format", "layout", "offset", "bytes"},
                "resource": {"name", "kind", "encoding", "offset", "bytes"}}.get(kind)
    if expected is None or set(raw) != expected:
        raise ArtifactError("v2_object", "v2 object members are not those of a tensor or a resource", obj=name, path=path)
    offset, size = raw["offset"], raw["bytes"]
    if type(offset) is not int or type(size) is not int or offset < 0 or size < 1:
        raise ArtifactError("u64", "offset and bytes must be non-negative integers, bytes positive", obj=name, path=path)
    if kind == "resource":
        if raw["encoding"] != "raw-bytes-v1":
            raise ArtifactError("unknown_encoding", f"unknown v2 resource encoding {raw['encoding']!r}", obj=name, path=path)
        return V2Object(name, kind, offset, size)
    fmt, layout, shape = V2_FORMATS.get(raw["format"]), V2_LAYOUTS.get(raw["layout"]), raw["shape"]
    if fmt is None:
        raise ArtifactError("unknown_format", f"unknown v2 format {raw['format']!r}", obj=name, path=path)
    if layout is None:
        raise ArtifactError("unknown_layout", f"unknown v2 layout {raw['layout']!r}", obj=name, path=path)
    if type(shape) is not list or len(shape) > 16 or not all(type(d) is int and d >= 1 for d in shape):
        raise ArtifactError("shape", f"invalid shape {shape!r}", obj=name, path=path)
    obj = V2Object(name, kind, offset, size, tuple(shape), fmt, layout)
    if offset % 256:
        raise ArtifactError("alignment", f"tensor offset {offset} is not a multiple of 256", obj=name, path=path)
    want = formats.encoded_size(layout, fmt, obj.shape, name)
    if size != want:
        raise ArtifactError("encoded_size", f"bytes {size} != encoded size {want}", obj=name, path=path)
    return obj


def _check_divisor(obj: V2Object, data, payload_offset: int, path: str) -> None:
    if obj.kind != "tensor" or obj.format != "fp32" or obj.shape not in ((), (1,)):
        raise ArtifactError("v2_divisor", "an input_scale_divisor must be an fp32 scalar", obj=obj.name, path=path)
    start = payload_offset + obj.offset
    value = struct.unpack("<f", data[start : start + 4])[0]
    if not (math.isfinite(value) and value > 0):
        raise ArtifactError("v2_divisor", f"input_scale_divisor is {value}, must be finite and positive", obj=obj.name, path=path)


# ---------------------------------------------------------------------------------------------
# Bindings (spec 6.3)


def _v3_name(v2_name: str) -> str:
    name = v2_name.replace("mtp/layer/", "mtp/layers/0/", 1) if v2_name.startswith("mtp/layer/") else v2_name
    renames = {"text/draft_head": "proposal/head", "text/draft_head_token_ids": "proposal/token_ids"}
    if name in renames:
        return renames[name]
    if name.endswith("moe/shared_down"):
        return name[: -len("moe/shared_down")] + "moe/shared/down"
    m = re.fullmatch(r"(vision/(?:layers/\d+/|merger/))(norm\d?)/(weight|bias)", name)
    if m:
        return f"{m.group(1)}{m.group(2)}_{m.group(3)}"
    return name


def _splits(name: str, dims: dict, shape: tuple[int, ...], draft: dict | None) -> list[tuple[str, int]] | None:
    """Row blocks `(suffix, rows)` for a fused v2 parent, or None for a whole-object binding."""
    q, k, kg, vg, nv = dims["q"], dims["k"], dims["kg"], dims["vg"], dims["nv"]
    table: dict[str, list[tuple[str, int]]] = {
        "attention/query_key": [("attention/query", q), ("attention/key", k)],
        "attention/gate_value": [("attention/gate", q), ("attention/value", k)],
        "attention/query_key_gate_value": [("attention/query", q), ("attention/key", k), ("attention/gate", q), ("attention/value", k)],
        "gdn/query_key": [("gdn/query", kg), ("gdn/key", kg)],
        "gdn/value_z": [("gdn/value", vg), ("gdn/z", vg)],
        "gdn/query_key_value_z": [("gdn/query", kg), ("gdn/key", kg), ("gdn/value", vg), ("gdn/z", vg)],
        "gdn/a_b_projection": [("gdn/a_projection", nv), ("gdn/b_projection", nv)],
    }
    if "inter" in dims:
        table["mlp/gate_up"] = [("mlp/gate", dims["inter"]), ("mlp/up", dims["inter"])]
    if "experts" in dims:
        e, ie, is_ = dims["experts"], dims["expert_inter"], dims["shared_inter"]
        table["moe/router_shared_gate"] = [("moe/router", e), ("moe/shared_score", 1)]
        table["moe/routed_gate_up"] = [(f"moe/experts/{i}/{w}", ie) for i in range(e) for w in ("gate", "up")]
        table["moe/routed_down"] = [(f"moe/experts/{i}/down", dims["h"]) for i in range(e)]
        table["moe/shared_gate_up"] = [("moe/shared/gate", is_), ("moe/shared/up", is_)]
    if name.startswith("vision/layers/"):
        w = dims["vision_width"]
        table = {"attention/qkv": [("attention/query", w), ("attention/key", w), ("attention/value", w)],
                 "attention/qkv_bias": [("attention/query_bias", w), ("attention/key_bias", w), ("attention/value_bias", w)]}
    elif name.startswith("dflash"):
        table = {"attention/query_key_value": [("attention/query", dims["draft_q"]), ("attention/key", dims["draft_k"]),
                                               ("attention/value", dims["draft_k"])]}
        if draft is not None:
            table["mlp/gate_up"] = [("mlp/gate", draft["intermediate_size"]), ("mlp/up", draft["intermediate_size"])]
    for suffix, blocks in table.items():
        if name.endswith("/" + suffix) and (name.startswith(("text/layers/", "mtp/layer/", "vision/layers/", "dflash"))):
            return [(name[: -len(suffix)] + s, rows) for s, rows in blocks]
    return None


def _bindings(v2: V2File, ident: Identity, drafts: dict[str, dict]) -> dict[str, Binding]:
    out: dict[str, Binding] = {}

    def add(name: str, binding: Binding, source: str) -> None:
        if name in out:
            raise ArtifactError("v2_binding", f"two v2 objects map to the binding {name!r}", obj=source)
        out[name] = binding

    for obj in v2.objects:
        if obj.kind != "tensor" or obj.name.endswith(DIVISOR_SUFFIX):
            continue
        draft = drafts.get(obj.name.split("/", 1)[0])
        blocks = _splits(obj.name, ident.dims, obj.shape, draft)
        elements = formats.elements(obj.shape)
        if blocks is None:
            add(_v3_name(obj.name), Binding((Part(obj.name, 0, elements),), whole=True), obj.name)
            continue
        row = elements // obj.shape[0] if len(obj.shape) > 1 else 1
        if sum(r for _, r in blocks) * row != elements:
            raise ArtifactError(
                "v2_split", f"shape {list(obj.shape)} does not match the split {[r for _, r in blocks]} of this identity",
                obj=obj.name,
            )
        begin = 0
        for name, rows in blocks:
            end = begin + rows * row
            add(_v3_name(name), Binding((Part(obj.name, begin, end),), whole=False), obj.name)
            begin = end
        if obj.name.startswith("dflash") and obj.name.endswith("attention/query_key_value"):
            base = obj.name[: -len("query_key_value")]
            qd, kd = ident.dims["draft_q"] * row, ident.dims["draft_k"] * row
            add(base + "context_key", Binding((Part(obj.name, qd, qd + kd),), whole=False), obj.name)
            add(base + "context_value", Binding((Part(obj.name, qd + kd, qd + 2 * kd),), whole=False), obj.name)
    return out


# ---------------------------------------------------------------------------------------------
# Uses (spec 6.5 and step 7 of 6.2)

_BLOCK = re.compile(r"^((?:text/layers/\d+|mtp/layers/0)/)(.+)$")
_VISION = re.compile(r"^(vision/layers/\d+/)(.+)$")
_DRAFT = re.compile(r"^(dflash2?)/(?:(layers/\d+/)(.+)|(.+))$")


def use_inputs(param: str, backends: Iterable[str]) -> list[str]:
    """Input positions of one parameter in an upgraded file (none for norms, biases, ...)."""
    backends = list(backends)
    if param == "text/output_head":
        return ["text/final_hidden"] + [f"{b}/final_hidden" for b in backends]
    if param == "proposal/head":
        return [f"{b}/final_hidden" for b in backends]
    if param == "mtp/input_projection":
        return ["mtp/stem_input"]
    if m := _BLOCK.match(param):
        base, rest = m.groups()
        if re.fullmatch(r"attention/(query|key|gate|value)|gdn/(query|key|value|z|a_projection|b_projection)", rest):
            return [base + "mixer_input"]
        if rest in ("attention/output", "gdn/output"):
            return [base + rest.split("/")[0] + "/gated_output"]
        if re.fullmatch(r"mlp/(gate|up)|moe/(router|shared_score)|moe/experts/\d+/(gate|up)|moe/shared/(gate|up)", rest):
            return [base + "ffn_input"]
        if rest == "mlp/down":
            return [base + "mlp/product"]
        if em := re.fullmatch(r"moe/(experts/\d+|shared)/down", rest):
            return [base + f"moe/{em.group(1)}/product"]
        return []
    if param == "vision/patch_embedding":
        return ["vision/patch_input"]
    if param in ("vision/merger/fc1", "vision/merger/fc2"):
        return ["vision/merger/input" if param.endswith("fc1") else "vision/merger/activation"]
    if m := _VISION.match(param):
        base, rest = m.groups()
        sites = {"attention/query": "attention_input", "attention/key": "attention_input", "attention/value": "attention_input",
                 "attention/output": "attention_output", "mlp/fc1": "mlp_input", "mlp/fc2": "mlp_activation"}
        return [base + sites[rest]] if rest in sites else []
    if m := _DRAFT.match(param):
        comp, layer, rest, top = m.groups()
        if top == "feature_projection":
            return [f"{comp}/target_features"]
        if top == "candidate_selector/hidden_projection" and comp == "dflash2":
            return ["dflash2/final_hidden"]
        if layer is None:
            return []
        base = f"{comp}/{layer}"
        sites = {"attention/context_key": f"{comp}/context_input", "attention/context_value": f"{comp}/context_input",
                 "attention/query": base + "query_projection_input", "attention/key": base + "query_projection_input",
                 "attention/value": base + "query_projection_input", "attention/output": base + "attention_output",
                 "mlp/gate": base + "mlp_input", "mlp/up": base + "mlp_input", "mlp/down": base + "mlp_product",
                 "attention_conv/kernel_projection": base + "attention_conv_input",
                 "mlp_conv/kernel_projection": base + "mlp_conv_input"}
        return [sites[rest]] if rest in sites else []
    return []


def _policy(fmt: str) -> str:
    return {"nvfp4": "AllowA4", "fp8_e4m3fn_row_bf16": "AllowA8"}.get(fmt, "A16Only")


def _divisor_targets(v2_name: str) -> list[str]:
    """Parameters whose uses take the activation divisor stored under `v2_name`."""
    group, operation = _v3_name(v2_name[: -len(DIVISOR_SUFFIX)]).rsplit("/", 1)
    roles = {
        "input_projection": ("query", "key", "gate", "value") if group.endswith("/attention") else ("query", "key", "value", "z"),
        "output_projection": ("output",),
        "gate_up_projection": ("gate", "up"),
        "down_projection": ("down",),
    }.get(operation)
    if roles is None:
        raise ArtifactError("v2_divisor", f"unknown divisor operation {operation!r}", obj=v2_name)
    return [f"{group}/{role}" for role in roles]


# ---------------------------------------------------------------------------------------------
# The upgrade


def upgrade(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    chat_template: bytes | None = None,
    shard_limit: int = framing.DEFAULT_SHARD_LIMIT,
    identities: dict[tuple[str, str], Identity] | None = None,
    progress: Callable[[int], None] | None = None,
) -> Path:
    """Upgrade the v2 file `src` to a v3 artifact at `dst` (which must not exist)."""
    src, dst = Path(src), Path(dst)
    if src.resolve() == dst.resolve():
        raise ArtifactError("upgrade_paths", "the output path must differ from the input path", path=str(src))
    registry = IDENTITIES if identities is None else identities
    try:
        with open(src, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                raise ArtifactError("short_file", "file is empty", path=str(src))
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                v2 = read_v2(src, data)
                ident = registry.get((v2.model_id, v2.weights_id))
                if ident is None:
                    known = ", ".join(f"{m}/{w}" for m, w in sorted(registry))
                    raise ArtifactError(
                        "v2_identity", f"unknown v2 identity {v2.model_id}/{v2.weights_id}; the upgrade knows only {known}",
                        path=str(src),
                    )
                if len(v2.objects) not in ident.object_counts:
                    raise ArtifactError(
                        "v2_identity", f"{v2.model_id}/{v2.weights_id} must have {' or '.join(map(str, ident.object_counts))} "
                        f"objects, this file has {len(v2.objects)}", path=str(src),
                    )
                return _write(v2, ident, data, dst, chat_template, shard_limit, progress)
    except OSError as exc:
        raise ArtifactError("io", f"cannot read v2 file: {exc.strerror or exc}", path=str(src)) from None


def _write(v2: V2File, ident: Identity, data, dst: Path, template: bytes | None, limit: int, progress) -> Path:
    names = {o.name for o in v2.objects}
    backends = ["mtp"] + (["dflash"] if ident.dflash_config else [])
    has_dflash2 = any(n.startswith("dflash2/") for n in names)
    if has_dflash2:
        backends.append("dflash2")
    drafts = {"dflash": ident.dflash_config, "dflash2": ident.dflash2_config}
    bindings = _bindings(v2, ident, drafts)
    expected = ident.binding_counts.get("dflash2" if has_dflash2 else "base")
    if expected is not None and len(bindings) != expected:
        raise ArtifactError("v2_binding", f"the upgrade produced {len(bindings)} bindings, {expected} expected", path=str(v2.path))

    resources: dict[str, dict[str, str]] = {"text": {}, "vision": {}}
    template_obj = None
    for obj in v2.objects:
        if obj.kind != "resource":
            continue
        role = obj.name.removeprefix("frontend/")
        comp = "vision" if role in VISION_ROLES else "text"
        resources[comp][role] = obj.name
        if role == "chat_template.jinja":
            template_obj = obj
    for comp, roles in (("text", TEXT_ROLES), ("vision", VISION_ROLES)):
        missing = [r for r in roles if r not in resources[comp]]
        if missing:
            raise ArtifactError("v2_resources", f"missing {comp} resources: {', '.join(missing)}", path=str(v2.path))

    payload = v2.size - v2.payload_offset
    provenance = {"upgraded_from": {"version": 2, "model_id": v2.model_id, "weights_id": v2.weights_id,
                                    "chat_template": "replaced" if template is not None else "kept from v2"}}
    writer = ArtifactWriter(dst, shard_limit=limit, metadata={"name": v2.model_id}, provenance=provenance,
                            initial_json_reserve=4064)
    try:
        for start in range(0, payload, 16 << 20):
            chunk = data[v2.payload_offset + start : v2.payload_offset + min(payload, start + (16 << 20))]
            writer.append_payload(chunk)
            if progress:
                progress(len(chunk))
        for obj in v2.objects:
            if template is not None and obj is template_obj:
                continue  # re-placed last
            if obj.kind == "resource":
                writer.add_placed(ResourceObject(obj.name, formats.RAW_BYTES, obj.offset, obj.bytes))
            else:
                writer.add_placed(TensorObject(obj.name, obj.shape, obj.format, obj.layout, obj.offset, obj.bytes))
        if template is not None:
            writer.add_resource(template_obj.name, template, alignment=256)
        text = dict(ident.text_config)
        proposal = {"domain": "indexed", "rows": 131072} if "proposal/head" in bindings else None
        writer.add_component("text", text, resources=resources["text"], proposal=proposal)
        writer.add_component("vision", ident.vision_config, target="text", resources=resources["vision"])
        writer.add_component("mtp", {"architectures": [ident.mtp_architecture]}, target="text")
        if ident.dflash_config:
            writer.add_component("dflash", ident.dflash_config, target="text")
        if has_dflash2:
            writer.add_component("dflash2", ident.dflash2_config, target="text")
        for name, binding in bindings.items():
            writer.bindings[name] = binding
        divisors: dict[str, str] = {}
        for obj in v2.objects:
            if obj.name.endswith(DIVISOR_SUFFIX):
                for param in _divisor_targets(obj.name):
                    divisors[param] = obj.name
        formats_of = {o.name: o.format for o in v2.objects}
        for name, binding in bindings.items():
            aux = {}
            if name in divisors:
                aux["activation_input_divisor"] = Binding((Part(divisors[name], 0, 1),), whole=True)
            for site in use_inputs(name, backends):
                writer.add_use(name, site, _policy(formats_of[binding.parts[0].object]), aux)
        return writer.finish()
    except BaseException:
        writer.abort()
        raise
