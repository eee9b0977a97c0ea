"""Parameter names and shapes of the model mirror the artifact bindings (models.md 8.2)."""

from __future__ import annotations

import pytest

pytest.importorskip("tvm")

from ninfer_compiler.frontend.options import ModelOptions, WeightPlan  # noqa: E402
from ninfer_compiler.frontend.qwen3_5.config import Qwen35TextConfig  # noqa: E402
from ninfer_compiler.frontend.qwen3_5.model import Qwen35ForCausalLM, binding_name  # noqa: E402
from tests.compiler.frontend.test_qwen3_5_config import TEXT  # noqa: E402


def expected_bindings(cfg: Qwen35TextConfig) -> dict[str, tuple[int, ...]]:
    H, V, D = cfg.hidden_size, cfg.vocab_size, cfg.head_dim
    nq, nkv, inter = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.intermediate_size
    hk, hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk, dv, K = cfg.linear_key_head_dim, cfg.linear_value_head_dim, cfg.linear_conv_kernel_dim
    out = {"text/token_embedding": (V, H), "text/output_head": (V, H), "text/final_norm": (H,)}
    for i, kind in enumerate(cfg.layer_types):
        p = f"text/layers/{i}/"
        out |= {p + "input_norm": (H,), p + "post_attention_norm": (H,),
                p + "mlp/gate": (inter, H), p + "mlp/up": (inter, H), p + "mlp/down": (H, inter)}  # fmt: skip
        if kind == "full_attention":
            a = p + "attention/"
            out |= {a + "query": (nq * D, H), a + "gate": (nq * D, H), a + "key": (nkv * D, H),
                    a + "value": (nkv * D, H), a + "query_norm": (D,), a + "key_norm": (D,),
                    a + "output": (H, nq * D)}  # fmt: skip
        else:
            g = p + "gdn/"
            out |= {g + "query": (hk * dk, H), g + "key": (hk * dk, H), g + "value": (hv * dv, H),
                    g + "z": (hv * dv, H), g + "a_projection": (hv, H), g + "b_projection": (hv, H),
                    g + "a_log": (hv,), g + "dt_bias": (hv,), g + "convolution": (K, cfg.conv_channels),
                    g + "norm": (dv,), g + "output": (H, hv * dv)}  # fmt: skip
    return out


def test_parameters_are_the_bindings():
    cfg = Qwen35TextConfig.from_dict(TEXT)
    model = Qwen35ForCausalLM(cfg)
    got = {binding_name(n): tuple(int(x) for x in p.shape) for n, p in model.named_parameters()}
    assert got == expected_bindings(cfg)
    dtypes = {n: p.dtype for n, p in model.named_parameters()}
    assert dtypes["layers.0.gdn.a_log"] == "float32"


def test_weight_plan_selects_dtype_per_parameter():
    plan = WeightPlan(default="bf16", overrides=(("layers.*.mlp.down", "float32"),))
    model = Qwen35ForCausalLM(Qwen35TextConfig.from_dict(TEXT), ModelOptions(weights=plan))
    dtypes = {n: p.dtype for n, p in model.named_parameters()}
    assert dtypes["layers.1.mlp.down.weight"] == "float32"
    assert dtypes["layers.1.mlp.up.weight"] == "bfloat16"
    assert dtypes["layers.3.attention.query_norm.weight"] == "bfloat16"
    assert dtypes["layers.0.gdn.dt_bias"] == "float32"  # fixed by the model


def test_tied_head_has_no_output_head():
    cfg = Qwen35TextConfig.from_dict({**TEXT, "tie_word_embeddings": True})
    names = [n for n, _ in Qwen35ForCausalLM(cfg).named_parameters()]
    assert "output_head.weight" not in names


def test_quantized_plan_gives_planes_and_keeps_norms_dense():
    plan = WeightPlan("q4_g64_fp16", overrides=(("layers.*.mlp.down", "q5_g64_fp16"),))
    model = Qwen35ForCausalLM(Qwen35TextConfig.from_dict(TEXT), ModelOptions(weights=plan))
    params = {n: (tuple(int(x) for x in p.shape), p.dtype) for n, p in model.named_parameters()}
    assert params["layers.0.mlp.up.base"] == ((128, 64), "uint8")  # K=64 -> K_pad 128: 2 x 32 B
    assert params["layers.0.mlp.up.scales"] == ((128, 2), "float16")
    assert "layers.0.mlp.up.high" not in params
    assert params["layers.0.mlp.down.high"] == ((64, 16), "uint8")  # K=128: 2 groups x 8 bytes
    assert params["token_embedding.base"][1] == "uint8"
    assert params["layers.0.input_norm.weight"] == ((64,), "bfloat16")
    assert params["layers.0.gdn.convolution"][1] == "bfloat16"
    assert {binding_name(n) for n in params if n.startswith("layers.0.mlp.down")} == {
        "text/layers/0/mlp/down"
    }


def test_plan_rejects_quantized_norm():
    plan = WeightPlan(overrides=(("final_norm", "q8_g32_fp16"),))
    with pytest.raises(ValueError, match="'final_norm' must be dense"):
        Qwen35ForCausalLM(Qwen35TextConfig.from_dict(TEXT), ModelOptions(weights=plan))
