"""The tiny model with bf16 and grouped-int (q4/q5/q6/q8) weights, consumed as stored.

Reference: HF in fp32 with every weight replaced by the value our stored form represents
(bf16 rounding, or quantize -> dequantize row by row), so any mismatch is a kernel or
layout error, not quantization noise.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from ninfer_compiler.build import build_model  # noqa: E402
from ninfer_compiler.frontend.options import ModelOptions, WeightPlan  # noqa: E402
from ninfer_compiler.frontend.qwen3_5.config import Qwen35TextConfig  # noqa: E402
from ninfer_compiler.frontend.qwen3_5.hf_params import encode_params, hf_to_logical  # noqa: E402
from ninfer_compiler.frontend.qwen3_5.model import Qwen35ForCausalLM  # noqa: E402
from ninfer_compiler.ops.row_split import decode_row_split, encode_row_split  # noqa: E402
from tests.compiler.qwen3_5_harness import Driver, rel_err, tiny_hf_model  # noqa: E402

pytestmark = pytest.mark.slow

PLAN = WeightPlan(
    default="bf16",
    overrides=(
        ("token_embedding", "q6_g64_fp16"),
        ("output_head", "q8_g32_fp16"),
        ("layers.*.attention.output", "q5_g64_fp16"),
        ("layers.*.attention.query", "q4_g64_fp16"),
        ("layers.*.attention.gate", "q4_g64_fp16"),  # same HF tensor (q_proj) as query
        ("layers.*.attention.key", "q4_g64_fp16"),
        ("layers.*.attention.value", "q8_g32_fp16"),
        ("layers.*.gdn.query", "q5_g64_fp16"),
        ("layers.*.gdn.key", "q5_g64_fp16"),
        ("layers.*.gdn.value", "q5_g64_fp16"),
        ("layers.*.gdn.z", "q6_g64_fp16"),
        ("layers.*.gdn.output", "q8_g32_fp16"),
        ("layers.*.mlp.down", "q5_g64_fp16"),
        ("layers.*.mlp.*", "q4_g64_fp16"),
    ),
)
# HF tensor suffix -> our module name (one format per HF tensor under PLAN)
HF_TO_OURS = {
    "self_attn.q_proj": "attention.query", "self_attn.k_proj": "attention.key",
    "self_attn.v_proj": "attention.value", "self_attn.o_proj": "attention.output",
    "self_attn.q_norm": "attention.query_norm", "self_attn.k_norm": "attention.key_norm",
    "linear_attn.in_proj_qkv": "gdn.query", "linear_attn.in_proj_z": "gdn.z",
    "linear_attn.in_proj_a": "gdn.a_projection", "linear_attn.in_proj_b": "gdn.b_projection",
    "linear_attn.out_proj": "gdn.output", "linear_attn.norm": "gdn.norm",
    "linear_attn.conv1d": "gdn.convolution", "mlp.gate_proj": "mlp.gate", "mlp.up_proj": "mlp.up",
    "mlp.down_proj": "mlp.down", "input_layernorm": "input_norm",
    "post_attention_layernorm": "post_attention_norm",
}  # fmt: skip


def our_path(hf_name: str) -> str | None:
    name = hf_name.removeprefix("model.").removesuffix(".weight")
    top = {"embed_tokens": "token_embedding", "lm_head": "output_head", "norm": "final_norm"}
    if name in top:
        return top[name]
    if name.endswith(("A_log", "dt_bias")):
        return None  # fp32 by definition
    _, index, rest = name.split(".", 2)
    return f"layers.{index}.{HF_TO_OURS[rest]}"


def as_stored(value: np.ndarray, fmt: str) -> np.ndarray:
    """The fp32 value a weight has once stored in `fmt`."""
    if fmt == "float32":
        return value
    if fmt == "bfloat16":
        return value.astype(ml_dtypes.bfloat16).astype(np.float32)
    return decode_row_split(encode_row_split(value, fmt), fmt, value.shape[1])


@pytest.fixture(scope="module")
def quantized():
    hf = tiny_hf_model(seed=1)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            path = our_path(name)
            if path is not None:
                w = p.numpy().reshape(p.shape[0], -1)
                p.copy_(torch.tensor(as_stored(w, PLAN.format_of(path)).reshape(p.shape)))
    cfg = Qwen35TextConfig.from_dict(hf.config.to_dict())
    opts = ModelOptions(weights=PLAN)
    compiled = build_model(Qwen35ForCausalLM(cfg, opts))
    params = encode_params(hf_to_logical(hf.state_dict(), cfg), compiled.param_dtypes, PLAN)
    return hf, cfg, opts, compiled, params


def test_plan_covers_every_format(quantized):
    *_, compiled, params = quantized
    dtypes = {p.dtype for p in compiled.params}
    assert {"bfloat16", "float32", "uint8", "float16"} <= dtypes
    assert params["layers.0.gdn.value.high"].shape == (192, 16)  # q5: 2 groups x 8 bytes
    assert params["layers.1.gdn.z.high"].shape == (192, 32)  # q6: 2 groups x 16 bytes


def test_prefill_and_decode_match_hf(quantized):
    hf, cfg, opts, compiled, params = quantized
    prompt = np.random.default_rng(5).integers(2, 400, size=70)
    extra = np.array([17, 300, 45])
    with torch.no_grad():
        ref = hf(torch.tensor(np.concatenate([prompt, extra])[None])).logits[0].numpy()
    d = Driver(compiled, params, cfg, opts)
    seq = d.new_sequence()
    logits = [d.prefill(seq, prompt, all_logits=True)]
    logits += [d.decode([seq], np.array([t])) for t in extra]
    err = rel_err(np.concatenate(logits), ref)
    print(f"\nq4/q5/q6/q8 + bf16 weights: rel err {err:.2e}, compile {compiled.compile_seconds:.2f} s")
    assert err <= 1e-4


def test_tied_quantized_embedding_serves_as_head():
    hf = tiny_hf_model(seed=2, tie_word_embeddings=True)
    assert hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()
    plan = WeightPlan(overrides=(("token_embedding", "q8_g32_fp16"),))
    with torch.no_grad():
        table = hf.model.embed_tokens.weight
        table.copy_(torch.tensor(as_stored(table.numpy(), "q8_g32_fp16")))
    cfg = Qwen35TextConfig.from_dict(hf.config.to_dict())
    opts = ModelOptions(weights=plan)
    compiled = build_model(Qwen35ForCausalLM(cfg, opts))
    assert not any(p.name.startswith("output_head") for p in compiled.params)
    params = encode_params(hf_to_logical(hf.state_dict(), cfg), compiled.param_dtypes, plan)
    prompt = np.random.default_rng(6).integers(2, 400, size=20)
    with torch.no_grad():
        ref = hf(torch.tensor(prompt[None])).logits[0].numpy()
    d = Driver(compiled, params, cfg, opts)
    assert rel_err(d.prefill(d.new_sequence(), prompt, all_logits=True), ref) <= 1e-4


def test_bf16_activations_track_hf_bf16():
    """bf16 activations, caches and weights: error vs fp32 on the order of HF's own bf16 run."""
    hf = tiny_hf_model(seed=3)
    cfg = Qwen35TextConfig.from_dict(hf.config.to_dict())
    opts = ModelOptions(dtype="bfloat16", weights=WeightPlan("bf16"))
    compiled = build_model(Qwen35ForCausalLM(cfg, opts))
    params = encode_params(hf_to_logical(hf.state_dict(), cfg), compiled.param_dtypes, opts.weights)
    prompt = np.random.default_rng(7).integers(2, 400, size=70)
    with torch.no_grad():
        ref = hf(torch.tensor(prompt[None])).logits[0].numpy()
        ref_bf16 = hf.to(torch.bfloat16)(torch.tensor(prompt[None])).logits[0].float().numpy()
    d = Driver(compiled, params, cfg, opts)
    seq = d.new_sequence()
    ours = np.concatenate([d.prefill(seq, prompt[:66], all_logits=True),
                           *[d.decode([seq], prompt[i : i + 1]) for i in range(66, 70)]])  # fmt: skip
    err, hf_err = rel_err(ours, ref), rel_err(ref_bf16, ref)
    print(f"\nbf16 activations: rel err {err:.2e} (HF bf16: {hf_err:.2e})")
    assert err <= max(2 * hf_err, 1e-3)
