"""One negative test per validation rule of the reader checklist (artifact spec 2.7).

Each case starts from a valid hand-framed artifact, breaks exactly one rule, and expects the
project's `ArtifactError` with the rule's identifier (and the object it concerns, if any).
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from ninfer_runtime.artifact import Artifact, ArtifactError

from .conftest import ARTIFACT_ID, frame, valid_directory


def expect(path: Path, rule: str, obj: str | None = None, strict: bool = True) -> ArtifactError:
    with pytest.raises(ArtifactError) as info:
        with Artifact(path, strict=strict) as art:
            for name in art.bindings:
                art.parameter(name)
    assert info.value.rule == rule, str(info.value)
    if obj is not None:
        assert info.value.obj == obj, str(info.value)
        assert obj in str(info.value)
    return info.value


def test_valid_fixture_opens(make_artifact):
    with Artifact(make_artifact(), strict=True) as art:
        assert art.metadata["name"] == "tiny-test"
        assert art.parameter("text/layers/0/attention/query").shape == (16,)


# -- framing ------------------------------------------------------------------------------------


def test_wrong_magic(make_artifact):
    expect(make_artifact(magic=b"NINFEX\x00\x03"), "magic")


def test_v2_magic_points_to_upgrade(make_artifact):
    err = expect(make_artifact(magic=b"NINFER\x00\x02"), "old_version")
    assert "ninfer upgrade" in str(err)


def test_short_file(tmp_path):
    path = tmp_path / "short.ninfer"
    path.write_bytes(b"NINFER\x00\x03\x01")
    expect(path, "short_file")


def test_empty_file(tmp_path):
    path = tmp_path / "empty.ninfer"
    path.write_bytes(b"")
    expect(path, "short_file")


@pytest.mark.parametrize("json_bytes", [0, 1 << 40])
def test_json_bytes_out_of_range(make_artifact, json_bytes):
    expect(make_artifact(json_bytes=json_bytes), "json_bytes")


def test_trailing_bytes(make_artifact):
    path = make_artifact()
    with open(path, "ab") as f:
        f.write(b"\x00")
    expect(path, "file_size")


def test_truncated_entry(make_artifact):
    path = make_artifact()
    data = path.read_bytes()
    path.write_bytes(data[:-1])
    expect(path, "file_size")


def test_missing_file(tmp_path):
    expect(tmp_path / "nope.ninfer", "io")


# -- JSON syntax ----------------------------------------------------------------------------------


def _raw_json(tmp_path: Path, text: bytes) -> Path:
    _, payload = valid_directory()
    return frame(tmp_path / "m.ninfer", text, payload)


def test_invalid_utf8(tmp_path):
    expect(_raw_json(tmp_path, b'{"a":"\xff"}'), "json_utf8")


def test_invalid_json(tmp_path):
    expect(_raw_json(tmp_path, b'{"components":'), "json_syntax")


def test_duplicate_member(tmp_path):
    expect(_raw_json(tmp_path, b'{"a":1,"a":2}'), "json_duplicate_member")


def test_nan_constant(tmp_path):
    expect(_raw_json(tmp_path, b'{"a":NaN}'), "json_syntax")


def test_deep_nesting(tmp_path):
    expect(_raw_json(tmp_path, b"[" * 100000 + b"]" * 100000), "json_syntax")


def test_root_not_object(tmp_path):
    expect(_raw_json(tmp_path, b"[]"), "json_type")


def test_trailing_whitespace_in_json_is_legal(tmp_path):
    root, payload = valid_directory()
    import json

    text = json.dumps(root).encode() + b"   \n\t "
    with Artifact(frame(tmp_path / "m.ninfer", text, payload), strict=True) as art:
        assert art.metadata["name"] == "tiny-test"


# -- root -------------------------------------------------------------------------------------------


def test_root_missing_member(make_artifact):
    expect(make_artifact(lambda r: r.pop("uses")), "missing_member")


def test_root_extra_member(make_artifact):
    expect(make_artifact(lambda r: r.update(version=3)), "extra_member")


def test_metadata_not_object(make_artifact):
    expect(make_artifact(lambda r: r.update(metadata=[])), "json_type")


def test_metadata_name_not_id(make_artifact):
    expect(make_artifact(lambda r: r["metadata"].update(name="")), "id")


def test_provenance_not_object(make_artifact):
    expect(make_artifact(lambda r: r.update(provenance="x")), "json_type")


# -- files --------------------------------------------------------------------------------------------


def test_files_empty(make_artifact):
    expect(make_artifact(lambda r: r.update(files=[])), "files")


def test_files_first_path_not_null(make_artifact):
    expect(make_artifact(lambda r: r["files"][0].update(path="m.ninfer")), "file_path")


def _two_files(root: dict, path: str) -> None:
    total = root["files"][0]["payload_bytes"]
    root["files"] = [{"path": None, "payload_bytes": 4096}, {"path": path, "payload_bytes": total - 4096}]


@pytest.mark.parametrize("bad", ["a/b", "a\\b", ".", "..", "", "m.ninfer"])
def test_part_path_rules(tmp_path, bad):
    root, payload = valid_directory()
    _two_files(root, bad)
    # frame() cannot create such names; the JSON check must fire before any part is opened.
    import json

    text = json.dumps(root).encode()
    path = tmp_path / "m.ninfer"
    start = -(-(32 + len(text)) // 4096) * 4096
    with open(path, "wb") as f:
        f.write(struct.pack("<8sQ16s", b"NINFER\x00\x03", len(text), ARTIFACT_ID) + text)
        f.write(b"\x00" * (start - 32 - len(text)) + payload[:4096])
    expect(path, "file_path")


def test_duplicate_part_paths(make_artifact):
    def mutate(root):
        total = root["files"][0]["payload_bytes"]
        root["files"] = [
            {"path": None, "payload_bytes": 2048},
            {"path": "p", "payload_bytes": 1024},
            {"path": "p", "payload_bytes": total - 3072},
        ]

    expect(make_artifact(mutate), "file_path")


@pytest.mark.parametrize("value", [0, 1.0, True, -5, "10", None])
def test_payload_bytes_domain(make_artifact, value):
    expect(make_artifact(lambda r: r["files"][0].update(payload_bytes=value)), "u64")


def test_file_extra_member(make_artifact):
    expect(make_artifact(lambda r: r["files"][0].update(sha256="00")), "extra_member")


def test_file_payload_sum_overflow(make_artifact):
    def mutate(root):
        root["files"] = [{"path": None, "payload_bytes": 2**64 - 1}, {"path": "p1", "payload_bytes": 1}]

    expect(make_artifact(mutate), "u64")


# -- parts ---------------------------------------------------------------------------------------------


def _sharded(make_artifact, name="m.ninfer"):
    def mutate(root):
        total = root["files"][0]["payload_bytes"]
        root["files"] = [
            {"path": None, "payload_bytes": 300},
            {"path": f"{name}.part-0001", "payload_bytes": total - 300},
        ]

    return make_artifact(mutate, name=name)


def test_sharded_fixture_reads(make_artifact):
    with Artifact(_sharded(make_artifact), strict=True) as art:
        assert art.parameter("text/output_head").shape == (6, 4)


def test_missing_part_fails_only_reads_that_need_it(make_artifact):
    path = _sharded(make_artifact)
    (path.parent / "m.ninfer.part-0001").unlink()
    with Artifact(path, strict=True) as art:
        assert art.resource("text", "generation_config.json") == b'{"eos_token_id": 1}'
        with pytest.raises(ArtifactError) as info:
            art.parameter("text/output_head")
        assert info.value.rule == "part_missing"


def _patch_part(path: Path, offset: int, data: bytes) -> None:
    part = path.parent / (path.name + ".part-0001")
    raw = bytearray(part.read_bytes())
    raw[offset : offset + len(data)] = data
    part.write_bytes(bytes(raw))


def test_part_bad_magic(make_artifact):
    path = _sharded(make_artifact)
    _patch_part(path, 0, b"NINFER")
    expect(path, "part_magic")


def test_part_wrong_index(make_artifact):
    path = _sharded(make_artifact)
    _patch_part(path, 8, struct.pack("<Q", 2))
    expect(path, "part_index")


def test_part_foreign_artifact_id(make_artifact):
    path = _sharded(make_artifact)
    _patch_part(path, 16, b"\xee" * 16)
    expect(path, "artifact_id")


def test_part_wrong_size(make_artifact):
    path = _sharded(make_artifact)
    with open(path.parent / "m.ninfer.part-0001", "ab") as f:
        f.write(b"\x00")
    expect(path, "file_size")


# -- objects ---------------------------------------------------------------------------------------------


def test_objects_empty(make_artifact):
    def mutate(root):
        root["objects"] = []
        root["bindings"] = {}
        root["uses"] = []
        root["components"]["text"].pop("resources")

    expect(make_artifact(mutate), "objects")


def test_tensor_extra_member(make_artifact):
    expect(make_artifact(lambda r: r["objects"][1].update(divisors=2)), "extra_member", "w.fused")


def test_tensor_missing_member(make_artifact):
    expect(make_artifact(lambda r: r["objects"][1].pop("layout")), "missing_member", "w.fused")


def test_resource_extra_member(make_artifact):
    expect(make_artifact(lambda r: r["objects"][0].update(shape=[1])), "extra_member", "r.generation_config")


def test_unknown_kind(make_artifact):
    expect(make_artifact(lambda r: r["objects"][1].update(kind="blob")), "object_kind", "w.fused")


@pytest.mark.parametrize("bad", ["", "a\x00b", 7, None])
def test_object_id_domain(make_artifact, bad):
    expect(make_artifact(lambda r: r["objects"][1].update(id=bad)), "id")


def test_lone_surrogate_id(tmp_path):
    root, payload = valid_directory()
    import json

    text = json.dumps(root).replace('"w.head"', '"w.\\ud800"', 1).encode()
    expect(frame(tmp_path / "m.ninfer", text, payload), "id")


@pytest.mark.parametrize(
    "shape,rule",
    [([0, 4], "u64"), ([8, -4], "u64"), ([8.0, 4], "u64"), ("8x4", "shape"), ([1] * 17, "shape"), ([2**40, 2**40], "shape")],
)
def test_shape_domain(make_artifact, shape, rule):
    expect(make_artifact(lambda r: r["objects"][1].update(shape=shape)), rule, "w.fused")


def test_overlapping_objects(make_artifact):
    expect(make_artifact(lambda r: r["objects"][2].update(offset=r["objects"][1]["offset"] + 4)), "object_order", "w.head")


def test_out_of_order_objects(make_artifact):
    def mutate(root):
        root["objects"][1], root["objects"][2] = root["objects"][2], root["objects"][1]

    expect(make_artifact(mutate), "object_order")


def test_object_out_of_bounds(make_artifact):
    def mutate(root):
        last = root["objects"][-1]
        last["offset"] = root["files"][0]["payload_bytes"] - 2

    expect(make_artifact(mutate), "object_bounds", "w.scalar")


def test_offset_plus_bytes_overflow(make_artifact):
    expect(make_artifact(lambda r: r["objects"][-1].update(offset=2**64 - 2)), "u64", "w.scalar")


def test_duplicate_object_id(make_artifact):
    expect(make_artifact(lambda r: r["objects"][2].update(id="w.fused")), "duplicate_id", "w.fused")


# -- per-object encoding (lazy; strict mode checks eagerly) ---------------------------------------------


def test_unknown_format(make_artifact):
    expect(make_artifact(lambda r: r["objects"][1].update(format="nf4")), "unknown_format", "w.fused")


def test_unknown_layout(make_artifact):
    expect(make_artifact(lambda r: r["objects"][1].update(layout="row_group_v1")), "unknown_layout", "w.fused")


def test_format_not_accepted_by_layout(make_artifact):
    expect(make_artifact(lambda r: r["objects"][1].update(format="q4_g64_fp16")), "format_layout", "w.fused")


def test_layout_shape_rule(make_artifact):
    def mutate(root):
        root["objects"][1].update(format="nvfp4", layout="block_scale_k16_m128x4_v1")

    expect(make_artifact(mutate), "layout_shape", "w.fused")


def test_wrong_bytes(make_artifact):
    expect(make_artifact(lambda r: r["objects"][1].update(bytes=r["objects"][1]["bytes"] - 4)), "encoded_size", "w.fused")


def test_misaligned_tensor(make_artifact):
    # move w.head by 4 bytes into the alignment gap before it (still ordered and in bounds)
    def mutate(root):
        head = root["objects"][2]
        head["offset"] -= 4

    expect(make_artifact(mutate), "alignment", "w.head")


def test_unknown_resource_encoding(make_artifact):
    expect(make_artifact(lambda r: r["objects"][0].update(encoding="gzip_v1")), "unknown_encoding", "r.generation_config")


def test_encoding_checks_are_lazy(make_artifact):
    path = make_artifact(lambda r: r["objects"][2].update(format="nf4"))
    with Artifact(path) as art:  # not strict: opens fine
        art.parameter("text/layers/0/attention/query")
        with pytest.raises(ArtifactError) as info:
            art.parameter("text/output_head")
        assert info.value.rule == "unknown_format" and info.value.obj == "w.head"


# -- components -------------------------------------------------------------------------------------------


def test_missing_text_component(make_artifact):
    def mutate(root):
        root["components"] = {"mtp": {"config": {}}}

    expect(make_artifact(mutate), "components")


def test_component_extra_member(make_artifact):
    expect(make_artifact(lambda r: r["components"]["mtp"].update(enabled=True)), "extra_member")


def test_component_config_not_object(make_artifact):
    expect(make_artifact(lambda r: r["components"]["mtp"].update(config=[])), "json_type")


def test_component_unknown_target(make_artifact):
    expect(make_artifact(lambda r: r["components"]["mtp"].update(target="vision")), "component_target")


def test_component_resource_is_tensor(make_artifact):
    expect(make_artifact(lambda r: r["components"]["text"]["resources"].update(x="w.head")), "component_resource", "w.head")


def test_component_resource_missing(make_artifact):
    expect(make_artifact(lambda r: r["components"]["text"]["resources"].update(x="nope")), "component_resource", "nope")


def test_proposal_only_on_text(make_artifact):
    expect(make_artifact(lambda r: r["components"]["mtp"].update(proposal={"domain": "full"})), "proposal")


@pytest.mark.parametrize(
    "proposal,rule",
    [
        ({"domain": "full", "rows": 6}, "extra_member"),
        ({"domain": "indexed"}, "missing_member"),
        ({"domain": "indexed", "rows": 0}, "u64"),
        ({"domain": "sparse"}, "proposal"),
    ],
)
def test_proposal_rules(make_artifact, proposal, rule):
    expect(make_artifact(lambda r: r["components"]["text"].update(proposal=proposal)), rule)


# -- bindings ---------------------------------------------------------------------------------------------


def test_binding_unknown_object(make_artifact):
    expect(make_artifact(lambda r: r["bindings"].update(x={"object": "w.nope"})), "binding_object", "w.nope")


def test_binding_references_resource(make_artifact):
    expect(make_artifact(lambda r: r["bindings"].update(x={"object": "r.generation_config"})), "binding_object")


@pytest.mark.parametrize("rng", [[4, 4], [0, 33], [5, 2], [1], [0, 1.0], [-1, 3]])
def test_binding_range_rules(make_artifact, rng):
    rule = "u64" if rng in ([0, 1.0], [-1, 3]) else "binding_range"
    expect(make_artifact(lambda r: r["bindings"].update(x={"parts": [{"object": "w.fused", "range": rng}]})), rule)


def test_binding_both_forms(make_artifact):
    expect(make_artifact(lambda r: r["bindings"].update(x={"object": "w.head", "parts": []})), "binding")


def test_binding_empty_parts(make_artifact):
    expect(make_artifact(lambda r: r["bindings"].update(x={"parts": []})), "binding")


def test_binding_part_extra_member(make_artifact):
    part = {"object": "w.fused", "range": [0, 4], "stride": 1}
    expect(make_artifact(lambda r: r["bindings"].update(x={"parts": [part]})), "extra_member")


def test_binding_name_not_id(make_artifact):
    expect(make_artifact(lambda r: r["bindings"].update({"": {"object": "w.head"}})), "id")


# -- uses --------------------------------------------------------------------------------------------------


def test_use_unknown_parameter(make_artifact):
    expect(make_artifact(lambda r: r["uses"].append({"parameter": "nope", "input": "x"})), "use_parameter")


def test_use_duplicate_pair(make_artifact):
    expect(make_artifact(lambda r: r["uses"].append(dict(r["uses"][0]))), "use_duplicate")


def test_use_bad_policy(make_artifact):
    expect(make_artifact(lambda r: r["uses"][0].update(activation_policy="A4Only")), "use_policy")


def test_use_extra_member(make_artifact):
    expect(make_artifact(lambda r: r["uses"][0].update(precision="a16")), "extra_member")


def test_use_bad_auxiliary(make_artifact):
    expect(make_artifact(lambda r: r["uses"][1]["auxiliaries"].update(x={"object": "nope"})), "binding_object", "nope")


def test_uses_not_array(make_artifact):
    expect(make_artifact(lambda r: r.update(uses={})), "uses")


def test_error_names_file(make_artifact):
    err = expect(make_artifact(lambda r: r.update(version=3)), "extra_member")
    assert "m.ninfer" in str(err)
