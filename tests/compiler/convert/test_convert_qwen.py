"""Qwen3.5 Dense and MoE: HF checkpoint -> artifact, checked against the HF tensors themselves.

The expected value of every binding is derived here, independently of the converter, from the
Hugging Face tensors and the transforms the spec prescribes (per-head de-interleaving of q_proj,
row blocks of in_proj_qkv, tap-major convolutions, expert slices of the fused banks).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from ninfer_compiler.convert.driver import convert
from ninfer_compiler.convert.errors import ConversionError
from ninfer_compiler.convert.safetensors_reader import SafetensorsCheckpoint
from ninfer_compiler.testmodel.factory import cached_hf_model
from ninfer_runtime.artifact import Artifact
from ninfer_runtime.artifact.quantize import rounding_bound

from .test_convert_qwen4_glm import qwen_vision_expected

ARCHS = ("qwen3_5", "qwen3_5_moe")
RECIPES = ("bf16", "groupwise-int", "nvfp4")


def expected_bindings(hf_dir: Path) -> dict[str, np.ndarray]:
    """binding name -> float32 values, from the checkpoint and the spec's transforms."""
    ck = SafetensorsCheckpoint(hf_dir)
    t = {n: ck.load(n).astype(np.float32) for n in ck.names()}
    cfg = json.loads((hf_dir / "config.json").read_text())
    text = cfg["text_config"]
    out: dict[str, np.ndarray] = {}
    tp = "model.language_model."
    out["text/token_embedding"] = t[tp + "embed_tokens.weight"]
    out["text/output_head"] = t["lm_head.weight"]
    out["text/final_norm"] = t[tp + "norm.weight"]

    def layer(hp: str, p: str, kind: str) -> None:
        out[p + "input_norm"] = t[hp + "input_layernorm.weight"]
        out[p + "post_attention_norm"] = t[hp + "post_attention_layernorm.weight"]
        if kind == "full_attention":
            heads, d = text["num_attention_heads"], text["head_dim"]
            q = t[hp + "self_attn.q_proj.weight"].reshape(heads, 2, d, -1)
            out[p + "attention/query"] = q[:, 0].reshape(heads * d, -1)
            out[p + "attention/gate"] = q[:, 1].reshape(heads * d, -1)
            for ours, theirs in (("key", "k_proj"), ("value", "v_proj"), ("output", "o_proj"),
                                 ("query_norm", "q_norm"), ("key_norm", "k_norm")):
                out[p + "attention/" + ours] = t[f"{hp}self_attn.{theirs}.weight"]
        else:
            kd = text["linear_num_key_heads"] * text["linear_key_head_dim"]
            qkv = t[hp + "linear_attn.in_proj_qkv.weight"]
            out[p + "gdn/query"], out[p + "gdn/key"], out[p + "gdn/value"] = qkv[:kd], qkv[kd : 2 * kd], qkv[2 * kd :]
            for ours, theirs in (("z", "in_proj_z.weight"), ("a_projection", "in_proj_a.weight"),
                                 ("b_projection", "in_proj_b.weight"), ("a_log", "A_log"), ("dt_bias", "dt_bias"),
                                 ("norm", "norm.weight"), ("output", "out_proj.weight")):
                out[p + "gdn/" + ours] = t[hp + "linear_attn." + theirs]
            conv = t[hp + "linear_attn.conv1d.weight"]
            out[p + "gdn/convolution"] = conv[:, 0, :].T
        if hp + "mlp.gate_proj.weight" in t:
            for w in ("gate", "up", "down"):
                out[f"{p}mlp/{w}"] = t[f"{hp}mlp.{w}_proj.weight"]
        else:
            out[p + "moe/router"] = t[hp + "mlp.gate.weight"]
            out[p + "moe/shared_score"] = t[hp + "mlp.shared_expert_gate.weight"]
            gate_up, down = t[hp + "mlp.experts.gate_up_proj"], t[hp + "mlp.experts.down_proj"]
            inter = gate_up.shape[1] // 2
            for e in range(gate_up.shape[0]):
                out[f"{p}moe/experts/{e}/gate"] = gate_up[e, :inter]
                out[f"{p}moe/experts/{e}/up"] = gate_up[e, inter:]
                out[f"{p}moe/experts/{e}/down"] = down[e]
            for w in ("gate", "up", "down"):
                out[f"{p}moe/shared/{w}"] = t[f"{hp}mlp.shared_expert.{w}_proj.weight"]

    for i, kind in enumerate(text["layer_types"]):
        layer(f"{tp}layers.{i}.", f"text/layers/{i}/", kind)
    if "mtp.fc.weight" in t:
        out["mtp/input_projection"] = t["mtp.fc.weight"]
        out["mtp/embedding_norm"] = t["mtp.pre_fc_norm_embedding.weight"]
        out["mtp/hidden_norm"] = t["mtp.pre_fc_norm_hidden.weight"]
        out["mtp/final_norm"] = t["mtp.norm.weight"]
        layer("mtp.layers.0.", "mtp/layers/0/", "full_attention")
    qwen_vision_expected(t, cfg["vision_config"], out)
    ck.close()
    return out


@pytest.fixture(scope="module", params=ARCHS)
def hf_model(request) -> tuple[str, Path, dict[str, np.ndarray]]:
    path = cached_hf_model(request.param)
    return request.param, path, expected_bindings(path)


def _object_expectations(art: Artifact, expected: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Each stored object's expected values, assembled from the bindings that cover it."""
    flat: dict[str, np.ndarray] = {}
    covered: dict[str, np.ndarray] = {}
    for name, binding in art.bindings.items():
        values = expected[name].reshape(-1)
        pos = 0
        for part in binding.parts:
            obj = art.tensor_object(part.object)
            buf = flat.setdefault(obj.id, np.zeros(obj.elements, np.float32))
            mask = covered.setdefault(obj.id, np.zeros(obj.elements, bool))
            buf[part.begin : part.end] = values[pos : pos + part.elements]
            mask[part.begin : part.end] = True
            pos += part.elements
    for oid, mask in covered.items():
        assert mask.all(), f"object {oid} has elements no binding covers"
    return {oid: buf.reshape(art.tensor_object(oid).shape) for oid, buf in flat.items()}


@pytest.mark.parametrize("recipe", RECIPES)
def test_convert_binds_every_parameter(hf_model, recipe, tmp_path):
    arch, path, expected = hf_model
    report = convert(path, tmp_path / "m.ninfer", recipe)
    with Artifact(tmp_path / "m.ninfer", strict=True) as art:
        assert set(art.bindings) == set(expected)
        assert set(art.components) == {"text", "vision", "mtp"}
        assert art.components["mtp"].target == "text"
        objects = _object_expectations(art, expected)
        for oid, want in objects.items():
            obj = art.tensor_object(oid)
            got = art.decode(oid)
            if obj.format == "bf16":
                np.testing.assert_array_equal(got, want.astype(ml_dtypes.bfloat16).astype(np.float32), err_msg=oid)
            elif obj.format == "fp32":
                np.testing.assert_array_equal(got, want, err_msg=oid)
            else:
                bound = rounding_bound(obj.format, want)
                assert np.all(np.abs(got - want) <= bound), f"{oid} ({obj.format}) exceeds its rounding bound"
        assert report.bindings == len(expected)
        assert art.tensor_object(art.binding("text/layers/0/gdn/a_log").parts[0].object).format == "fp32"


def test_bf16_weights_are_bit_exact(hf_model, tmp_path):
    """With bf16 sources (as real checkpoints are), the bf16 recipe reproduces every word."""
    arch, path, _ = hf_model
    ck = SafetensorsCheckpoint(path)
    bf16_dir = tmp_path / "hf-bf16"
    shutil.copytree(path, bf16_dir)
    tensors = {}
    for name in ck.names():
        value = ck.load(name)
        tensors[name] = value.astype(ml_dtypes.bfloat16) if value.dtype == np.float32 else value
    ck.close()
    for f in bf16_dir.glob("*.safetensors"):
        f.unlink()
    (bf16_dir / "model.safetensors.index.json").unlink(missing_ok=True)
    _save_numpy_safetensors(bf16_dir / "model.safetensors", tensors)
    expected = expected_bindings(bf16_dir)
    convert(bf16_dir, tmp_path / "m.ninfer", "bf16")
    with Artifact(tmp_path / "m.ninfer", strict=True) as art:
        for name, want in expected.items():
            got = art.parameter(name, want.shape)
            assert got.tobytes() == want.astype(np.float32).tobytes(), name


def _save_numpy_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    codes = {np.dtype(ml_dtypes.bfloat16): "BF16", np.dtype("float32"): "F32", np.dtype("int64"): "I64", np.dtype("int32"): "I32"}
    header, blobs, pos = {}, [], 0
    for name, value in tensors.items():
        data = np.ascontiguousarray(value).tobytes()
        header[name] = {"dtype": codes[value.dtype], "shape": list(value.shape), "data_offsets": [pos, pos + len(data)]}
        blobs.append(data)
        pos += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text + b"".join(blobs))


def test_groupwise_dense_packing(tmp_path):
    """Dense groupwise stores attention as Q4 [query; key] + Q5 [gate; value] (the official packing)."""
    convert(cached_hf_model("qwen3_5"), tmp_path / "m.ninfer", "groupwise-int")
    with Artifact(tmp_path / "m.ninfer", strict=True) as art:
        q = art.binding("text/layers/3/attention/query").parts[0]
        g = art.binding("text/layers/3/attention/gate").parts[0]
        assert art.tensor_object(q.object).format == "q4_g64_fp16"
        assert art.tensor_object(g.object).format == "q5_g64_fp16"
        assert art.tensor_object(art.binding("text/token_embedding").parts[0].object).format == "q6_g64_fp16"
        assert art.tensor_object(art.binding("mtp/layers/0/attention/query").parts[0].object).format == "q8_g32_fp16"
        uses = {(u.parameter, u.input) for u in art.uses}
        assert ("text/layers/3/attention/query", "text/layers/3/mixer_input") in uses
        assert ("text/output_head", "mtp/final_hidden") in uses
        assert ("mtp/input_projection", "mtp/stem_input") in uses
        assert all(u.activation_policy == "A16Only" for u in art.uses)


def test_tokenizer_and_template_resources(tmp_path):
    path = cached_hf_model("qwen3_5")
    convert(path, tmp_path / "m.ninfer", "bf16")
    with Artifact(tmp_path / "m.ninfer") as art:
        for role in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
            assert art.resource("text", role) == (path / role).read_bytes()
        assert art.resource("vision", "preprocessor_config.json") == (path / "preprocessor_config.json").read_bytes()


# -- malformed input --------------------------------------------------------------------------------------


def _copy(tmp_path: Path) -> Path:
    dst = tmp_path / "hf"
    shutil.copytree(cached_hf_model("qwen3_5"), dst)
    return dst


def _rewrite(hf: Path, edit) -> None:
    ck = SafetensorsCheckpoint(hf)
    tensors = {n: ck.load(n) for n in ck.names()}
    ck.close()
    edit(tensors)
    for f in hf.glob("*.safetensors"):
        f.unlink()
    _save_numpy_safetensors(hf / "model.safetensors", tensors)


def _assert_fails(hf: Path, tmp_path: Path, pattern: str) -> None:
    out = tmp_path / "out" / "m.ninfer"
    out.parent.mkdir()
    with pytest.raises(ConversionError, match=pattern):
        convert(hf, out, "groupwise-int")
    assert list(out.parent.iterdir()) == []  # no partial artifact, no temporary files


def test_missing_tensor(tmp_path):
    hf = _copy(tmp_path)
    _rewrite(hf, lambda t: t.pop("model.language_model.layers.3.self_attn.k_proj.weight"))
    _assert_fails(hf, tmp_path, re.escape("missing tensor 'model.language_model.layers.3.self_attn.k_proj.weight'"))


def test_unbound_extra_tensor(tmp_path):
    hf = _copy(tmp_path)
    _rewrite(hf, lambda t: t.update({"model.language_model.layers.0.mystery.weight": np.zeros(4, np.float32)}))
    _assert_fails(hf, tmp_path, "not bound by the qwen3_5 converter: model.language_model.layers.0.mystery.weight")


def test_wrong_shape(tmp_path):
    hf = _copy(tmp_path)
    key = "model.language_model.layers.3.self_attn.q_proj.weight"
    _rewrite(hf, lambda t: t.update({key: t[key][:-4]}))
    _assert_fails(hf, tmp_path, re.escape(key))


def test_wrong_shape_in_plain_tensor(tmp_path):
    hf = _copy(tmp_path)
    key = "model.language_model.layers.0.mlp.up_proj.weight"
    _rewrite(hf, lambda t: t.update({key: t[key][:, :-1]}))
    _assert_fails(hf, tmp_path, "differ in row width|shape")


def test_unknown_model_type(tmp_path):
    hf = _copy(tmp_path)
    cfg = json.loads((hf / "config.json").read_text())
    cfg["model_type"] = "llama9"
    (hf / "config.json").write_text(json.dumps(cfg))
    _assert_fails(hf, tmp_path, "unknown model_type 'llama9'")


def test_missing_tokenizer(tmp_path):
    hf = _copy(tmp_path)
    (hf / "tokenizer.json").unlink()
    _assert_fails(hf, tmp_path, "missing tokenizer.json")


def test_processor_mismatch(tmp_path):
    hf = _copy(tmp_path)
    proc = json.loads((hf / "preprocessor_config.json").read_text())
    proc["patch_size"] = 99
    (hf / "preprocessor_config.json").write_text(json.dumps(proc))
    _assert_fails(hf, tmp_path, "patch_size is 99")


def test_existing_output_is_not_overwritten(tmp_path):
    out = tmp_path / "m.ninfer"
    out.write_bytes(b"keep")
    with pytest.raises(ConversionError, match="already exists"):
        convert(cached_hf_model("qwen3_5"), out, "bf16")
    assert out.read_bytes() == b"keep"
