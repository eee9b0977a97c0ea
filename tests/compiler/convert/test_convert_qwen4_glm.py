"""Qwen4Exp and GLM5Next: HF checkpoint -> artifact, checked against the HF tensors themselves.

The expected value of every binding is derived here from the Hugging Face tensors and the
transforms the converters document (q_proj de-interleaving, row blocks of fused projections,
tap-major convolutions, the conv3d/conv2d reshapes of the vision towers, int64 multipliers as
int32 word pairs), independently of the converter code.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from ninfer_compiler.convert.driver import convert, make_plan
from ninfer_compiler.convert.errors import ConversionError
from ninfer_compiler.convert.hf_dir import load_hf_dir
from ninfer_compiler.convert.safetensors_reader import SafetensorsCheckpoint
from ninfer_compiler.testmodel.factory import cached_hf_model
from ninfer_runtime.artifact import Artifact
from ninfer_runtime.artifact.quantize import rounding_bound

ARCHS = ("qwen4_exp", "glm5_next")
RECIPES = ("bf16", "groupwise-int", "nvfp4")
TP = "model.language_model."


# -- expected bindings -------------------------------------------------------------------------------


def _load(hf_dir: Path) -> tuple[dict[str, np.ndarray], dict]:
    ck = SafetensorsCheckpoint(hf_dir)
    tensors = {n: ck.load(n) for n in ck.names()}
    ck.close()
    t = {n: v if np.issubdtype(v.dtype, np.integer) else v.astype(np.float32) for n, v in tensors.items()}
    return t, json.loads((hf_dir / "config.json").read_text())


def _int64_words(values: np.ndarray) -> np.ndarray:
    """(low, high) two's-complement 32-bit words of each int64, as int32."""
    out = []
    for m in (int(v) for v in values):
        low = ((m & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000
        out.append([low, m >> 32])
    return np.array(out, dtype=np.int64)


def qwen_vision_expected(t: dict, vcfg: dict, out: dict) -> None:
    """Expected vision bindings of a Qwen-family checkpoint (shared by the Qwen3.5 and Qwen4Exp tests)."""
    v, width = "model.visual.", vcfg["hidden_size"]
    out["vision/patch_embedding"] = t[v + "patch_embed.proj.weight"].reshape(width, -1)
    out["vision/patch_embedding_bias"] = t[v + "patch_embed.proj.bias"]
    out["vision/position_embedding"] = t[v + "pos_embed.weight"]
    for b in range(vcfg["depth"]):
        hp, p = f"{v}blocks.{b}.", f"vision/layers/{b}/"
        for n in ("norm1", "norm2"):
            out[f"{p}{n}_weight"], out[f"{p}{n}_bias"] = t[f"{hp}{n}.weight"], t[f"{hp}{n}.bias"]
        for i, n in enumerate(("query", "key", "value")):
            out[f"{p}attention/{n}"] = t[hp + "attn.qkv.weight"][i * width:(i + 1) * width]
            out[f"{p}attention/{n}_bias"] = t[hp + "attn.qkv.bias"][i * width:(i + 1) * width]
        out[p + "attention/output"], out[p + "attention/output_bias"] = t[hp + "attn.proj.weight"], t[hp + "attn.proj.bias"]
        for n in ("fc1", "fc2"):
            out[f"{p}mlp/{n}"], out[f"{p}mlp/{n}_bias"] = t[f"{hp}mlp.linear_{n}.weight"], t[f"{hp}mlp.linear_{n}.bias"]
    mg = v + "merger."
    out["vision/merger/norm_weight"], out["vision/merger/norm_bias"] = t[mg + "norm.weight"], t[mg + "norm.bias"]
    for n in ("fc1", "fc2"):
        out[f"vision/merger/{n}"], out[f"vision/merger/{n}_bias"] = t[f"{mg}linear_{n}.weight"], t[f"{mg}linear_{n}.bias"]


def expected_qwen4(hf_dir: Path) -> dict[str, np.ndarray]:
    t, cfg = _load(hf_dir)
    text = cfg["text_config"]
    out: dict[str, np.ndarray] = {"text/token_embedding": t[TP + "embed_tokens.weight"], "text/output_head": t["lm_head.weight"]}

    def hc(hf: str, p: str, inject: bool) -> None:
        out[p + "norm"] = t[hf + "hc_norm.weight"]
        out[p + "input_mix/down"] = t[hf + "input_mix_weight_down.weight"]
        out[p + "input_mix/up"] = t[hf + "input_mix_weight_up.weight"]
        if inject:
            out[p + "block_inject"] = t[hf + "block_inject_weight.weight"]

    def layer(hp: str, p: str, kind: str) -> None:
        hc(hp + "attn_hyper_connection.", p + "attention/hyper_connection/", True)
        hc(hp + "mlp_hyper_connection.", p + "mlp/hyper_connection/", True)
        if kind == "linear_attention":
            kd = text["linear_num_key_heads"] * text["linear_key_head_dim"]
            qkv = t[hp + "linear_attn.in_proj_qkv.weight"]
            out[p + "gdn/query"], out[p + "gdn/key"], out[p + "gdn/value"] = qkv[:kd], qkv[kd:2 * kd], qkv[2 * kd:]
            for ours, theirs in (("z", "in_proj_z.weight"), ("a_projection", "in_proj_a.weight"),
                                 ("b_projection", "in_proj_b.weight"), ("a_log", "A_log"), ("dt_bias", "dt_bias"),
                                 ("norm", "norm.weight"), ("output", "out_proj.weight")):
                out[p + "gdn/" + ours] = t[hp + "linear_attn." + theirs]
            out[p + "gdn/convolution"] = t[hp + "linear_attn.conv1d.weight"][:, 0, :].T
        else:
            heads, d = text["num_attention_heads"], text["head_dim"]
            q = t[hp + "self_attn.q_proj.weight"].reshape(heads, 2, d, -1)
            out[p + "attention/query"] = q[:, 0].reshape(heads * d, -1)
            out[p + "attention/gate"] = q[:, 1].reshape(heads * d, -1)
            for ours, theirs in (("key", "k_proj"), ("value", "v_proj"), ("output", "o_proj"),
                                 ("query_norm", "q_norm"), ("key_norm", "k_norm")):
                out[p + "attention/" + ours] = t[f"{hp}self_attn.{theirs}.weight"]
            ix = hp + "self_attn.indexer."
            out[p + "attention/indexer/query_key"] = t[ix + "index_qk_proj.weight"]
            out[p + "attention/indexer/query_norm"] = t[ix + "q_layernorm.weight"]
            out[p + "attention/indexer/key_norm"] = t[ix + "k_layernorm.weight"]
        m = hp + "mlp."
        out[p + "moe/router"], out[p + "moe/shared_score"] = t[m + "gate.weight"], t[m + "shared_expert_gate.weight"]
        gate_up, down = t[m + "experts.gate_up_proj"], t[m + "experts.down_proj"]
        inter = gate_up.shape[1] // 2
        for e in range(gate_up.shape[0]):
            out[f"{p}moe/experts/{e}/gate"], out[f"{p}moe/experts/{e}/up"] = gate_up[e, :inter], gate_up[e, inter:]
            out[f"{p}moe/experts/{e}/down"] = down[e]
        for w in ("gate", "up", "down"):
            out[f"{p}moe/shared/{w}"] = t[f"{m}shared_expert.{w}_proj.weight"]
        if hp + "ple.key_proj.weight" in t:
            e = hp + "ple.ple_embedding."
            for ours, theirs in (("key_projection", "key_proj"), ("value_projection", "value_proj"),
                                 ("query_norm", "norm_query"), ("key_norm", "norm_key"), ("conv_norm", "norm_conv")):
                out[f"{p}ple/{ours}"] = t[f"{hp}ple.{theirs}.weight"]
            out[p + "ple/convolution"] = t[hp + "ple.conv1d.weight"][:, 0, :].T
            shards = sorted((n for n in t if n.startswith(e + "ngram_embedding.shard_")),
                            key=lambda n: int(n.split("shard_")[1].split(".")[0]))
            out[p + "ple/embedding/table"] = np.concatenate([t[n] for n in shards], axis=0)
            out[p + "ple/embedding/ngram_head_offsets"] = t[e + "ngram_heads_offsets"]
            out[p + "ple/embedding/ngram_head_vocab_sizes"] = t[e + "ngram_heads_vocab_sizes"]
            out[p + "ple/embedding/layer_multipliers"] = _int64_words(t[e + "layer_multipliers"])

    hc(TP + "hyper_connection_mixer.", "text/hyper_connection/", False)
    for i, kind in enumerate(text["layer_types"]):
        layer(f"{TP}layers.{i}.", f"text/layers/{i}/", kind)
    if "mtp.fc_embedding.weight" in t:
        out["mtp/embedding_projection"], out["mtp/hidden_projection"] = t["mtp.fc_embedding.weight"], t["mtp.fc_hidden.weight"]
        out["mtp/embedding_norm"] = t["mtp.pre_fc_norm_embedding.weight"]
        out["mtp/hidden_norm"] = t["mtp.pre_fc_norm_hidden.weight"]
        hc("mtp.hyper_connection_mixer.", "mtp/hyper_connection/", False)
        layer("mtp.layers.0.", "mtp/layers/0/", "indexed_attention")
    qwen_vision_expected(t, cfg["vision_config"], out)
    return out


def expected_glm(hf_dir: Path) -> dict[str, np.ndarray]:
    t, cfg = _load(hf_dir)
    text, vcfg = cfg["text_config"], cfg["vision_config"]
    out: dict[str, np.ndarray] = {"text/token_embedding": t[TP + "embed_tokens.weight"], "text/output_head": t["lm_head.weight"],
                                  "text/final_norm": t[TP + "norm.weight"]}

    def mla(a: str, p: str) -> None:
        for ours, theirs in (("query_a", "q_a_proj.weight"), ("kv_a", "kv_a_proj_with_mqa.weight"),
                             ("query_a_norm", "q_a_layernorm.weight"), ("kv_a_norm", "kv_a_layernorm.weight"),
                             ("query_b", "q_b_proj.weight"), ("kv_b", "kv_b_proj.weight"), ("output", "o_proj.weight"),
                             ("indexer/query_b", "indexer.wq_b.weight"), ("indexer/key", "indexer.wk.weight"),
                             ("indexer/key_norm_weight", "indexer.k_norm.weight"),
                             ("indexer/key_norm_bias", "indexer.k_norm.bias"),
                             ("indexer/weights", "indexer.weights_proj.weight"),
                             ("indexer/pool_ape", "indexer.index_kpool_compress_ape"),
                             ("indexer/pool_gate", "indexer.index_kpool_compress_gate")):
            out[p + "mla/" + ours] = t[a + theirs]

    def moe(m: str, p: str) -> None:
        out[p + "moe/router"], out[p + "moe/router_bias"] = t[m + "gate.weight"], t[m + "gate.e_score_correction_bias"]
        for e in range(text["n_routed_experts"]):
            for w in ("gate", "up", "down"):
                out[f"{p}moe/experts/{e}/{w}"] = t[f"{m}experts.{e}.{w}_proj.weight"]
        for w in ("gate", "up", "down"):
            out[f"{p}moe/shared/{w}"] = t[f"{m}shared_experts.{w}_proj.weight"]

    for i, (kind, ffn) in enumerate(zip(text["layer_types"], text["mlp_layer_types"], strict=True)):
        hp, p = f"{TP}layers.{i}.", f"text/layers/{i}/"
        out[p + "input_norm"], out[p + "post_attention_norm"] = t[hp + "input_layernorm.weight"], t[hp + "post_attention_layernorm.weight"]
        for site, hf in (("attention", "attn"), ("ffn", "ffn")):
            for w in ("fn", "base", "scale"):
                out[f"{p}hyper_connection/{site}/{w}"] = t[f"{hp}hc_{hf}_{w}"]
        a = hp + "self_attn."
        if kind == "linear_attention":
            for ours, theirs in (("query", "q_proj.weight"), ("key", "k_proj.weight"), ("value", "v_proj.weight"),
                                 ("forget_a", "f_a_proj.weight"), ("forget_b", "f_b_proj.weight"), ("dt_bias", "dt_bias"),
                                 ("a_log", "A_log"), ("beta", "b_proj.weight"), ("output_gate_a", "g_a_proj.weight"),
                                 ("output_gate_b", "g_b_proj.weight"), ("output_norm", "o_norm.weight"),
                                 ("output", "o_proj.weight")):
                out[p + "kda/" + ours] = t[a + theirs]
            conv = np.concatenate([t[f"{a}{n}_conv1d.weight"] for n in "qkv"], axis=0)  # [3C, 1, K]
            out[p + "kda/convolution"] = conv[:, 0, :].T
        else:
            mla(a, p)
        if ffn == "dense":
            for w in ("gate", "up", "down"):
                out[f"{p}mlp/{w}"] = t[f"{hp}mlp.{w}_proj.weight"]
        else:
            moe(hp + "mlp.", p)
    nextn = f"{TP}layers.{text['num_hidden_layers']}."
    if nextn + "eh_proj.weight" in t:
        out["mtp/input_projection"] = t[nextn + "eh_proj.weight"]
        out["mtp/embedding_norm"], out["mtp/hidden_norm"] = t[nextn + "enorm.weight"], t[nextn + "hnorm.weight"]
        out["mtp/final_norm"] = t[nextn + "shared_head.norm.weight"]
        p = "mtp/layers/0/"
        out[p + "input_norm"] = t[nextn + "input_layernorm.weight"]
        out[p + "post_attention_norm"] = t[nextn + "post_attention_layernorm.weight"]
        mla(nextn + "self_attn.", p)
        moe(nextn + "mlp.", p)

    v, width, merge = "model.visual.", vcfg["hidden_size"], vcfg["spatial_merge_size"]
    out["vision/patch_embedding"] = t[v + "patch_embed.proj.weight"].reshape(width, -1)
    out["vision/patch_embedding_bias"] = t[v + "patch_embed.proj.bias"]
    for b in range(vcfg["depth"]):
        hp, p = f"{v}blocks.{b}.", f"vision/layers/{b}/"
        out[p + "norm1_weight"], out[p + "norm2_weight"] = t[hp + "norm1.weight"], t[hp + "norm2.weight"]
        for i, n in enumerate(("query", "key", "value")):
            out[f"{p}attention/{n}"] = t[hp + "attn.qkv.weight"][i * width:(i + 1) * width]
            out[f"{p}attention/{n}_bias"] = t[hp + "attn.qkv.bias"][i * width:(i + 1) * width]
        out[p + "attention/query_norm"], out[p + "attention/key_norm"] = t[hp + "attn.q_norm.weight"], t[hp + "attn.k_norm.weight"]
        out[p + "attention/output"], out[p + "attention/output_bias"] = t[hp + "attn.proj.weight"], t[hp + "attn.proj.bias"]
        for w in ("gate", "up", "down"):
            out[f"{p}mlp/{w}"], out[f"{p}mlp/{w}_bias"] = t[f"{hp}mlp.{w}_proj.weight"], t[f"{hp}mlp.{w}_proj.bias"]
    out["vision/post_norm"] = t[v + "post_layernorm.weight"]
    ds = t[v + "downsample.weight"]  # [O, W, m, m] -> columns (row-in-block, col-in-block, channel)
    out["vision/downsample"] = np.stack([ds[:, :, r, c] for r in range(merge) for c in range(merge)], axis=1).reshape(len(ds), -1)
    out["vision/downsample_bias"] = t[v + "downsample.bias"]
    mg = v + "merger."
    out["vision/merger/projection"] = t[mg + "proj.weight"]
    out["vision/merger/norm_weight"], out["vision/merger/norm_bias"] = t[mg + "post_projection_norm.weight"], t[mg + "post_projection_norm.bias"]
    for w in ("gate", "up", "down"):
        out[f"vision/merger/{w}"] = t[f"{mg}{w}_proj.weight"]
    return out


EXPECTED = {"qwen4_exp": expected_qwen4, "glm5_next": expected_glm}


# -- fixtures ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory) -> dict[str, Path]:
    dirs = {}
    for arch in ARCHS:
        dirs[arch] = cached_hf_model(arch)
    return dirs


@pytest.fixture(scope="module")
def expected(hf_dirs) -> dict[str, dict[str, np.ndarray]]:
    return {arch: EXPECTED[arch](hf_dirs[arch]) for arch in ARCHS}


@pytest.fixture(scope="module")
def artifacts(hf_dirs, tmp_path_factory) -> dict[tuple[str, str], Path]:
    root = tmp_path_factory.mktemp("artifacts")
    out = {}
    for arch in ARCHS:
        for recipe in RECIPES:
            out[arch, recipe] = root / f"{arch}-{recipe}.ninfer"
            convert(hf_dirs[arch], out[arch, recipe], recipe)
    return out


def _object_of(art: Artifact, name: str):
    return art.tensor_object(art.binding(name).parts[0].object)


def _rewrite(src: Path, dst: Path, edit) -> Path:
    shutil.copytree(src, dst)
    dst.chmod(0o755)
    tensors = load_file(dst / "model.safetensors")
    edit(tensors)
    (dst / "model.safetensors").chmod(0o644)
    save_file({k: v.contiguous() for k, v in tensors.items()}, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


# -- tests ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("arch", ARCHS)
def test_every_parameter_round_trips(arch, recipe, hf_dirs, expected, artifacts):
    want_all = expected[arch]
    hf = load_hf_dir(hf_dirs[arch])
    try:
        plan = make_plan(hf, recipe)
    finally:
        hf.close()
    assert plan.unused == {}, "these checkpoints hold only parameters and persistent buffers the artifact keeps"
    stored: dict[str, np.ndarray] = {}
    with Artifact(artifacts[arch, recipe], strict=True) as art:
        assert set(art.bindings) == set(want_all)
        assert set(art.components) == {"text", "vision"}
        assert art.components["vision"].target == "text"
        assert art.provenance["unused_source_tensors"] == {}
        for name, want in want_all.items():
            obj = _object_of(art, name)
            got = art.parameter(name, want.shape)
            if obj.format == "int32":
                assert got.dtype == np.int32 and np.array_equal(got.astype(np.int64), want), name
            elif obj.format == "fp32":
                assert got.tobytes() == want.astype(np.float32).tobytes(), name
            elif obj.format == "bf16":
                rounded = want.astype(ml_dtypes.bfloat16).astype(np.float32)
                assert got.tobytes() == rounded.tobytes(), name
            else:
                assert recipe != "bf16", f"{name} is {obj.format} under the bf16 recipe"
                # scales are per group of a stored row: bound the parameter's elements within its object
                (part,) = art.binding(name).parts
                if obj.id not in stored:
                    stored[obj.id] = _stored_expectation(art, obj.id, want_all)
                bound = rounding_bound(obj.format, stored[obj.id]).reshape(-1)[part.begin:part.end]
                err = np.abs(got.astype(np.float64) - want).reshape(-1)
                assert np.all(err <= bound), f"{name} ({obj.format}) exceeds its rounding bound"


def _stored_expectation(art: Artifact, object_id: str, want_all: dict[str, np.ndarray]) -> np.ndarray:
    """The expected values of a whole stored object, assembled from the bindings into it."""
    obj = art.tensor_object(object_id)
    flat = np.full(obj.elements, np.nan, np.float32)
    for name, binding in art.bindings.items():
        pos = 0
        for part in binding.parts:
            if part.object == object_id:
                flat[part.begin:part.end] = want_all[name].reshape(-1)[pos:pos + part.elements]
            pos += part.elements
    assert not np.isnan(flat).any(), f"object {object_id} has elements no binding covers"
    return flat.reshape(obj.shape)


@pytest.mark.parametrize("arch", ARCHS)
def test_bf16_sources_are_bit_exact(arch, hf_dirs, tmp_path):
    """With bf16 sources (as released checkpoints are), every bf16/fp32 parameter keeps every word."""
    def to_bf16(t: dict[str, torch.Tensor]) -> None:
        for k, v in t.items():
            if v.is_floating_point():
                t[k] = v.to(torch.bfloat16)

    hf = _rewrite(hf_dirs[arch], tmp_path / "hf", to_bf16)
    want_all = EXPECTED[arch](hf)
    convert(hf, tmp_path / "m.ninfer", "bf16")
    with Artifact(tmp_path / "m.ninfer", strict=True) as art:
        assert set(art.bindings) == set(want_all)
        for name, want in want_all.items():
            got = art.parameter(name, want.shape)
            if got.dtype == np.int32:
                assert np.array_equal(got.astype(np.int64), want), name
            else:
                assert got.tobytes() == want.astype(np.float32).tobytes(), name


def _formats(art: Artifact, names: dict[str, str]) -> None:
    for name, fmt in names.items():
        assert _object_of(art, name).format == fmt, (name, _object_of(art, name).format, fmt)


def test_qwen4_formats_uses_and_config(artifacts, hf_dirs):
    with Artifact(artifacts["qwen4_exp", "groupwise-int"], strict=True) as art:
        _formats(art, {
            "text/token_embedding": "q8_g32_fp16", "text/output_head": "q6_g64_fp16",
            "text/layers/3/attention/query": "q8_g32_fp16", "text/layers/0/gdn/query": "q8_g32_fp16",
            "text/layers/0/gdn/a_log": "fp32", "text/layers/0/moe/experts/5/gate": "q4_g64_fp16",
            "text/layers/0/moe/experts/5/down": "q5_g64_fp16", "text/layers/0/moe/shared/up": "q8_g32_fp16",
            "text/layers/3/moe/experts/7/down": "q5_g64_fp16",  # no 35B-A3B layer exceptions
            "text/layers/1/ple/embedding/table": "q4_g64_fp16", "text/layers/1/ple/key_projection": "bf16",
            "text/layers/1/ple/embedding/layer_multipliers": "int32",
            "text/layers/1/ple/embedding/ngram_head_offsets": "int32",
            "text/layers/2/attention/hyper_connection/input_mix/down": "bf16",
            "text/layers/3/attention/indexer/query_key": "bf16", "vision/layers/0/attention/query": "q4_g64_fp16",
        })
        uses = {(u.parameter, u.input) for u in art.uses}
        for use in [
            ("text/layers/0/attention/hyper_connection/input_mix/down", "text/layers/0/attention/hyper_connection/normalized_state"),
            ("text/layers/0/attention/hyper_connection/input_mix/up", "text/layers/0/attention/hyper_connection/low_rank"),
            ("text/layers/0/mlp/hyper_connection/block_inject", "text/layers/0/mlp/hyper_connection/normalized_state"),
            ("text/hyper_connection/input_mix/down", "text/hyper_connection/normalized_state"),
            ("text/layers/1/ple/key_projection", "text/layers/1/ple/embedding"),
            ("text/layers/1/ple/value_projection", "text/layers/1/ple/embedding"),
            ("text/layers/3/attention/indexer/query_key", "text/layers/3/mixer_input"),
            ("text/layers/3/attention/gate", "text/layers/3/mixer_input"),
            ("text/layers/2/moe/experts/4/down", "text/layers/2/moe/experts/4/product"),
            ("text/layers/2/moe/shared_score", "text/layers/2/ffn_input"),
            ("text/output_head", "text/final_hidden"),
        ]:
            assert use in uses, use
        assert "text/layers/3/moe/shared/product" in {u.input for u in art.uses}
        assert not any(n.endswith("input_norm") or n == "text/final_norm" for n in art.bindings)
        text = art.components["text"].config
        assert text["architectures"] == ["Qwen4ExpForCausalLM"] and text["model_type"] == "qwen4_exp_text"
        assert text["layer_types"] == ["linear_attention"] * 3 + ["indexed_attention"]
        for key in ("hc_count", "hc_lowrank", "indexer_budget", "ple_layer_ids", "ngram_size", "heads_per_ngram",
                    "split_ngram_parts", "output_gate_type", "norm_topk_prob", "seed", "ngram_vocab_size_base",
                    "make_ngram_vocab_size_divisible_by", "num_experts"):
            assert key in text, key
        assert text["eos_token_id"] == 1
        assert art.components["vision"].config["model_type"] == "qwen4_exp_vision"
        # the multipliers reassemble into the HF int64 values
        words = art.parameter("text/layers/1/ple/embedding/layer_multipliers").astype(np.int64)
        t, _ = _load(hf_dirs["qwen4_exp"])
        joined = (words[:, 1] << 32) | (words[:, 0] & 0xFFFFFFFF)
        assert np.array_equal(joined, t[TP + "layers.1.ple.ple_embedding.layer_multipliers"])


def test_glm_formats_uses_and_config(artifacts):
    with Artifact(artifacts["glm5_next", "groupwise-int"], strict=True) as art:
        _formats(art, {
            "text/token_embedding": "q8_g32_fp16", "text/output_head": "q6_g64_fp16",
            "text/layers/0/kda/query": "q8_g32_fp16", "text/layers/0/kda/output": "q8_g32_fp16",
            "text/layers/0/kda/forget_b": "bf16", "text/layers/0/kda/a_log": "fp32", "text/layers/0/kda/dt_bias": "fp32",
            "text/layers/0/kda/convolution": "bf16", "text/layers/0/hyper_connection/attention/scale": "fp32",
            "text/layers/0/hyper_connection/ffn/base": "fp32", "text/layers/0/hyper_connection/ffn/fn": "bf16",
            "text/layers/0/mlp/gate": "q8_g32_fp16", "text/layers/3/mla/kv_b": "q8_g32_fp16",
            "text/layers/3/mla/indexer/query_b": "bf16", "text/layers/3/moe/router": "bf16",
            "text/layers/3/moe/router_bias": "fp32", "text/layers/3/moe/experts/2/up": "q4_g64_fp16",
            "text/layers/3/moe/experts/2/down": "q5_g64_fp16", "text/layers/3/moe/shared/down": "q8_g32_fp16",
            "vision/patch_embedding": "q6_g64_fp16", "vision/layers/1/mlp/gate": "q4_g64_fp16",
            "vision/layers/1/mlp/down": "q5_g64_fp16", "vision/downsample": "q8_g32_fp16", "vision/merger/up": "q8_g32_fp16",
        })
        uses = {(u.parameter, u.input) for u in art.uses}
        p = "text/layers/"
        for use in [
            (p + "0/kda/value", p + "0/mixer_input"), (p + "0/kda/forget_b", p + "0/kda/forget_low_rank"),
            (p + "0/kda/output_gate_b", p + "0/kda/output_gate_low_rank"), (p + "0/kda/output", p + "0/kda/gated_output"),
            (p + "0/hyper_connection/ffn/fn", p + "0/hyper_connection/ffn/normalized_state"),
            (p + "3/mla/query_b", p + "3/mla/query_latent"), (p + "3/mla/indexer/query_b", p + "3/mla/query_latent"),
            (p + "3/mla/kv_b", p + "3/mla/kv_latent"), (p + "3/mla/output", p + "3/mla/attention_output"),
            (p + "3/mla/indexer/pool_gate", p + "3/mixer_input"), (p + "3/moe/router", p + "3/ffn_input"),
            (p + "3/moe/experts/6/down", p + "3/moe/experts/6/product"), (p + "1/mlp/down", p + "1/mlp/product"),
            ("vision/downsample", "vision/downsample_input"), ("vision/merger/gate", "vision/merger/activation"),
            ("text/output_head", "text/final_hidden"),
        ]:
            assert use in uses, use
        assert not any(u.parameter.endswith(("_norm", "_bias", "/base", "/scale", "/a_log")) for u in art.uses)
        text = art.components["text"].config
        assert text["architectures"] == ["Glm5NextForCausalLM"] and text["model_type"] == "glm5_next_text"
        for key in ("hc_mult", "hc_sinkhorn_iters", "linear_lower_bound", "index_kpool", "routed_scaling_factor",
                    "mlp_layer_types", "swiglu_limit", "q_lora_rank", "n_routed_experts"):
            assert key in text, key
        vision = art.components["vision"].config
        assert vision["model_type"] == "glm5_next_vision" and vision["image_start_token_id"] == 502


def test_qwen4_mtp_head(hf_dirs, tmp_path):
    """A checkpoint with the Qwen4Exp MTP head of models.md 7.1 (HF has none: built from layer 3)."""
    def add_mtp(t: dict[str, torch.Tensor]) -> None:
        g = torch.Generator().manual_seed(7)
        src = f"{TP}layers.3."
        for k in [k for k in t if k.startswith(src)]:
            t["mtp.layers.0." + k[len(src):]] = t[k] + 0.01 * torch.randn(t[k].shape, generator=g)
        for k in [k for k in t if k.startswith(TP + "hyper_connection_mixer.")]:
            t["mtp." + k[len(TP):]] = t[k].clone()
        h = t[TP + "embed_tokens.weight"].shape[1]
        for name, shape in (("fc_embedding.weight", (h, h)), ("fc_hidden.weight", (h, h)),
                            ("pre_fc_norm_embedding.weight", (h,)), ("pre_fc_norm_hidden.weight", (4 * h,))):
            t["mtp." + name] = torch.randn(shape, generator=g)

    hf = _rewrite(hf_dirs["qwen4_exp"], tmp_path / "hf", add_mtp)
    want_all = expected_qwen4(hf)
    convert(hf, tmp_path / "m.ninfer", "groupwise-int")
    with Artifact(tmp_path / "m.ninfer", strict=True) as art:
        assert set(art.bindings) == set(want_all)
        assert art.components["mtp"].config == {"architectures": ["Qwen4ExpMTP"]}
        assert art.components["mtp"].target == "text"
        _formats(art, {"mtp/embedding_projection": "q8_g32_fp16", "mtp/layers/0/moe/experts/3/gate": "q8_g32_fp16",
                       "mtp/layers/0/attention/query": "q8_g32_fp16", "mtp/hidden_norm": "bf16",
                       "mtp/layers/0/attention/indexer/query_key": "bf16"})
        uses = {(u.parameter, u.input) for u in art.uses}
        assert ("mtp/hidden_projection", "mtp/normalized_hidden") in uses
        assert ("mtp/embedding_projection", "mtp/normalized_embedding") in uses
        assert ("text/output_head", "mtp/final_hidden") in uses
        got = art.parameter("mtp/layers/0/attention/hyper_connection/block_inject")
        assert np.abs(got - want_all["mtp/layers/0/attention/hyper_connection/block_inject"]).max() < 1e-2


def test_glm_nextn_head(hf_dirs, tmp_path):
    """A checkpoint with a DeepSeek-style NextN layer at index num_hidden_layers (models.md 7.1)."""
    skip = ("hc_",)

    def add_nextn(t: dict[str, torch.Tensor]) -> None:
        g = torch.Generator().manual_seed(9)
        src, dst = f"{TP}layers.3.", f"{TP}layers.4."
        for k in [k for k in t if k.startswith(src) and not k[len(src):].startswith(skip)]:
            t[dst + k[len(src):]] = t[k] + 0.01 * torch.randn(t[k].shape, generator=g)
        h = t[TP + "embed_tokens.weight"].shape[1]
        t[dst + "eh_proj.weight"] = torch.randn((h, 2 * h), generator=g)
        for n in ("enorm", "hnorm", "shared_head.norm"):
            t[f"{dst}{n}.weight"] = torch.randn((h,), generator=g)
        t[dst + "embed_tokens.weight"] = t[TP + "embed_tokens.weight"].clone()
        t[dst + "shared_head.head.weight"] = t["lm_head.weight"].clone()

    hf = _rewrite(hf_dirs["glm5_next"], tmp_path / "hf", add_nextn)
    want_all = expected_glm(hf)
    loaded = load_hf_dir(hf)
    try:
        plan = make_plan(loaded, "bf16")
    finally:
        loaded.close()
    assert set(plan.unused) == {f"{TP}layers.4.embed_tokens.weight", f"{TP}layers.4.shared_head.head.weight"}
    assert all("shares the target's" in why for why in plan.unused.values())
    convert(hf, tmp_path / "m.ninfer", "groupwise-int")
    with Artifact(tmp_path / "m.ninfer", strict=True) as art:
        assert set(art.bindings) == set(want_all)
        assert art.components["mtp"].config == {"architectures": ["Glm5NextMTP"]}
        _formats(art, {"mtp/input_projection": "q8_g32_fp16", "mtp/layers/0/mla/kv_b": "q8_g32_fp16",
                       "mtp/layers/0/moe/experts/0/down": "q8_g32_fp16", "mtp/layers/0/moe/router_bias": "fp32"})
        assert ("mtp/input_projection", "mtp/stem_input") in {(u.parameter, u.input) for u in art.uses}
        assert ("text/output_head", "mtp/final_hidden") in {(u.parameter, u.input) for u in art.uses}
        assert art.provenance["unused_source_tensors"] == plan.unused


def test_qwen4_ngram_tables_derived_when_absent(hf_dirs, expected, tmp_path):
    """Without the HF hash buffers the converter derives them from the config (models.md 4.3)."""
    e = f"{TP}layers.1.ple.ple_embedding."
    names = [e + n for n in ("layer_multipliers", "ngram_heads_offsets", "ngram_heads_vocab_sizes")]

    def drop(t: dict[str, torch.Tensor]) -> None:
        for n in names:
            del t[n]

    hf = _rewrite(hf_dirs["qwen4_exp"], tmp_path / "hf", drop)
    convert(hf, tmp_path / "m.ninfer", "bf16")
    with Artifact(tmp_path / "m.ninfer", strict=True) as art:
        for ours in ("layer_multipliers", "ngram_head_offsets", "ngram_head_vocab_sizes"):
            name = f"text/layers/1/ple/embedding/{ours}"
            assert np.array_equal(art.parameter(name).astype(np.int64), expected["qwen4_exp"][name]), name


def test_qwen4_ngram_tables_must_match_config(hf_dirs, tmp_path):
    key = f"{TP}layers.1.ple.ple_embedding.layer_multipliers"

    def tamper(t: dict[str, torch.Tensor]) -> None:
        t[key] = t[key] + 2

    hf = _rewrite(hf_dirs["qwen4_exp"], tmp_path / "hf", tamper)
    with pytest.raises(ConversionError, match="does not match the n-gram hash"):
        convert(hf, tmp_path / "m.ninfer", "bf16")
    assert not (tmp_path / "m.ninfer").exists()
