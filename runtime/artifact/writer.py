"""Writing v3 artifacts: place objects, shard the payload, reserve the JSON, publish safely.

Objects are streamed into a temporary spool as they are added (resources at the running cursor,
tensors 256-aligned), so memory stays small for multi-gigabyte models. `finish` lays out the
files table with the upstream JSON reserve loop (spec 1.6), writes every file to a temporary
name, re-opens the result with the reader to validate it, and only then publishes the parts and
finally the entry, never overwriting an existing file.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from . import codecs, formats, framing
from .directory import (
    ACTIVATION_POLICIES,
    Binding,
    Component,
    FileEntry,
    Part,
    ResourceObject,
    StoredObject,
    TensorObject,
    check_object_encoding,
    directory_to_json,
    dumps_compact,
    is_id,
    parse_directory,
)
from .errors import ArtifactError

COPY_CHUNK = 16 << 20


class ArtifactWriter:
    """Builds one artifact. Use as a context manager or call `finish()` / `abort()`."""

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        shard_limit: int = framing.DEFAULT_SHARD_LIMIT,
        metadata: Mapping[str, Any] | None = None,
        provenance: Mapping[str, Any] | None = None,
        artifact_id: bytes | None = None,
        initial_json_reserve: int | None = None,
    ) -> None:
        self.path = Path(path)
        if shard_limit < 2 * framing.PAGE:
            raise ValueError(f"shard limit {shard_limit} is below the minimum of {2 * framing.PAGE} bytes")
        self.shard_limit = shard_limit
        self.metadata = dict(metadata or {})
        self.provenance = dict(provenance or {})
        self.artifact_id = artifact_id or framing.new_artifact_id()
        if len(self.artifact_id) != 16:
            raise ValueError("artifact_id must be 16 bytes")
        self.initial_json_reserve = initial_json_reserve
        self.objects: list[StoredObject] = []
        self._ids: set[str] = set()
        self._by_id: dict[str, StoredObject] = {}
        self.components: dict[str, Component] = {}
        self.bindings: dict[str, Binding] = {}
        self.uses: list[Any] = []
        self._use_keys: set[tuple[str, str]] = set()
        self._cursor = 0
        if self.path.exists():  # fail before any work, not after converting gigabytes
            raise FileExistsError(f"{self.path} already exists; refusing to overwrite it")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._spool = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed in finish/abort
            prefix=f".{self.path.name}.payload-", dir=self.path.parent, delete=False
        )
        self._done = False

    # -- objects -----------------------------------------------------------------------------

    def _place(self, oid: str, alignment: int, data: bytes | memoryview) -> int:
        if not is_id(oid):
            raise ValueError(f"object id {oid!r} is not a valid ID")
        if oid in self._ids:
            raise ValueError(f"object id {oid!r} is already used")
        offset = formats.align_up(self._cursor, alignment)
        if offset > self._cursor:
            self._spool.write(b"\x00" * (offset - self._cursor))
        self._spool.write(data)
        self._cursor = offset + len(data)
        self._ids.add(oid)
        return offset

    def add_resource(self, oid: str, data: bytes, alignment: int = 1) -> str:
        """Store raw bytes (`raw_bytes_v1`) at the running cursor (optionally aligned)."""
        if not data:
            raise ValueError(f"resource {oid!r} is empty; resources need at least one byte")
        offset = self._place(oid, alignment, data)
        self._append(ResourceObject(oid, formats.RAW_BYTES, offset, len(data)))
        return oid

    def add_tensor(self, oid: str, fmt: str, layout: str, shape: Iterable[int], data: Any) -> str:
        """Store a tensor; `data` is encoded bytes, a numpy array (direct formats) or planes."""
        shape = tuple(int(d) for d in shape)
        size = formats.encoded_size(layout, fmt, shape, oid)
        if isinstance(data, (bytes, bytearray, memoryview)):
            encoded = data
        else:
            encoded = codecs.encode_tensor(fmt, layout, shape, data)
        if len(encoded) != size:
            raise ArtifactError("encoded_size", f"{len(encoded)} bytes given, {fmt}/{layout} {list(shape)} needs {size}", obj=oid)
        offset = self._place(oid, formats.alignment(layout), encoded)
        obj = TensorObject(oid, shape, fmt, layout, offset, size)
        check_object_encoding(obj)
        self._append(obj)
        return oid

    def _append(self, obj: StoredObject) -> None:
        self.objects.append(obj)
        self._by_id[obj.id] = obj

    def append_payload(self, data: bytes | memoryview) -> None:
        """Raw payload bytes at the cursor, for objects registered later with `add_placed`."""
        self._spool.write(data)
        self._cursor += len(data)

    def add_placed(self, obj: StoredObject) -> None:
        """Register an object whose bytes `append_payload` already wrote at `obj.offset`."""
        if obj.id in self._ids:
            raise ValueError(f"object id {obj.id!r} is already used")
        prev_end = self.objects[-1].offset + self.objects[-1].bytes if self.objects else 0
        if obj.offset < prev_end or obj.offset + obj.bytes > self._cursor:
            raise ArtifactError("object_order", "placed object overlaps another or lies past the payload written", obj=obj.id)
        check_object_encoding(obj)
        self._ids.add(obj.id)
        self._append(obj)

    def tensor(self, oid: str) -> TensorObject:
        obj = self._by_id.get(oid)
        if not isinstance(obj, TensorObject):
            raise KeyError(f"no tensor {oid!r} has been added")
        return obj

    # -- directory ---------------------------------------------------------------------------

    def add_component(
        self,
        name: str,
        config: Mapping[str, Any],
        *,
        target: str | None = None,
        resources: Mapping[str, str] | None = None,
        proposal: Mapping[str, Any] | None = None,
    ) -> None:
        if name in self.components:
            raise ValueError(f"component {name!r} is already defined")
        self.components[name] = Component(
            dict(config), target, MappingProxyType(dict(resources or {})), dict(proposal) if proposal else None
        )

    def bind(self, name: str, object_id: str) -> None:
        """Bind a logical parameter to a whole tensor."""
        obj = self.tensor(object_id)
        self._bind(name, Binding((Part(object_id, 0, obj.elements),), whole=True))

    def bind_parts(self, name: str, parts: Iterable[tuple[str, int, int]]) -> None:
        """Bind a logical parameter to the concatenation of element ranges `(object, begin, end)`."""
        self._bind(name, Binding(tuple(Part(o, b, e) for o, b, e in parts), whole=False))

    def bind_rows(self, name: str, object_id: str, row_begin: int, row_end: int) -> None:
        """Bind complete rows `[row_begin, row_end)` of a matrix."""
        obj = self.tensor(object_id)
        row = obj.elements // obj.shape[0]
        self.bind_parts(name, [(object_id, row_begin * row, row_end * row)])

    def _bind(self, name: str, binding: Binding) -> None:
        if not is_id(name):
            raise ValueError(f"binding name {name!r} is not a valid ID")
        if name in self.bindings:
            raise ValueError(f"binding {name!r} is already defined")
        self.bindings[name] = binding

    def add_use(
        self,
        parameter: str,
        input: str,
        activation_policy: str | None = None,
        auxiliaries: Mapping[str, Binding] | None = None,
    ) -> None:
        from .directory import Use

        if activation_policy is not None and activation_policy not in ACTIVATION_POLICIES:
            raise ValueError(f"activation policy must be one of {ACTIVATION_POLICIES}")
        key = (parameter, input)
        if key in self._use_keys:
            raise ValueError(f"use {key} is already defined")
        self._use_keys.add(key)
        self.uses.append(Use(parameter, input, activation_policy, MappingProxyType(dict(auxiliaries or {}))))

    # -- layout and publication -------------------------------------------------------------

    def _serialize(self, files: list[FileEntry]) -> bytes:
        root = directory_to_json(
            self.components, self.objects, self.bindings, self.uses, files, self.metadata, self.provenance
        )
        return dumps_compact(root)

    def layout(self) -> tuple[bytes, list[int]]:
        """The padded JSON and the per-file payload sizes (the upstream reserve loop)."""

        def serialize(sizes: list[int]) -> bytes:
            files = [FileEntry(None if i == 0 else framing.part_name(self.path.name, i), s) for i, s in enumerate(sizes)]
            return self._serialize(files)

        return framing.reserve_json(serialize, self._cursor, self.shard_limit, self.initial_json_reserve)

    def finish(self) -> Path:
        """Write, validate and publish the artifact; returns the entry path."""
        if self._done:
            raise RuntimeError("artifact already finished")
        if "text" not in self.components:
            raise ArtifactError("components", "an artifact needs a 'text' component")
        self._spool.flush()
        json_bytes, sizes = self.layout()
        parse_directory(json_bytes, entry_name=self.path.name)  # the same checks a reader runs
        targets = [self.path] + [self.path.parent / framing.part_name(self.path.name, i) for i in range(1, len(sizes))]
        for target in targets:
            if target.exists():
                self.abort()
                raise FileExistsError(f"{target} already exists; refusing to overwrite it")
        temps: list[Path] = []
        published: list[Path] = []
        try:
            with open(self._spool.name, "rb") as payload:
                for i, size in enumerate(sizes):
                    tmp = targets[i].with_name(f".{targets[i].name}.tmp-{os.getpid()}")
                    temps.append(tmp)
                    with open(tmp, "xb") as out:
                        if i == 0:
                            out.write(framing.pack_entry_header(len(json_bytes), self.artifact_id))
                            out.write(json_bytes)
                            gap = formats.align_up(framing.HEADER_BYTES + len(json_bytes), framing.PAGE)
                            out.write(b"\x00" * (gap - framing.HEADER_BYTES - len(json_bytes)))
                        else:
                            out.write(framing.pack_part_header(i, self.artifact_id))
                        _copy(payload, out, size)
            self._verify_temps(temps, json_bytes, sizes)
            # parts first, the entry last: a reader never sees an entry whose parts are missing
            order = list(range(1, len(temps))) + [0]
            for i in order:
                _publish(temps[i], targets[i])
                published.append(targets[i])
        except BaseException:
            for path in temps + published:
                path.unlink(missing_ok=True)
            self.abort()
            raise
        self._close_spool()
        self._done = True
        return self.path

    def _verify_temps(self, temps: list[Path], json_bytes: bytes, sizes: list[int]) -> None:
        """Exact lengths of every file, and every object inside the payload, before publishing."""
        entry = formats.align_up(framing.HEADER_BYTES + len(json_bytes), framing.PAGE) + sizes[0]
        expected = [entry] + [framing.PART_PAYLOAD_START + s for s in sizes[1:]]
        for tmp, want in zip(temps, expected, strict=True):
            have = tmp.stat().st_size
            if have != want:
                raise OSError(f"{tmp}: wrote {have} bytes, expected {want}")
        if self.objects and self.objects[-1].offset + self.objects[-1].bytes > sum(sizes):
            raise OSError("payload is shorter than the objects it must hold")

    def _close_spool(self) -> None:
        if not self._spool.closed:
            self._spool.close()
        Path(self._spool.name).unlink(missing_ok=True)

    def abort(self) -> None:
        """Drop everything written so far; no file appears under the target names."""
        self._close_spool()
        self._done = True

    def __enter__(self) -> ArtifactWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
        elif not self._done:
            self.finish()


def _copy(src, dst, size: int) -> None:
    left = size
    while left:
        chunk = src.read(min(COPY_CHUNK, left))
        if not chunk:
            raise OSError("payload spool ended early")
        dst.write(chunk)
        left -= len(chunk)


def _publish(tmp: Path, target: Path) -> None:
    """Move a finished file into place without ever replacing an existing one."""
    try:
        os.link(tmp, target)  # fails if target exists
        tmp.unlink()
    except FileExistsError:
        raise FileExistsError(f"{target} appeared while writing; refusing to overwrite it") from None
    except OSError:
        if target.exists():
            raise FileExistsError(f"{target} already exists; refusing to overwrite it") from None
        shutil.move(str(tmp), str(target))


def write_array_tensor(writer: ArtifactWriter, oid: str, fmt: str, values: np.ndarray) -> str:
    """Convenience: a direct-format tensor in `contiguous_le_v1` from a numpy array."""
    return writer.add_tensor(oid, fmt, formats.CONTIGUOUS, values.shape, values)
