"""v2 -> v3 upgrade on a tiny synthetic identity laid out like the upstream files (spec 6)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from click.testing import CliRunner

from ninfer_cli.main import cli
from ninfer_runtime.artifact import Artifact, ArtifactError, codecs
from ninfer_runtime.artifact.quantize import quantize_grouped
from ninfer_runtime.artifact.upgrade import IDENTITIES, Identity, upgrade, use_inputs

H, Q, K, NV, KG, VG, INTER, V = 8, 16, 8, 2, 4, 4, 12, 10
DIMS = {"h": H, "q": Q, "k": K, "nv": NV, "kg": KG, "vg": VG, "inter": INTER, "vision_width": 4, "draft_q": 4, "draft_k": 2}
TINY = Identity("tiny-27b", "groupwise-int", (30,), DIMS, {"architectures": ["Qwen3_5ForCausalLM"], "hidden_size": H},
                {"model_type": "qwen3_5_vision"}, "Qwen3_5MTP", binding_counts={"base": 37})
REGISTRY = {("tiny-27b", "groupwise-int"): TINY}
V2_FMT = {"bf16": "BF16", "fp32": "FP32", "int32": "I32", "q4_g64_fp16": "Q4G64_F16S", "q5_g64_fp16": "Q5G64_F16S",
          "q8_g32_fp16": "W8G32_F16S"}


def _tensors(rng) -> list[tuple[str, str, tuple[int, ...], object]]:
    def bf(*shape):
        return rng.standard_normal(shape).astype(np.float32).astype(ml_dtypes.bfloat16)

    def q(fmt, *shape):
        return quantize_grouped(rng.standard_normal(shape).astype(np.float32), fmt)

    t = [
        ("text/token_embedding", "bf16", (V, H), bf(V, H)),
        ("text/output_head", "bf16", (V, H), bf(V, H)),
        ("text/final_norm", "bf16", (H,), bf(H)),
        ("text/draft_head", "bf16", (4, H), bf(4, H)),
        ("text/draft_head_token_ids", "int32", (4,), np.array([1, 3, 5, 7], np.int32)),
        # layer 0: gated delta net
        ("text/layers/0/input_norm", "bf16", (H,), bf(H)),
        ("text/layers/0/gdn/query_key_value_z", "q8_g32_fp16", (2 * KG + 2 * VG, H), q("q8_g32_fp16", 2 * KG + 2 * VG, H)),
        ("text/layers/0/gdn/a_b_projection", "bf16", (2 * NV, H), bf(2 * NV, H)),
        ("text/layers/0/gdn/a_log", "fp32", (NV,), rng.standard_normal(NV).astype(np.float32)),
        ("text/layers/0/gdn/output", "q5_g64_fp16", (H, VG), q("q5_g64_fp16", H, VG)),
        ("text/layers/0/mlp/gate_up", "q4_g64_fp16", (2 * INTER, H), q("q4_g64_fp16", 2 * INTER, H)),
        ("text/layers/0/mlp/down", "q5_g64_fp16", (H, INTER), q("q5_g64_fp16", H, INTER)),
        # layer 1: gated attention with an activation divisor
        ("text/layers/1/attention/query_key", "q4_g64_fp16", (Q + K, H), q("q4_g64_fp16", Q + K, H)),
        ("text/layers/1/attention/gate_value", "q5_g64_fp16", (Q + K, H), q("q5_g64_fp16", Q + K, H)),
        ("text/layers/1/attention/output", "q5_g64_fp16", (H, Q), q("q5_g64_fp16", H, Q)),
        ("text/layers/1/attention/input_projection/input_scale_divisor", "fp32", (), np.array(3.0, np.float32)),
        # mtp
        ("mtp/input_projection", "q8_g32_fp16", (H, 2 * H), q("q8_g32_fp16", H, 2 * H)),
        ("mtp/layer/attention/query_key_gate_value", "q8_g32_fp16", (2 * Q + 2 * K, H), q("q8_g32_fp16", 2 * Q + 2 * K, H)),
        ("mtp/layer/moe/shared_down", "bf16", (H, 4), bf(H, 4)),
        # vision
        ("vision/patch_embedding", "q8_g32_fp16", (4, 6), q("q8_g32_fp16", 4, 6)),
        ("vision/layers/0/attention/qkv", "q4_g64_fp16", (12, 4), q("q4_g64_fp16", 12, 4)),
        ("vision/layers/0/attention/qkv_bias", "bf16", (12,), bf(12)),
        ("vision/layers/0/norm1/weight", "bf16", (4,), bf(4)),
        ("vision/merger/norm/bias", "bf16", (4,), bf(4)),
    ]
    return t


RESOURCES = [("frontend/tokenizer.json", b'{"tok":1}'), ("frontend/tokenizer_config.json", b"{}"),
             ("frontend/chat_template.jinja", b"{{ old }}"), ("frontend/generation_config.json", b'{"eos_token_id":1}'),
             ("frontend/preprocessor_config.json", b'{"patch_size":16}'),
             ("frontend/video_preprocessor_config.json", b'{"patch_size":16}')]


def write_v2(path: Path, model_id: str = "tiny-27b", weights_id: str = "groupwise-int", mutate=None) -> dict:
    rng = np.random.default_rng(3)
    payload = bytearray()
    objects, values = [], {}
    for name, data in RESOURCES:
        objects.append({"name": name, "kind": "resource", "encoding": "raw-bytes-v1", "offset": len(payload), "bytes": len(data)})
        payload += data
    for name, fmt, shape, data in _tensors(rng):
        layout = "contiguous_le_v1" if fmt in ("bf16", "fp32", "int32") else "row_split_k128_v1"
        encoded = codecs.encode_tensor(fmt, layout, shape, data)
        payload += b"\x00" * (-len(payload) % 256)
        v2_layout = {"contiguous_le_v1": "contiguous-le-v1", "row_split_k128_v1": "row-split-k128-v1"}[layout]
        objects.append({"name": name, "kind": "tensor", "shape": list(shape), "format": V2_FMT[fmt], "layout": v2_layout,
                        "offset": len(payload), "bytes": len(encoded)})
        values[name] = encoded
        payload += encoded
    payload += b"\x00" * 100  # v2 files end with padding after the last object
    root = {"identity": {"model_id": model_id, "weights_id": weights_id}, "objects": objects}
    if mutate:
        mutate(root)
    text = json.dumps(root).encode()
    start = -(-(16 + len(text)) // 4096) * 4096
    path.write_bytes(struct.pack("<8sQ", b"NINFER\x00\x02", len(text)) + text + b"\x00" * (start - 16 - len(text)) + payload)
    return {"payload": bytes(payload), "objects": objects, "values": values}


def test_upgrade_tiny_identity(tmp_path):
    v2 = write_v2(tmp_path / "old.ninfer")
    out = upgrade(tmp_path / "old.ninfer", tmp_path / "new.ninfer", identities=REGISTRY)
    with Artifact(out, strict=True) as art:
        assert set(art.components) == {"text", "vision", "mtp"}
        assert art.components["mtp"].target == "text" and art.components["vision"].target == "text"
        assert art.components["text"].proposal == {"domain": "indexed", "rows": 131072}
        assert art.metadata == {"name": "tiny-27b"}
        assert art.provenance["upgraded_from"]["version"] == 2
        # payload bytes and offsets are copied unchanged
        for obj in v2["objects"]:
            got = art.directory.objects_by_id[obj["name"]]
            assert (got.offset, got.bytes) == (obj["offset"], obj["bytes"])
            if obj["name"] in v2["values"]:
                assert art.object_bytes(obj["name"]) == v2["values"][obj["name"]]
        assert art.object(art.components["text"].resources["chat_template.jinja"]).id == "frontend/chat_template.jinja"
        assert art.resource("vision", "preprocessor_config.json") == b'{"patch_size":16}'
        # fused parents split by rows
        parent = art.decode("text/layers/1/attention/query_key")
        np.testing.assert_array_equal(art.parameter("text/layers/1/attention/query", (Q, H)), parent[:Q])
        np.testing.assert_array_equal(art.parameter("text/layers/1/attention/key", (K, H)), parent[Q:])
        qkvz = art.decode("text/layers/0/gdn/query_key_value_z")
        np.testing.assert_array_equal(art.parameter("text/layers/0/gdn/z", (VG, H)), qkvz[2 * KG + VG :])
        np.testing.assert_array_equal(art.parameter("mtp/layers/0/attention/value", (K, H)),
                                      art.decode("mtp/layer/attention/query_key_gate_value")[2 * Q + K :])
        bias = art.decode("vision/layers/0/attention/qkv_bias")
        np.testing.assert_array_equal(art.parameter("vision/layers/0/attention/key_bias"), bias[4:8])
        for renamed in ("proposal/head", "proposal/token_ids", "mtp/layers/0/moe/shared/down",
                        "vision/layers/0/norm1_weight", "vision/merger/norm_bias"):
            assert renamed in art.bindings
        assert len(art.bindings) == 37  # 23 bound tensors, 7 fused parents split into 21
        uses = {(u.parameter, u.input): u for u in art.uses}
        q_use = uses[("text/layers/1/attention/query", "text/layers/1/mixer_input")]
        assert q_use.activation_policy == "A16Only"
        divisor = q_use.auxiliaries["activation_input_divisor"]
        assert divisor.parts[0].object == "text/layers/1/attention/input_projection/input_scale_divisor"
        assert ("text/output_head", "mtp/final_hidden") in uses
        assert ("text/layers/0/mlp/down", "text/layers/0/mlp/product") in uses
        assert ("text/layers/1/attention/output", "text/layers/1/attention/gated_output") in uses
        assert not any(u.parameter == "text/final_norm" for u in art.uses)


def test_upgrade_replaces_chat_template_last(tmp_path):
    v2 = write_v2(tmp_path / "old.ninfer")
    out = upgrade(tmp_path / "old.ninfer", tmp_path / "new.ninfer", identities=REGISTRY, chat_template=b"{{ new }}",
                  shard_limit=6 * 4096)
    with Artifact(out, strict=True) as art:
        last = art.objects[-1]
        assert last.id == "frontend/chat_template.jinja"
        assert last.offset == -(-len(v2["payload"]) // 256) * 256
        assert art.resource("text", "chat_template.jinja") == b"{{ new }}"
        assert art.payload_bytes == last.offset + last.bytes
        assert bytes(art.read(len(v2["payload"]), last.offset - len(v2["payload"]))) == b"\x00" * (last.offset - len(v2["payload"]))
        assert len(art.directory.files) > 1
        assert art.provenance["upgraded_from"]["chat_template"] == "replaced"


def test_upgrade_json_reserve_starts_at_4064(tmp_path):
    write_v2(tmp_path / "old.ninfer")
    out = upgrade(tmp_path / "old.ninfer", tmp_path / "new.ninfer", identities=REGISTRY)
    with Artifact(out) as art:
        assert (art.header.json_bytes + 32) % 4096 == 0 and art.header.json_bytes >= 4064


def test_unknown_identity_rejected(tmp_path):
    write_v2(tmp_path / "old.ninfer", model_id="mystery-70b")
    with pytest.raises(ArtifactError) as info:
        upgrade(tmp_path / "old.ninfer", tmp_path / "new.ninfer", identities=REGISTRY)
    assert info.value.rule == "v2_identity" and "mystery-70b" in str(info.value)
    assert not (tmp_path / "new.ninfer").exists()


def test_upstream_identities_reject_tiny_files(tmp_path):
    write_v2(tmp_path / "old.ninfer", model_id="qwen3.6-27b")
    with pytest.raises(ArtifactError) as info:
        upgrade(tmp_path / "old.ninfer", tmp_path / "new.ninfer")
    assert info.value.rule == "v2_identity" and "1124" in str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.ninfer"]


def test_registry_covers_upstream_identities():
    assert set(IDENTITIES) == {("qwen3.6-27b", "groupwise-int"), ("qwen3.6-27b", "nvfp4"), ("qwen3.8-27b", "groupwise-int"),
                               ("qwen3.8-27b", "nvfp4"), ("qwen3.6-35b-a3b", "groupwise-int")}
    cfg = IDENTITIES[("qwen3.6-27b", "nvfp4")].text_config
    assert cfg["rms_norm_eps"] == 9.999999974752427e-07 and cfg["rope_parameters"]["rope_theta"] == 10000000.0
    assert cfg["layer_types"][3] == "full_attention" and cfg["layer_types"][4] == "linear_attention"


def test_bad_v2_files(tmp_path):
    write_v2(tmp_path / "a.ninfer", mutate=lambda r: r["objects"][7].update(offset=r["objects"][7]["offset"] + 1))
    with pytest.raises(ArtifactError) as info:
        upgrade(tmp_path / "a.ninfer", tmp_path / "a3.ninfer", identities=REGISTRY)
    assert info.value.rule in ("alignment", "object_order")
    write_v2(tmp_path / "b.ninfer", mutate=lambda r: r["objects"][7].update(format="NF4"))
    with pytest.raises(ArtifactError) as info:
        upgrade(tmp_path / "b.ninfer", tmp_path / "b3.ninfer", identities=REGISTRY)
    assert info.value.rule == "unknown_format"
    write_v2(tmp_path / "c.ninfer", mutate=lambda r: r.update(extra=1))
    with pytest.raises(ArtifactError) as info:
        upgrade(tmp_path / "c.ninfer", tmp_path / "c3.ninfer", identities=REGISTRY)
    assert info.value.rule == "v2_root"


def test_non_positive_divisor_rejected(tmp_path):
    v2 = write_v2(tmp_path / "old.ninfer")
    raw = bytearray((tmp_path / "old.ninfer").read_bytes())
    obj = next(o for o in v2["objects"] if o["name"].endswith("input_scale_divisor"))
    payload_start = len(raw) - len(v2["payload"])
    raw[payload_start + obj["offset"] : payload_start + obj["offset"] + 4] = struct.pack("<f", -1.0)
    (tmp_path / "old.ninfer").write_bytes(bytes(raw))
    with pytest.raises(ArtifactError) as info:
        upgrade(tmp_path / "old.ninfer", tmp_path / "new.ninfer", identities=REGISTRY)
    assert info.value.rule == "v2_divisor"


def test_v3_input_is_refused(tmp_path):
    write_v2(tmp_path / "old.ninfer")
    out = upgrade(tmp_path / "old.ninfer", tmp_path / "new.ninfer", identities=REGISTRY)
    with pytest.raises(ArtifactError) as info:
        upgrade(out, tmp_path / "again.ninfer", identities=REGISTRY)
    assert info.value.rule == "already_v3"


def test_cli_upgrade_reports_unknown_identity(tmp_path):
    write_v2(tmp_path / "old.ninfer")
    result = CliRunner().invoke(cli, ["upgrade", str(tmp_path / "old.ninfer"), "-o", str(tmp_path / "new.ninfer")])
    assert result.exit_code == 2
    assert "unknown v2 identity tiny-27b/groupwise-int" in result.output


@pytest.mark.parametrize(
    "param,inputs",
    [
        ("text/layers/5/gdn/a_projection", ["text/layers/5/mixer_input"]),
        ("mtp/layers/0/moe/experts/17/down", ["mtp/layers/0/moe/experts/17/product"]),
        ("mtp/layers/0/moe/shared/up", ["mtp/layers/0/ffn_input"]),
        ("vision/layers/3/mlp/fc2", ["vision/layers/3/mlp_activation"]),
        ("dflash/layers/2/attention/context_key", ["dflash/context_input"]),
        ("dflash2/layers/0/mlp_conv/kernel_projection", ["dflash2/layers/0/mlp_conv_input"]),
        ("dflash2/candidate_selector/hidden_projection", ["dflash2/final_hidden"]),
        ("proposal/head", ["mtp/final_hidden"]),
        ("text/layers/0/gdn/convolution", []),
    ],
)
def test_use_inputs(param, inputs):
    assert use_inputs(param, ["mtp"]) == inputs
