"""Property tests: random damage to a valid artifact only ever raises `ArtifactError`.

Two kinds of damage: random byte overwrites anywhere in the entry file or a part, and
structural JSON edits (a random member replaced by a random JSON value, or deleted). After
damage the artifact is opened in strict mode and every object, binding and resource is used.
The allocation bound checks that no damaged size field makes the reader allocate more memory
than the files hold (opening) or than decoding the stored elements can need (decoding).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ninfer_runtime.artifact import Artifact, ArtifactError, ArtifactWriter, framing
from ninfer_runtime.artifact.quantize import quantize_fp8_row, quantize_grouped, quantize_nvfp4

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


def _build(directory: Path) -> Path:
    rng = np.random.default_rng(7)
    path = directory / "m.ninfer"
    with ArtifactWriter(path, shard_limit=12 * 4096) as w:
        w.add_resource("r.template", "{{ messages }} ü".encode())
        blob = rng.standard_normal((256, 96)).astype(np.float32)
        w.add_tensor("w.blob", "bf16", "contiguous_le_v1", blob.shape, blob)
        w.add_tensor("w.q5", "q5_g64_fp16", "row_split_k128_v1", (20, 130), quantize_grouped(rng.standard_normal((20, 130)).astype(np.float32), "q5_g64_fp16"))
        w.add_tensor("w.nv", "nvfp4", "block_scale_k16_m128x4_v1", (128, 64), quantize_nvfp4(rng.standard_normal((128, 64)).astype(np.float32)))
        w.add_tensor("w.fp8", "fp8_e4m3fn_row_bf16", "row_scale_v1", (3, 40), quantize_fp8_row(rng.standard_normal((3, 40)).astype(np.float32)))
        w.add_tensor("w.ids", "int32", "contiguous_le_v1", (5,), np.arange(5, dtype=np.int32))
        w.add_component("text", {"architectures": ["Qwen3_5ForCausalLM"]}, resources={"chat_template.jinja": "r.template"})
        w.bind("text/token_embedding", "w.blob")
        w.bind_rows("a", "w.q5", 0, 10)
        w.bind_parts("b", [("w.q5", 1300, 2600), ("w.nv", 0, 64)])
        w.bind("c", "w.fp8")
        w.add_use("a", "x", "A16Only", {"activation_input_divisor": w.bindings["c"]})
    return path


@pytest.fixture(scope="module")
def pristine() -> Path:
    directory = Path(tempfile.mkdtemp(prefix="ninfer-corrupt-"))
    _build(directory)
    yield directory
    shutil.rmtree(directory)


def _files(directory: Path) -> list[Path]:
    return sorted(directory.iterdir())


def _exercise(path: Path) -> None:
    """Use everything: strict open, every object decoded, every binding, every resource."""
    total = sum(p.stat().st_size for p in path.parent.iterdir())
    tracemalloc.start()
    try:
        try:
            art = Artifact(path, strict=True)
        except ArtifactError:
            _, peak = tracemalloc.get_traced_memory()
            assert peak <= total, f"opening allocated {peak} bytes for {total} bytes of files"
            return
        _, peak = tracemalloc.get_traced_memory()
        assert peak <= total, f"opening allocated {peak} bytes for {total} bytes of files"
        tracemalloc.reset_peak()
        with art:
            for obj in art.objects:
                try:
                    if obj.kind == "tensor":
                        art.decode(obj.id)
                        art.planes(obj.id) if obj.format not in ("bf16", "fp32", "int32") else None
                    else:
                        art.object_bytes(obj.id)
                except ArtifactError:
                    pass
            for name in art.bindings:
                try:
                    art.parameter(name)
                except ArtifactError:
                    pass
            for cname, comp in art.components.items():
                for role in comp.resources:
                    try:
                        art.resource(cname, role)
                    except ArtifactError:
                        pass
        _, peak = tracemalloc.get_traced_memory()
        # float32 output of 4-bit codes is 8x their bytes, plus decoding temporaries
        assert peak <= 24 * total, f"decoding allocated {peak} bytes for {total} bytes of files"
    finally:
        tracemalloc.stop()


@SETTINGS
@given(data=st.data())
def test_random_byte_damage(pristine, tmp_path_factory, data):
    work = tmp_path_factory.mktemp("bytes")
    for f in _files(pristine):
        shutil.copy(f, work / f.name)
    files = _files(work)
    target = data.draw(st.sampled_from(files))
    raw = bytearray(target.read_bytes())
    for _ in range(data.draw(st.integers(1, 8))):
        # bias half of the hits towards the header and JSON, where structure lives
        hi = len(raw) if data.draw(st.booleans()) else min(len(raw), 32 + 4096)
        pos = data.draw(st.integers(0, hi - 1))
        raw[pos] = data.draw(st.integers(0, 255))
    if data.draw(st.integers(0, 9)) == 0:
        raw = raw[: data.draw(st.integers(0, len(raw)))]  # truncation
    target.write_bytes(bytes(raw))
    _exercise(work / "m.ninfer")


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.sampled_from([0, 1, 255, 256, 4096, 2**63, 2**64 - 1, 2**64])
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
    | st.sampled_from(["w.blob", "w.q5", "r.template", "text", "nvfp4", "q4_g64_fp16", "row_split_k128_v1"]),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=8,
)


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, prefix + (key,))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _paths(value, prefix + (i,))


@SETTINGS
@given(data=st.data())
def test_random_json_damage(pristine, tmp_path_factory, data):
    work = tmp_path_factory.mktemp("json")
    for f in _files(pristine):
        shutil.copy(f, work / f.name)
    entry = work / "m.ninfer"
    raw = entry.read_bytes()
    json_bytes = int.from_bytes(raw[8:16], "little")
    root = json.loads(raw[32 : 32 + json_bytes])
    for _ in range(data.draw(st.integers(1, 3))):
        paths = [p for p in _paths(root) if p]
        path = data.draw(st.sampled_from(paths))
        parent = root
        for key in path[:-1]:
            parent = parent[key]
        if data.draw(st.integers(0, 4)) == 0 and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = data.draw(JSON_VALUES)
    text = json.dumps(root, separators=(",", ":")).encode()
    start = framing.HEADER_BYTES + json_bytes
    payload_start = -(-start // 4096) * 4096
    if len(text) <= payload_start - 32:  # keep the payload where it was
        new = raw[:32] + text + b" " * (payload_start - 32 - len(text)) + raw[payload_start:]
        new = new[:8] + (payload_start - 32).to_bytes(8, "little") + new[16:]
        entry.write_bytes(new)
    _exercise(entry)


def test_pristine_is_clean(pristine):
    with Artifact(pristine / "m.ninfer", strict=True) as art:
        assert len(art.directory.files) > 1
        assert art.parameter("b").size == 1300 + 64
