"""Builders for hand-framed artifacts, so tests can write files no valid writer would produce."""

from __future__ import annotations

import copy
import json
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

ENTRY_MAGIC = b"NINFER\x00\x03"
PART_MAGIC = b"NINPRT\x00\x03"
ARTIFACT_ID = bytes(range(16))


def align_up(x: int, a: int) -> int:
    return -(-x // a) * a


def frame(
    path: Path,
    root: dict | bytes,
    payload: bytes,
    *,
    artifact_id: bytes = ARTIFACT_ID,
    magic: bytes = ENTRY_MAGIC,
    json_bytes: int | None = None,
) -> Path:
    """Write an entry file (and parts, per root['files']) around `payload`, without validation."""
    text = root if isinstance(root, bytes) else json.dumps(root, separators=(",", ":")).encode()
    files = root.get("files") if isinstance(root, dict) else None
    if not isinstance(files, list) or not files or not all(isinstance(f, dict) for f in files):
        files = [{"path": None, "payload_bytes": len(payload)}]
    start = align_up(32 + len(text), 4096)
    pos = 0
    with open(path, "wb") as f:
        f.write(struct.pack("<8sQ16s", magic, len(text) if json_bytes is None else json_bytes, artifact_id))
        f.write(text)
        f.write(b"\x00" * (start - 32 - len(text)))
        size0 = files[0]["payload_bytes"] if isinstance(files[0].get("payload_bytes"), int) else len(payload)
        f.write(payload[pos : pos + size0])
        pos += size0
    for i, entry in enumerate(files[1:], start=1):
        if not isinstance(entry.get("path"), str) or not isinstance(entry.get("payload_bytes"), int):
            continue
        with open(path.parent / entry["path"], "wb") as f:
            f.write(struct.pack("<8sQ16s", PART_MAGIC, i, artifact_id).ljust(4096, b"\x00"))
            f.write(payload[pos : pos + entry["payload_bytes"]])
            pos += entry["payload_bytes"]
    return path


def valid_directory() -> tuple[dict, bytes]:
    """A small valid directory and payload: one resource, direct tensors, a fused parent."""
    rng = np.random.default_rng(0)
    resource = b'{"eos_token_id": 1}'
    fused = rng.standard_normal((8, 4)).astype(np.float32)
    head = rng.standard_normal((6, 4)).astype(np.float32)
    ids = np.arange(6, dtype=np.int32)
    scalar = np.array(2.5, dtype=np.float32)
    objects, payload = [], bytearray()

    def place(oid: str, data: bytes, align: int, **members) -> None:
        off = align_up(len(payload), align)
        payload.extend(b"\x00" * (off - len(payload)))
        payload.extend(data)
        objects.append({"id": oid, **members, "offset": off, "bytes": len(data)})

    place("r.generation_config", resource, 1, kind="resource", encoding="raw_bytes_v1")
    place("w.fused", fused.tobytes(), 256, kind="tensor", shape=[8, 4], format="fp32", layout="contiguous_le_v1")
    place("w.head", head.tobytes(), 256, kind="tensor", shape=[6, 4], format="fp32", layout="contiguous_le_v1")
    place("w.ids", ids.tobytes(), 256, kind="tensor", shape=[6], format="int32", layout="contiguous_le_v1")
    place("w.scalar", scalar.tobytes(), 256, kind="tensor", shape=[], format="fp32", layout="contiguous_le_v1")
    root = {
        "components": {
            "text": {
                "config": {"architectures": ["Qwen3_5ForCausalLM"], "hidden_size": 4},
                "resources": {"generation_config.json": "r.generation_config"},
                "proposal": {"domain": "indexed", "rows": 6},
            },
            "mtp": {"config": {"architectures": ["Qwen3_5MTP"]}, "target": "text"},
        },
        "objects": objects,
        "bindings": {
            "text/layers/0/attention/query": {"parts": [{"object": "w.fused", "range": [0, 8]}, {"object": "w.fused", "range": [16, 24]}]},
            "text/layers/0/attention/gate": {"parts": [{"object": "w.fused", "range": [8, 16]}, {"object": "w.fused", "range": [24, 32]}]},
            "text/output_head": {"object": "w.head"},
            "proposal/head": {"object": "w.head"},
            "proposal/token_ids": {"object": "w.ids"},
            "divisor": {"object": "w.scalar"},
        },
        "uses": [
            {"parameter": "text/layers/0/attention/query", "input": "text/layers/0/mixer_input", "activation_policy": "A16Only"},
            {
                "parameter": "text/output_head",
                "input": "text/final_hidden",
                "activation_policy": "AllowA4",
                "auxiliaries": {"activation_input_divisor": {"object": "w.scalar"}},
            },
        ],
        "files": [{"path": None, "payload_bytes": len(payload)}],
        "metadata": {"name": "tiny-test"},
        "provenance": {},
    }
    return root, bytes(payload)


@pytest.fixture
def make_artifact(tmp_path: Path) -> Callable[..., Path]:
    """make_artifact(mutate=None, payload_mutate=None, name='m.ninfer') -> path of a framed file."""

    def build(mutate: Callable[[dict], None] | None = None, payload: bytes | None = None, name: str = "m.ninfer", **kw) -> Path:
        root, data = valid_directory()
        root = copy.deepcopy(root)
        if mutate is not None:
            mutate(root)
        return frame(tmp_path / name, root, data if payload is None else payload, **kw)

    return build
