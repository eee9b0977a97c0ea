"""Binary framing of v3 artifacts: entry and continuation headers, shard planning (spec 1.2-1.6)."""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from .errors import ArtifactError
from .formats import align_up

ENTRY_MAGIC = b"NINFER\x00\x03"
PART_MAGIC = b"NINPRT\x00\x03"
V2_MAGIC = b"NINFER\x00\x02"
V1_MAGIC = b"NINFER\x00\x01"
HEADER = struct.Struct("<8sQ16s")  # magic, json_bytes | part_index, artifact_id
HEADER_BYTES = HEADER.size  # 32
PAGE = 4096
PART_PAYLOAD_START = PAGE
DEFAULT_SHARD_LIMIT = 32_000_000_000  # decimal bytes, as upstream


@dataclass(frozen=True)
class EntryHeader:
    json_bytes: int
    artifact_id: bytes

    @property
    def metadata_end(self) -> int:
        return HEADER_BYTES + self.json_bytes

    @property
    def payload_start(self) -> int:
        return align_up(self.metadata_end, PAGE)


def new_artifact_id() -> bytes:
    return uuid.uuid4().bytes


def format_artifact_id(artifact_id: bytes) -> str:
    return artifact_id.hex()


def parse_entry_header(data: bytes, actual_size: int, path: str) -> EntryHeader:
    if len(data) < HEADER_BYTES or actual_size < HEADER_BYTES:
        raise ArtifactError("short_file", f"file has {actual_size} bytes, fewer than the 32-byte header", path=path)
    magic, json_bytes, artifact_id = HEADER.unpack(data[:HEADER_BYTES])
    if magic in (V2_MAGIC, V1_MAGIC):
        version = magic[-1]
        raise ArtifactError(
            "old_version",
            f"this is a v{version} artifact; convert it with `ninfer upgrade OLD.ninfer -o NEW.ninfer`",
            path=path,
        )
    if magic != ENTRY_MAGIC:
        raise ArtifactError("magic", f"not a .ninfer v3 entry file (magic {magic.hex(' ')})", path=path)
    if not 1 <= json_bytes <= actual_size - HEADER_BYTES:
        raise ArtifactError(
            "json_bytes", f"json_bytes {json_bytes} is outside 1..{actual_size - HEADER_BYTES}", path=path
        )
    return EntryHeader(json_bytes, artifact_id)


def pack_entry_header(json_bytes: int, artifact_id: bytes) -> bytes:
    return HEADER.pack(ENTRY_MAGIC, json_bytes, artifact_id)


def pack_part_header(part_index: int, artifact_id: bytes) -> bytes:
    return HEADER.pack(PART_MAGIC, part_index, artifact_id).ljust(PAGE, b"\x00")


def check_part_header(data: bytes, actual_size: int, index: int, artifact_id: bytes, expected_payload: int, path: str) -> None:
    if actual_size < HEADER_BYTES or len(data) < HEADER_BYTES:
        raise ArtifactError("short_file", f"part has {actual_size} bytes, fewer than its 32-byte header", path=path)
    magic, part_index, part_id = HEADER.unpack(data[:HEADER_BYTES])
    if magic != PART_MAGIC:
        raise ArtifactError("part_magic", f"not a .ninfer v3 continuation part (magic {magic.hex(' ')})", path=path)
    if part_index != index:
        raise ArtifactError("part_index", f"part header says index {part_index}, the files table says {index}", path=path)
    if part_id != artifact_id:
        raise ArtifactError(
            "artifact_id",
            f"part belongs to artifact {part_id.hex()}, not {artifact_id.hex()} (a foreign or stale part)",
            path=path,
        )
    expected = PART_PAYLOAD_START + expected_payload
    if actual_size != expected:
        raise ArtifactError("file_size", f"part is {actual_size} bytes, the files table requires {expected}", path=path)


def plan_files(payload_bytes: int, entry_payload_start: int, limit: int) -> list[int]:
    """Per-file payload sizes for a payload under a per-file byte limit (spec 1.6)."""
    if payload_bytes < 1:
        raise ArtifactError("files", "an artifact needs a non-empty payload")
    if entry_payload_start + payload_bytes <= limit:
        return [payload_bytes]
    entry_capacity = (limit - entry_payload_start) // PAGE * PAGE
    part_capacity = (limit - PAGE) // PAGE * PAGE
    if entry_payload_start >= limit or entry_capacity <= 0 or part_capacity <= 0:
        raise ArtifactError(
            "shard_limit", f"shard limit {limit} is too small for a {entry_payload_start}-byte entry header and JSON"
        )
    sizes = [entry_capacity]
    rest = payload_bytes - entry_capacity
    while rest > part_capacity:
        sizes.append(part_capacity)
        rest -= part_capacity
    sizes.append(rest)
    return sizes


def reserve_json(
    serialize: Callable[[list[int]], bytes],
    payload_bytes: int,
    limit: int,
    initial_reserve: int | None = None,
) -> tuple[bytes, list[int]]:
    """The upstream JSON reserve loop (spec 1.6): padded JSON and per-file payload sizes.

    `serialize(sizes)` renders the directory for a given files table. The loop grows the reserve
    until the JSON fits, so `json_bytes` never changes once the payload layout is fixed.
    """
    if initial_reserve is None:
        first = serialize([payload_bytes])
        reserve = align_up(HEADER_BYTES + len(first), PAGE) - HEADER_BYTES
    else:
        reserve = initial_reserve
    while True:
        sizes = plan_files(payload_bytes, HEADER_BYTES + reserve, limit)
        text = serialize(sizes)
        if len(text) <= reserve:
            return text + b" " * (reserve - len(text)), sizes
        reserve = align_up(HEADER_BYTES + len(text), PAGE) - HEADER_BYTES


def part_name(entry_name: str, index: int) -> str:
    return f"{entry_name}.part-{index:04d}"
