"""The JSON directory of a v3 artifact: strict parsing and validation (artifact spec section 2).

`parse_directory` turns the entry file's JSON bytes into typed, immutable records after running
checks 1-8 of the reader checklist (spec 2.7) in upstream order. Encoding checks of individual
tensors (check 9) are lazy: `check_tensor_encoding` runs them when an object is first used, or
for all objects in strict mode.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from . import formats
from .errors import ArtifactError

ACTIVATION_POLICIES = ("A16Only", "AllowA8", "AllowA4")

ROOT_REQUIRED = ("components", "objects", "bindings", "uses", "files")
ROOT_OPTIONAL = ("metadata", "provenance")
TENSOR_MEMBERS = frozenset({"id", "kind", "shape", "format", "layout", "offset", "bytes"})
RESOURCE_MEMBERS = frozenset({"id", "kind", "encoding", "offset", "bytes"})
FILE_MEMBERS = frozenset({"path", "payload_bytes"})
COMPONENT_REQUIRED = frozenset({"config"})
COMPONENT_OPTIONAL = frozenset({"target", "resources", "proposal"})
USE_REQUIRED = frozenset({"parameter", "input"})
USE_OPTIONAL = frozenset({"activation_policy", "auxiliaries"})


@dataclass(frozen=True)
class TensorObject:
    id: str
    shape: tuple[int, ...]
    format: str
    layout: str
    offset: int
    bytes: int
    kind: str = "tensor"

    @property
    def elements(self) -> int:
        return formats.elements(self.shape)


@dataclass(frozen=True)
class ResourceObject:
    id: str
    encoding: str
    offset: int
    bytes: int
    kind: str = "resource"


StoredObject = TensorObject | ResourceObject


@dataclass(frozen=True)
class Part:
    """Elements `[begin, end)` (C order) of tensor `object`."""

    object: str
    begin: int
    end: int

    @property
    def elements(self) -> int:
        return self.end - self.begin


@dataclass(frozen=True)
class Binding:
    """A logical parameter: a whole tensor, or the concatenation of element ranges of tensors."""

    parts: tuple[Part, ...]
    whole: bool  # written as {"object": id}

    @property
    def elements(self) -> int:
        return sum(p.elements for p in self.parts)


@dataclass(frozen=True)
class Use:
    parameter: str
    input: str
    activation_policy: str | None = None
    auxiliaries: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class Component:
    config: Any  # open JSON object
    target: str | None = None
    resources: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    proposal: Any = None  # {"domain": "full"} or {"domain": "indexed", "rows": n}


@dataclass(frozen=True)
class FileEntry:
    path: str | None
    payload_bytes: int


@dataclass(frozen=True)
class Directory:
    components: MappingProxyType
    objects: tuple[StoredObject, ...]
    objects_by_id: MappingProxyType
    bindings: MappingProxyType
    uses: tuple[Use, ...]
    files: tuple[FileEntry, ...]
    metadata: Any
    provenance: Any

    @property
    def payload_bytes(self) -> int:
        return sum(f.payload_bytes for f in self.files)


# ---------------------------------------------------------------------------------------------
# Strict JSON


def _reject_constant(name: str) -> Any:
    raise ArtifactError("json_syntax", f"non-standard JSON constant {name} is not allowed")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ArtifactError("json_duplicate_member", f"duplicate JSON member name {key!r}")
        out[key] = value
    return out


def loads_strict(data: bytes) -> Any:
    """Parse strict UTF-8 JSON: no duplicate member names, no NaN/Infinity."""
    try:
        text = data.decode("utf-8", errors="strict")
    except UnicodeDecodeError as exc:
        raise ArtifactError("json_utf8", f"directory is not valid UTF-8: {exc.reason} at byte {exc.start}") from None
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant)
    except ArtifactError:
        raise
    except RecursionError:
        raise ArtifactError("json_syntax", "directory JSON is nested too deeply") from None
    except (ValueError, TypeError) as exc:
        raise ArtifactError("json_syntax", f"directory is not valid JSON: {exc}") from None


def dumps_compact(value: Any) -> bytes:
    """Serialize as the upstream writer does: compact separators, raw UTF-8, no NaN."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")


# ---------------------------------------------------------------------------------------------
# Domain checks


def _is_u64(value: Any) -> bool:
    return type(value) is int and 0 <= value <= formats.U64_MAX


def _u64(value: Any, what: str, obj: str | None = None, positive: bool = False) -> int:
    if not _is_u64(value) or (positive and value < 1):
        kind = "a positive" if positive else "an unsigned"
        raise ArtifactError("u64", f"{what} must be {kind} 64-bit JSON integer, got {value!r}", obj=obj)
    return value


def is_id(value: Any) -> bool:
    if type(value) is not str or not value or "\x00" in value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates
        return False
    return True


def _id(value: Any, what: str, obj: str | None = None) -> str:
    if not is_id(value):
        raise ArtifactError(
            "id", f"{what} must be a non-empty string without U+0000 or lone surrogates, got {value!r}", obj=obj
        )
    return value


def _object(value: Any, what: str, obj: str | None = None) -> dict:
    if type(value) is not dict:
        raise ArtifactError("json_type", f"{what} must be a JSON object, got {type(value).__name__}", obj=obj)
    return value


def _members(record: dict, required: frozenset | tuple, optional: frozenset | tuple, what: str, obj: str | None) -> None:
    missing = [m for m in required if m not in record]
    if missing:
        raise ArtifactError("missing_member", f"{what} lacks required member(s) {', '.join(missing)}", obj=obj)
    extra = sorted(set(record) - set(required) - set(optional))
    if extra:
        raise ArtifactError("extra_member", f"{what} has unknown member(s) {', '.join(extra)}", obj=obj)


def _shape(value: Any, obj: str) -> tuple[int, ...]:
    if type(value) is not list or len(value) > formats.MAX_RANK:
        raise ArtifactError("shape", f"shape must be a JSON array of at most 16 positive integers, got {value!r}", obj=obj)
    dims = tuple(_u64(d, "shape dimension", obj, positive=True) for d in value)
    count = 1
    for d in dims:
        count *= d
        if count > formats.U64_MAX:
            raise ArtifactError("shape", f"element count of shape {list(dims)} overflows U64", obj=obj)
    return dims


# ---------------------------------------------------------------------------------------------
# Sections


def _parse_files(value: Any, entry_name: str | None) -> tuple[FileEntry, ...]:
    if type(value) is not list or not value:
        raise ArtifactError("files", "files must be a non-empty JSON array")
    out: list[FileEntry] = []
    seen: set[str] = set()
    total = 0
    for i, item in enumerate(value):
        where = f"files[{i}]"
        _object(item, where)
        _members(item, FILE_MEMBERS, (), where, None)
        path = item["path"]
        if i == 0:
            if path is not None:
                raise ArtifactError("file_path", "files[0].path must be null (it is the entry file)")
        else:
            if not is_id(path) or path in (".", "..") or "/" in path or "\\" in path:
                raise ArtifactError(
                    "file_path", f"{where}.path must be a plain file name without path separators, got {path!r}"
                )
            if path in seen:
                raise ArtifactError("file_path", f"{where}.path {path!r} names the same part twice")
            if entry_name is not None and path == entry_name:
                raise ArtifactError("file_path", f"{where}.path {path!r} is the entry file's own name")
            seen.add(path)
        size = _u64(item["payload_bytes"], f"{where}.payload_bytes", positive=True)
        total += size
        if total > formats.U64_MAX:
            raise ArtifactError("u64", "sum of files[].payload_bytes overflows U64")
        out.append(FileEntry(path, size))
    return tuple(out)


def _parse_objects(value: Any, payload_bytes: int) -> tuple[tuple[StoredObject, ...], dict[str, StoredObject]]:
    if type(value) is not list or not value:
        raise ArtifactError("objects", "objects must be a non-empty JSON array")
    out: list[StoredObject] = []
    by_id: dict[str, StoredObject] = {}
    prev_end = 0
    for i, item in enumerate(value):
        _object(item, f"objects[{i}]")
        raw_id = item.get("id")
        oid = _id(raw_id, f"objects[{i}].id")
        kind = item.get("kind")
        if kind == "tensor":
            _members(item, TENSOR_MEMBERS, (), "tensor object", oid)
            shape = _shape(item["shape"], oid)
            fmt = _id(item["format"], "format", oid)
            layout = _id(item["layout"], "layout", oid)
            offset = _u64(item["offset"], "offset", oid)
            size = _u64(item["bytes"], "bytes", oid, positive=True)
            obj: StoredObject = TensorObject(oid, shape, fmt, layout, offset, size)
        elif kind == "resource":
            _members(item, RESOURCE_MEMBERS, (), "resource object", oid)
            encoding = _id(item["encoding"], "encoding", oid)
            offset = _u64(item["offset"], "offset", oid)
            size = _u64(item["bytes"], "bytes", oid, positive=True)
            obj = ResourceObject(oid, encoding, offset, size)
        else:
            raise ArtifactError("object_kind", f"kind must be 'tensor' or 'resource', got {kind!r}", obj=oid)
        end = offset + size
        if end > formats.U64_MAX:
            raise ArtifactError("u64", "offset + bytes overflows U64", obj=oid)
        if offset < prev_end:
            raise ArtifactError(
                "object_order", f"offset {offset} lies before the end {prev_end} of the previous object "
                "(objects must be in increasing offset order and must not overlap)", obj=oid
            )
        if end > payload_bytes:
            raise ArtifactError(
                "object_bounds", f"bytes [{offset}, {end}) extend past the logical payload of {payload_bytes} bytes", obj=oid
            )
        if oid in by_id:
            raise ArtifactError("duplicate_id", "object id is used twice", obj=oid)
        prev_end = end
        by_id[oid] = obj
        out.append(obj)
    return tuple(out), by_id


def _parse_binding(value: Any, objects: dict[str, StoredObject], what: str) -> Binding:
    _object(value, what)
    if "object" in value and "parts" not in value:
        _members(value, ("object",), (), what, None)
        tensor = _tensor_ref(value["object"], objects, what)
        return Binding((Part(tensor.id, 0, tensor.elements),), whole=True)
    if "parts" in value and "object" not in value:
        _members(value, ("parts",), (), what, None)
        raw_parts = value["parts"]
        if type(raw_parts) is not list or not raw_parts:
            raise ArtifactError("binding", f"{what}.parts must be a non-empty array")
        parts = []
        total = 0
        for j, raw in enumerate(raw_parts):
            where = f"{what}.parts[{j}]"
            _object(raw, where)
            _members(raw, ("object", "range"), (), where, None)
            tensor = _tensor_ref(raw["object"], objects, where)
            rng = raw["range"]
            if type(rng) is not list or len(rng) != 2:
                raise ArtifactError("binding_range", f"{where}.range must be a 2-element integer array", obj=tensor.id)
            begin = _u64(rng[0], f"{where}.range[0]", tensor.id)
            end = _u64(rng[1], f"{where}.range[1]", tensor.id)
            if not begin < end <= tensor.elements:
                raise ArtifactError(
                    "binding_range",
                    f"{where}.range [{begin}, {end}) is empty or exceeds the {tensor.elements} elements of the object",
                    obj=tensor.id,
                )
            total += end - begin
            if total > formats.U64_MAX:
                raise ArtifactError("u64", f"{what}: total element count overflows U64")
            parts.append(Part(tensor.id, begin, end))
        return Binding(tuple(parts), whole=False)
    raise ArtifactError("binding", f"{what} must have exactly one of the members 'object' or 'parts'")


def _tensor_ref(ref: Any, objects: dict[str, StoredObject], what: str) -> TensorObject:
    oid = _id(ref, f"{what}.object")
    obj = objects.get(oid)
    if obj is None:
        raise ArtifactError("binding_object", f"{what} references an object that does not exist", obj=oid)
    if not isinstance(obj, TensorObject):
        raise ArtifactError("binding_object", f"{what} references a resource; bindings need tensors", obj=oid)
    return obj


def _parse_components(value: Any, objects: dict[str, StoredObject]) -> dict[str, Component]:
    _object(value, "components")
    if "text" not in value:
        raise ArtifactError("components", "components must contain the 'text' component")
    out: dict[str, Component] = {}
    for name, raw in value.items():
        _id(name, "component id")
        what = f"component {name!r}"
        _object(raw, what)
        _members(raw, COMPONENT_REQUIRED, COMPONENT_OPTIONAL, what, None)
        config = _object(raw["config"], f"{what}.config")
        target = raw.get("target")
        if "target" in raw:
            _id(target, f"{what}.target")
            if target not in value:
                raise ArtifactError("component_target", f"{what}.target names unknown component {target!r}")
        resources = {}
        if "resources" in raw:
            for role, oid in _object(raw["resources"], f"{what}.resources").items():
                _id(role, f"{what} resource role")
                _id(oid, f"{what}.resources[{role!r}]")
                if not isinstance(objects.get(oid), ResourceObject):
                    raise ArtifactError(
                        "component_resource", f"{what} role {role!r} must reference a resource object", obj=oid
                    )
                resources[role] = oid
        proposal = None
        if "proposal" in raw:
            if name != "text":
                raise ArtifactError("proposal", f"{what}: only the text component may have a proposal")
            proposal = _proposal(raw["proposal"])
        out[name] = Component(config, target, MappingProxyType(resources), proposal)
    return out


def _proposal(raw: Any) -> dict:
    _object(raw, "text.proposal")
    domain = raw.get("domain")
    if domain == "full":
        _members(raw, ("domain",), (), "text.proposal", None)
        return {"domain": "full"}
    if domain == "indexed":
        _members(raw, ("domain", "rows"), (), "text.proposal", None)
        return {"domain": "indexed", "rows": _u64(raw["rows"], "text.proposal.rows", positive=True)}
    raise ArtifactError("proposal", f"text.proposal.domain must be 'full' or 'indexed', got {domain!r}")


def _parse_uses(value: Any, bindings: dict[str, Binding], objects: dict[str, StoredObject]) -> tuple[Use, ...]:
    if type(value) is not list:
        raise ArtifactError("uses", "uses must be a JSON array")
    seen: set[tuple[str, str]] = set()
    out = []
    for i, raw in enumerate(value):
        what = f"uses[{i}]"
        _object(raw, what)
        _members(raw, USE_REQUIRED, USE_OPTIONAL, what, None)
        parameter = _id(raw["parameter"], f"{what}.parameter")
        if parameter not in bindings:
            raise ArtifactError("use_parameter", f"{what}.parameter {parameter!r} is not a binding")
        site = _id(raw["input"], f"{what}.input")
        if (parameter, site) in seen:
            raise ArtifactError("use_duplicate", f"{what}: ({parameter!r}, {site!r}) appears twice")
        seen.add((parameter, site))
        policy = raw.get("activation_policy")
        if "activation_policy" in raw and policy not in ACTIVATION_POLICIES:
            raise ArtifactError("use_policy", f"{what}.activation_policy must be one of {ACTIVATION_POLICIES}, got {policy!r}")
        aux = {}
        for role, binding in _object(raw.get("auxiliaries", {}), f"{what}.auxiliaries").items():
            _id(role, f"{what} auxiliary role")
            aux[role] = _parse_binding(binding, objects, f"{what}.auxiliaries[{role!r}]")
        out.append(Use(parameter, site, policy, MappingProxyType(aux)))
    return tuple(out)


def parse_directory(data: bytes, entry_name: str | None = None) -> Directory:
    """Validate directory JSON bytes (checks 1-8 of spec 2.7, the JSON part) into a `Directory`."""
    root = loads_strict(data)
    _object(root, "directory root")
    _members(root, ROOT_REQUIRED, ROOT_OPTIONAL, "directory root", None)
    files = _parse_files(root["files"], entry_name)
    payload = sum(f.payload_bytes for f in files)
    objects, by_id = _parse_objects(root["objects"], payload)
    components = _parse_components(root["components"], by_id)
    bindings = {}
    for name, raw in _object(root["bindings"], "bindings").items():
        _id(name, "binding name")
        bindings[name] = _parse_binding(raw, by_id, f"binding {name!r}")
    uses = _parse_uses(root["uses"], bindings, by_id)
    metadata = _object(root.get("metadata", {}), "metadata")
    if "name" in metadata:
        _id(metadata["name"], "metadata.name")
    provenance = _object(root.get("provenance", {}), "provenance")
    return Directory(
        components=MappingProxyType(components),
        objects=objects,
        objects_by_id=MappingProxyType(by_id),
        bindings=MappingProxyType(bindings),
        uses=uses,
        files=files,
        metadata=metadata,
        provenance=provenance,
    )


def check_object_encoding(obj: StoredObject) -> None:
    """Check 9 of spec 2.7 for one object: registered encoding, shape rules, size, alignment."""
    if isinstance(obj, ResourceObject):
        if obj.encoding not in formats.RESOURCE_ENCODINGS:
            raise ArtifactError("unknown_encoding", f"unknown resource encoding {obj.encoding!r}", obj=obj.id)
        return
    expected = formats.encoded_size(obj.layout, obj.format, obj.shape, obj.id)
    if obj.bytes != expected:
        raise ArtifactError(
            "encoded_size",
            f"bytes is {obj.bytes} but {obj.format}/{obj.layout} of shape {list(obj.shape)} encodes to {expected}",
            obj=obj.id,
        )
    align = formats.alignment(obj.layout)
    if obj.offset % align:
        raise ArtifactError("alignment", f"offset {obj.offset} is not a multiple of {align}", obj=obj.id)


# ---------------------------------------------------------------------------------------------
# Serialization (writer side)


def binding_to_json(binding: Binding) -> dict:
    if binding.whole:
        return {"object": binding.parts[0].object}
    return {"parts": [{"object": p.object, "range": [p.begin, p.end]} for p in binding.parts]}


def object_to_json(obj: StoredObject) -> dict:
    if isinstance(obj, TensorObject):
        return {
            "id": obj.id, "shape": list(obj.shape), "format": obj.format, "layout": obj.layout,
            "offset": obj.offset, "bytes": obj.bytes, "kind": "tensor",
        }
    return {"id": obj.id, "encoding": obj.encoding, "offset": obj.offset, "bytes": obj.bytes, "kind": "resource"}


def component_to_json(comp: Component) -> dict:
    out: dict[str, Any] = {"config": comp.config}
    if comp.target is not None:
        out["target"] = comp.target
    if comp.resources:
        out["resources"] = dict(comp.resources)
    if comp.proposal is not None:
        out["proposal"] = dict(comp.proposal)
    return out


def use_to_json(use: Use) -> dict:
    out: dict[str, Any] = {"parameter": use.parameter, "input": use.input}
    if use.activation_policy is not None:
        out["activation_policy"] = use.activation_policy
    if use.auxiliaries:
        out["auxiliaries"] = {role: binding_to_json(b) for role, b in use.auxiliaries.items()}
    return out


def directory_to_json(
    components: dict[str, Component],
    objects: list[StoredObject] | tuple[StoredObject, ...],
    bindings: dict[str, Binding],
    uses: list[Use] | tuple[Use, ...],
    files: list[FileEntry] | tuple[FileEntry, ...],
    metadata: dict | None = None,
    provenance: dict | None = None,
) -> dict:
    """Root JSON object in the member order of the upstream writer (files last)."""
    return {
        "components": {name: component_to_json(c) for name, c in components.items()},
        "objects": [object_to_json(o) for o in objects],
        "bindings": {name: binding_to_json(b) for name, b in bindings.items()},
        "uses": [use_to_json(u) for u in uses],
        "metadata": dict(metadata or {}),
        "provenance": dict(provenance or {}),
        "files": [{"path": f.path, "payload_bytes": f.payload_bytes} for f in files],
    }
