"""Reading v3 artifacts: open the entry file, memory-map parts on first touch, decode tensors.

The reader never trusts a size it has not checked against the file system: every length it
allocates is bounded by bytes that exist on disk, and every failure is an `ArtifactError`.
"""

from __future__ import annotations

import bisect
import mmap
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from . import codecs, framing
from .directory import (
    Binding,
    Directory,
    ResourceObject,
    StoredObject,
    TensorObject,
    check_object_encoding,
    parse_directory,
)
from .errors import ArtifactError


class _Segment:
    """One file of the set: where its payload slice sits in the file and in the logical space."""

    def __init__(self, index: int, path: Path, logical_start: int, payload_bytes: int) -> None:
        self.index = index
        self.path = path
        self.logical_start = logical_start
        self.payload_bytes = payload_bytes
        self.file_payload_start = 0
        self.map: mmap.mmap | None = None


class Artifact:
    """An open `.ninfer` v3 artifact (entry file plus parts)."""

    def __init__(self, path: str | os.PathLike, *, strict: bool = False) -> None:
        self.path = Path(path)
        self._checked: set[str] = set()
        self._segments: list[_Segment] = []
        self._file = None
        try:
            self._open_entry()
        except OSError as exc:
            self.close()
            raise ArtifactError("io", f"cannot read artifact: {exc.strerror or exc}", path=str(self.path)) from None
        except BaseException:
            self.close()
            raise
        if strict:
            self.check_all_encodings()

    # -- opening ---------------------------------------------------------------------------

    def _open_entry(self) -> None:
        path = str(self.path)
        self._file = open(self.path, "rb")  # noqa: SIM115 - lives as long as the artifact
        size = os.fstat(self._file.fileno()).st_size
        head = self._file.read(framing.HEADER_BYTES)
        header = framing.parse_entry_header(head, size, path)
        raw_json = self._file.read(header.json_bytes)
        if len(raw_json) != header.json_bytes:
            raise ArtifactError("short_file", "file ends inside the JSON directory", path=path)
        try:
            self.directory: Directory = parse_directory(raw_json, entry_name=self.path.name)
        except ArtifactError as exc:
            raise ArtifactError(exc.rule, exc.detail, obj=exc.obj, path=path) from None
        self.header = header
        files = self.directory.files
        expected = header.payload_start + files[0].payload_bytes
        if size != expected:
            raise ArtifactError(
                "file_size",
                f"entry file is {size} bytes; header, JSON and files[0].payload_bytes require exactly {expected}",
                path=path,
            )
        start = 0
        for i, entry in enumerate(files):
            seg_path = self.path if i == 0 else self.path.parent / entry.path
            self._segments.append(_Segment(i, seg_path, start, entry.payload_bytes))
            start += entry.payload_bytes
        self._starts = [s.logical_start for s in self._segments]
        first = self._segments[0]
        first.file_payload_start = header.payload_start
        first.map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)

    def _touch(self, seg: _Segment) -> mmap.mmap:
        """Open and check a continuation part the first time a read needs it (spec 1.3)."""
        if seg.map is not None:
            return seg.map
        path = str(seg.path)
        try:
            with open(seg.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                head = f.read(framing.HEADER_BYTES)
                framing.check_part_header(
                    head, size, seg.index, self.header.artifact_id, seg.payload_bytes, path
                )
                seg.map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except FileNotFoundError:
            raise ArtifactError("part_missing", f"part {seg.index} of the artifact is missing", path=path) from None
        except OSError as exc:
            raise ArtifactError("io", f"cannot read part {seg.index}: {exc.strerror or exc}", path=path) from None
        seg.file_payload_start = framing.PART_PAYLOAD_START
        return seg.map

    def close(self) -> None:
        for seg in self._segments:
            if seg.map is not None:
                try:
                    seg.map.close()
                except BufferError:  # a caller still holds a view; the GC unmaps it later
                    pass
                seg.map = None
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> Artifact:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- directory views -----------------------------------------------------------------

    @property
    def artifact_id(self) -> str:
        return framing.format_artifact_id(self.header.artifact_id)

    @property
    def payload_bytes(self) -> int:
        return self.directory.payload_bytes

    @property
    def components(self):
        return self.directory.components

    @property
    def objects(self) -> tuple[StoredObject, ...]:
        return self.directory.objects

    @property
    def bindings(self):
        return self.directory.bindings

    @property
    def uses(self):
        return self.directory.uses

    @property
    def metadata(self) -> dict:
        return self.directory.metadata

    @property
    def provenance(self) -> dict:
        return self.directory.provenance

    def part_paths(self) -> list[Path]:
        return [s.path for s in self._segments]

    def object(self, object_id: str) -> StoredObject:
        obj = self.directory.objects_by_id.get(object_id)
        if obj is None:
            raise ArtifactError("unknown_object", "no such object in the artifact", obj=object_id, path=str(self.path))
        if object_id not in self._checked:
            check_object_encoding(obj)
            self._checked.add(object_id)
        return obj

    def tensor_object(self, object_id: str) -> TensorObject:
        obj = self.object(object_id)
        if not isinstance(obj, TensorObject):
            raise ArtifactError("object_kind", "object is a resource, not a tensor", obj=object_id)
        return obj

    def binding(self, name: str) -> Binding:
        binding = self.directory.bindings.get(name)
        if binding is None:
            raise ArtifactError("unknown_binding", f"the artifact has no binding named {name!r}", path=str(self.path))
        return binding

    def check_all_encodings(self) -> None:
        """Strict mode: the per-object encoding rules of every object (check 9 of spec 2.7)."""
        for obj in self.directory.objects:
            self.object(obj.id)

    # -- bytes -----------------------------------------------------------------------------

    def read(self, offset: int, length: int) -> bytes | memoryview:
        """Logical payload bytes `[offset, offset + length)` (zero-copy within one file)."""
        if offset < 0 or length < 0 or offset + length > self.payload_bytes:
            raise ArtifactError(
                "read_bounds", f"read [{offset}, {offset + length}) outside the {self.payload_bytes}-byte payload"
            )
        if length == 0:
            return b""
        first = bisect.bisect_right(self._starts, offset) - 1
        chunks = []
        pos, end = offset, offset + length
        for seg in self._segments[first:]:
            if pos >= end:
                break
            seg_end = seg.logical_start + seg.payload_bytes
            if seg_end <= pos:
                continue
            stop = min(end, seg_end)
            data = self._touch(seg)
            file_lo = seg.file_payload_start + (pos - seg.logical_start)
            file_hi = file_lo + (stop - pos)
            if file_hi > len(data):
                raise ArtifactError("short_read", f"file ends before byte {file_hi}", path=str(seg.path))
            chunks.append(memoryview(data)[file_lo:file_hi])
            pos = stop
        if len(chunks) == 1:
            return chunks[0]
        return b"".join(chunks)

    def object_reader(self, obj: StoredObject) -> Callable[[int, int], bytes | memoryview]:
        """A `read(offset, length)` callable over one object's bytes, as the codecs expect."""

        def read(off: int, length: int) -> bytes | memoryview:
            if off < 0 or length < 0 or off + length > obj.bytes:
                raise ArtifactError("read_bounds", f"read [{off}, {off + length}) outside the object's {obj.bytes} bytes", obj=obj.id)
            return self.read(obj.offset + off, length)

        return read

    def object_bytes(self, object_id: str) -> bytes:
        obj = self.object(object_id)
        return bytes(self.read(obj.offset, obj.bytes))

    def resource(self, component: str, role: str) -> bytes:
        comp = self.directory.components.get(component)
        if comp is None:
            raise ArtifactError("unknown_component", f"the artifact has no component {component!r}")
        oid = comp.resources.get(role)
        if oid is None:
            raise ArtifactError("unknown_resource", f"component {component!r} has no resource role {role!r}")
        obj = self.object(oid)
        assert isinstance(obj, ResourceObject)
        return bytes(self.read(obj.offset, obj.bytes))

    # -- tensors ---------------------------------------------------------------------------

    def planes(self, object_id: str, rows: tuple[int, int] | None = None):
        """Stored words of a tensor (codes and scales for quantized formats), optionally a row slice."""
        obj = self.tensor_object(object_id)
        return codecs.unpack_planes(obj.layout, obj.format, obj.shape, self.object_reader(obj), rows=rows, obj=obj.id)

    def decode(self, object_id: str, rows: tuple[int, int] | None = None, dtype: str = "float32") -> np.ndarray:
        """Logical values of a tensor in its logical shape (rows select along axis 0)."""
        obj = self.tensor_object(object_id)
        if rows is not None:
            n0 = obj.shape[0] if obj.shape else 1
            if not obj.shape or not 0 <= rows[0] <= rows[1] <= n0:
                raise ArtifactError("rows", f"row range {rows} is outside the tensor's {n0} rows", obj=obj.id)
        return codecs.decode_tensor(
            obj.format, obj.layout, obj.shape, self.object_reader(obj), rows=rows, obj=obj.id, dtype=dtype
        )

    def decode_elements(self, object_id: str, begin: int, end: int) -> np.ndarray:
        """Elements `[begin, end)` of a tensor in C order, decoding only the rows that hold them."""
        obj = self.tensor_object(object_id)
        if not 0 <= begin <= end <= obj.elements:
            raise ArtifactError("binding_range", f"elements [{begin}, {end}) outside the tensor", obj=obj.id)
        if len(obj.shape) == 0:
            return self.decode(object_id).reshape(-1)[begin:end]
        row_len = obj.elements // obj.shape[0]
        r0, r1 = begin // row_len, -(-end // row_len)
        flat = self.decode(object_id, rows=(r0, r1)).reshape(-1)
        return flat[begin - r0 * row_len : end - r0 * row_len]

    def parameter(self, name: str, shape: tuple[int, ...] | list[int] | None = None) -> np.ndarray:
        """The logical parameter `name` assembled from its binding parts, as float32/int32."""
        binding = self.binding(name)
        pieces = [self.decode_elements(p.object, p.begin, p.end) for p in binding.parts]
        flat = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
        if shape is None:
            if binding.whole:
                shape = self.tensor_object(binding.parts[0].object).shape
            else:
                shape = (flat.size,)
        shape = tuple(shape)
        if int(np.prod(shape, dtype=np.int64)) != flat.size:
            raise ArtifactError(
                "binding_shape", f"binding {name!r} has {flat.size} elements, the parameter shape {list(shape)} needs "
                f"{int(np.prod(shape))}",
            )
        return flat.reshape(shape)

    def iter_row_blocks(self, object_id: str, max_bytes: int = 64 << 20) -> Iterator[np.ndarray]:
        """Decode a tensor block by block along axis 0 so memory stays bounded for huge tensors."""
        obj = self.tensor_object(object_id)
        if len(obj.shape) < 1:
            yield self.decode(object_id)
            return
        row_elems = obj.elements // obj.shape[0]
        rows_per_block = max(1, max_bytes // max(1, row_elems * 4))
        if obj.layout == "block_scale_k16_m128x4_v1":
            rows_per_block = max(128, rows_per_block // 128 * 128)
        for r0 in range(0, obj.shape[0], rows_per_block):
            yield self.decode(object_id, rows=(r0, min(obj.shape[0], r0 + rows_per_block)))


def open_artifact(path: str | os.PathLike, *, strict: bool = False) -> Artifact:
    return Artifact(path, strict=strict)
