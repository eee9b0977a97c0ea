"""Writer -> reader round trips, sharding, JSON reserve and the spec's computed framing examples."""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from ninfer_runtime.artifact import Artifact, ArtifactError, ArtifactWriter, framing
from ninfer_runtime.artifact.directory import dumps_compact, loads_strict
from ninfer_runtime.artifact.quantize import quantize_fp8_row, quantize_grouped, quantize_nvfp4

# the computed example directory of the container spec (section 2.9), as data
SPEC_EXAMPLE = Path(__file__).resolve().parent / "data" / "spec_example_directory.json"


def _text_component(writer: ArtifactWriter, **resources: str) -> None:
    writer.add_component("text", {"architectures": ["Qwen3_5ForCausalLM"]}, resources=resources)


def _mixed_artifact(path: Path, shard_limit: int = framing.DEFAULT_SHARD_LIMIT) -> dict[str, np.ndarray]:
    """Writes one tensor of every format x layout; returns the float values each should decode to."""
    rng = np.random.default_rng(1)
    expected: dict[str, np.ndarray] = {}
    with ArtifactWriter(path, shard_limit=shard_limit, metadata={"name": "mixed"}) as w:
        w.add_resource("resource/text/tokenizer.json", b'{"model": {}}')
        emb = rng.standard_normal((300, 64)).astype(np.float32).astype(ml_dtypes.bfloat16)
        w.add_tensor("w.bf16", "bf16", "contiguous_le_v1", emb.shape, emb)
        expected["w.bf16"] = emb.astype(np.float32)
        f32 = rng.standard_normal((5, 3, 7)).astype(np.float32)
        w.add_tensor("w.fp32", "fp32", "contiguous_le_v1", f32.shape, f32)
        expected["w.fp32"] = f32
        i32 = rng.integers(-(2**31), 2**31 - 1, size=(11,), dtype=np.int32)
        w.add_tensor("w.int32", "int32", "contiguous_le_v1", i32.shape, i32)
        expected["w.int32"] = i32
        for fmt in ("q4_g64_fp16", "q5_g64_fp16", "q6_g64_fp16", "q8_g32_fp16"):
            x = rng.standard_normal((37, 200)).astype(np.float32)
            planes = quantize_grouped(x, fmt)
            w.add_tensor(f"w.{fmt}", fmt, "row_split_k128_v1", x.shape, planes)
            expected[f"w.{fmt}"] = planes
        x = rng.standard_normal((256, 128)).astype(np.float32)
        expected["w.nvfp4"] = quantize_nvfp4(x)
        w.add_tensor("w.nvfp4", "nvfp4", "block_scale_k16_m128x4_v1", x.shape, expected["w.nvfp4"])
        x = rng.standard_normal((9, 33)).astype(np.float32)
        expected["w.fp8"] = quantize_fp8_row(x)
        w.add_tensor("w.fp8", "fp8_e4m3fn_row_bf16", "row_scale_v1", x.shape, expected["w.fp8"])
        _text_component(w, **{"tokenizer.json": "resource/text/tokenizer.json"})
        w.bind("text/token_embedding", "w.bf16")
        w.bind_rows("text/layers/0/attention/query", "w.q4_g64_fp16", 0, 20)
        w.bind_rows("text/layers/0/attention/key", "w.q4_g64_fp16", 20, 37)
        w.bind_parts("interleaved", [("w.bf16", 0, 64), ("w.bf16", 128, 192)])
        w.add_use("text/layers/0/attention/query", "text/layers/0/mixer_input", "A16Only")
    return expected


def _check_mixed(art: Artifact, expected: dict) -> None:
    from ninfer_runtime.artifact.codecs import dequantize

    for oid, want in expected.items():
        got = art.decode(oid)
        if isinstance(want, np.ndarray):
            np.testing.assert_array_equal(got, want)
        else:
            np.testing.assert_array_equal(got, dequantize(want))
            planes = art.planes(oid)
            for field in ("codes", "scales"):
                np.testing.assert_array_equal(getattr(planes, field), getattr(want, field))
    q = art.parameter("text/layers/0/attention/query", (20, 200))
    k = art.parameter("text/layers/0/attention/key", (17, 200))
    np.testing.assert_array_equal(np.concatenate([q, k]), art.decode("w.q4_g64_fp16"))
    emb = expected["w.bf16"]
    np.testing.assert_array_equal(art.parameter("interleaved", (2, 64)), emb[[0, 2]])
    assert art.resource("text", "tokenizer.json") == b'{"model": {}}'


def test_single_file_round_trip(tmp_path):
    path = tmp_path / "mixed.ninfer"
    expected = _mixed_artifact(path)
    assert [p.name for p in tmp_path.iterdir()] == ["mixed.ninfer"]  # spool and temps are gone
    with Artifact(path, strict=True) as art:
        assert len(art.directory.files) == 1
        assert art.metadata == {"name": "mixed"}
        _check_mixed(art, expected)
        # upstream writer convention: JSON padded with spaces, no alignment gap
        assert framing.HEADER_BYTES + art.header.json_bytes == art.header.payload_start


def test_multi_part_round_trip_with_straddling_object(tmp_path):
    path = tmp_path / "mixed.ninfer"
    expected = _mixed_artifact(path, shard_limit=5 * 4096)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names[0] == "mixed.ninfer" and names[1] == "mixed.ninfer.part-0001" and len(names) > 3
    with Artifact(path, strict=True) as art:
        files = art.directory.files
        starts = np.cumsum([0] + [f.payload_bytes for f in files])
        straddling = [o.id for o in art.objects if any(o.offset < s < o.offset + o.bytes for s in starts[1:-1])]
        assert straddling, "the test needs at least one object spanning two files"
        _check_mixed(art, expected)
    for part in tmp_path.glob("mixed.ninfer.part-*"):
        assert part.stat().st_size <= 5 * 4096


def test_sharded_and_single_file_read_identically(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    _mixed_artifact(a / "m.ninfer")
    _mixed_artifact(b / "m.ninfer", shard_limit=3 * 4096)
    with Artifact(a / "m.ninfer") as one, Artifact(b / "m.ninfer") as many:
        assert one.payload_bytes == many.payload_bytes
        assert bytes(one.read(0, one.payload_bytes)) == bytes(many.read(0, many.payload_bytes))
        assert one.artifact_id != many.artifact_id  # fresh id per written set


def test_writer_refuses_to_overwrite(tmp_path):
    path = tmp_path / "m.ninfer"
    path.write_bytes(b"precious")
    with pytest.raises(FileExistsError):
        ArtifactWriter(path)
    path.unlink()
    w = ArtifactWriter(path)
    w.add_tensor("w", "fp32", "contiguous_le_v1", (2,), np.zeros(2, np.float32))
    _text_component(w)
    path.write_bytes(b"precious")  # appears while the writer works
    with pytest.raises(FileExistsError):
        w.finish()
    assert path.read_bytes() == b"precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.ninfer"]


def test_writer_abort_leaves_nothing(tmp_path):
    path = tmp_path / "m.ninfer"
    with pytest.raises(RuntimeError):
        with ArtifactWriter(path) as w:
            w.add_tensor("w", "fp32", "contiguous_le_v1", (2,), np.zeros(2, np.float32))
            raise RuntimeError("converter failed")
    assert list(tmp_path.iterdir()) == []


def test_writer_rejects_wrong_encoded_length(tmp_path):
    w = ArtifactWriter(tmp_path / "m.ninfer")
    with pytest.raises(ArtifactError) as info:
        w.add_tensor("w", "bf16", "contiguous_le_v1", (4,), b"\x00" * 6)
    assert info.value.rule == "encoded_size"
    w.abort()


def test_tensor_alignment_and_resource_packing(tmp_path):
    path = tmp_path / "m.ninfer"
    with ArtifactWriter(path) as w:
        w.add_resource("r1", b"abc")
        w.add_resource("r2", b"de")
        w.add_tensor("t", "fp32", "contiguous_le_v1", (1,), np.ones(1, np.float32))
        _text_component(w)
    with Artifact(path, strict=True) as art:
        offsets = {o.id: o.offset for o in art.objects}
        assert offsets == {"r1": 0, "r2": 3, "t": 256}
        assert art.payload_bytes == 260  # ends exactly at the last object


# -- computed examples of the spec ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "payload,start,limit,sizes",
    [
        (31_999_938_560, 65_536, 32_000_000_000, [31_999_934_464, 4_096]),
        (140_246_016, 65_536, 64_000_000, [63_934_464, 63_995_904, 12_315_648]),
        (140_246_016, 8_192, 64_000_000, [63_991_808, 63_995_904, 12_258_304]),
        (100_000_000_000, 65_536, 32_000_000_000, [31_999_934_464, 31_999_995_904, 31_999_995_904, 4_000_073_728]),
    ],
)
def test_sharding_examples(payload, start, limit, sizes):
    assert framing.plan_files(payload, start, limit) == sizes
    assert start + sizes[0] <= limit


def test_shard_limit_too_small():
    with pytest.raises(ArtifactError) as info:
        framing.plan_files(10_000, 8192, 8192)
    assert info.value.rule == "shard_limit"


def _spec_example_directory() -> dict:
    return loads_strict(SPEC_EXAMPLE.read_bytes())


def test_spec_example_directory_framing():
    root = _spec_example_directory()
    assert len(dumps_compact(root)) == 4691

    def serialize(sizes):
        root["files"] = [{"path": None if i == 0 else f"m.part-{i:04d}", "payload_bytes": s} for i, s in enumerate(sizes)]
        return dumps_compact(root)

    padded, sizes = framing.reserve_json(serialize, 140_338_176, framing.DEFAULT_SHARD_LIMIT)
    assert len(padded) == 8160 and sizes == [140_338_176]
    assert padded.endswith(b" ") and json.loads(padded) is not None
    assert framing.HEADER_BYTES + len(padded) + sizes[0] == 140_346_368


def test_spec_example_directory_is_valid():
    from ninfer_runtime.artifact.directory import check_object_encoding, parse_directory

    root = _spec_example_directory()
    d = parse_directory(dumps_compact(root))
    for obj in d.objects:
        check_object_encoding(obj)
    q = d.bindings["text/layers/0/attention/key"]
    assert (q.parts[0].begin, q.parts[0].end) == (16384, 32768)


def test_spec_mixed_sharded_variant():
    """The section 2.9 sharded variant: 65,536-byte entry start, 64 MB limit, 3 files."""

    def serialize(sizes):
        return b"{}"

    _, sizes = framing.reserve_json(serialize, 140_246_016, 64_000_000, initial_reserve=65_504)
    assert sizes == [63_934_464, 63_995_904, 12_315_648]


def test_part_names():
    assert framing.part_name("model.ninfer", 1) == "model.ninfer.part-0001"
    assert framing.part_name("model.ninfer", 10000) == "model.ninfer.part-10000"


def test_read_bounds(tmp_path):
    path = tmp_path / "m.ninfer"
    _mixed_artifact(path)
    with Artifact(path) as art:
        assert art.read(art.payload_bytes, 0) == b""
        with pytest.raises(ArtifactError):
            art.read(art.payload_bytes - 1, 2)
