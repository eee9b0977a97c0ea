"""The tiny model with bf16, grouped-int (q4/q5/q6/q8) and fp8-row weights, consumed as stored.

Reference: HF in fp32 with every weight replaced by the value our stored form represents
(bf16 rounding, or quantize -> dequantize row by row), so any mismatch is a kernel or
layout error, not quantization noise. The fp8-row model is checked both from encoded
parameters and through the converter, binder and runtime (`convert_fp8_row`).
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


# ---- fp8_e4m3fn_row_bf16 (the Qwen3.8-27B nvfp4 recipe's format for most projections) -------------

FP8 = "fp8_e4m3fn_row_bf16"
FP8_PLAN = WeightPlan(
    default="bf16",
    overrides=(
        ("token_embedding", FP8),
        ("output_head", FP8),
        ("layers.0.mlp.*", "q4_g64_fp16"),  # formats mix per layer, as in the official recipe
        *((f"layers.*.attention.{p}", FP8) for p in ("query", "gate", "key", "value", "output")),
        *((f"layers.*.gdn.{p}", FP8) for p in ("query", "key", "value", "z", "output")),
        ("layers.*.mlp.*", FP8),
    ),
)


def fp8_as_stored(value: np.ndarray) -> np.ndarray:
    """The fp32 value of a weight stored as fp8 rows (the converter's quantizer, the codec's decode)."""
    from ninfer_runtime.artifact.codecs import dequantize
    from ninfer_runtime.artifact.quantize import quantize_fp8_row

    return dequantize(quantize_fp8_row(value))


def fp8_params(logical: dict[str, np.ndarray], param_dtypes: dict[str, str], plan: WeightPlan) -> dict[str, np.ndarray]:
    """`encode_params` with fp8-row modules encoded into their `codes` / `row_scales` planes."""
    from ninfer_runtime.artifact.quantize import quantize_fp8_row

    fp8 = {name.removesuffix(".weight") for name in logical if f"{name.removesuffix('.weight')}.row_scales" in param_dtypes}
    out = {}
    for module in fp8:
        planes = quantize_fp8_row(logical[f"{module}.weight"])
        out[f"{module}.codes"] = planes.codes
        out[f"{module}.row_scales"] = planes.scales.view(ml_dtypes.bfloat16)
    rest = {n: v for n, v in logical.items() if n.removesuffix(".weight") not in fp8}
    dtypes = {n: d for n, d in param_dtypes.items() if n not in out}
    return out | encode_params(rest, dtypes, plan)


def test_fp8_row_weights_match_hf():
    """fp8-row projections, embedding and head (plus q4 and bf16 ones) against HF on the same stored
    values: prefill and decode logits, and the greedy continuation."""
    hf = tiny_hf_model(seed=4)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            path = our_path(name)
            if path is not None:
                w = p.numpy().reshape(p.shape[0], -1)
                fmt = FP8_PLAN.format_of(path)
                stored = fp8_as_stored(w) if fmt == FP8 else as_stored(w, fmt)
                p.copy_(torch.tensor(stored.reshape(p.shape)))
    cfg = Qwen35TextConfig.from_dict(hf.config.to_dict())
    opts = ModelOptions(weights=FP8_PLAN)
    compiled = build_model(Qwen35ForCausalLM(cfg, opts))
    assert {p.dtype for p in compiled.params if p.name.endswith(".row_scales")} == {"bfloat16"}
    params = fp8_params(hf_to_logical(hf.state_dict(), cfg), compiled.param_dtypes, FP8_PLAN)
    assert params["token_embedding.codes"].shape == (512, 64) and params["output_head.row_scales"].shape == (512,)
    assert "layers.0.mlp.up.base" in params and "layers.1.mlp.up.codes" in params
    prompt = np.random.default_rng(8).integers(2, 400, size=70)
    extra = np.array([17, 300, 45])
    with torch.no_grad():
        ref = hf(torch.tensor(np.concatenate([prompt, extra])[None])).logits[0].numpy()
        greedy = hf.generate(torch.tensor(prompt[None]), max_new_tokens=12, do_sample=False, eos_token_id=None,
                             pad_token_id=0)[0, len(prompt):].tolist()
    d = Driver(compiled, params, cfg, opts)
    seq = d.new_sequence()
    logits = [d.prefill(seq, prompt, all_logits=True)]
    logits += [d.decode([seq], np.array([t])) for t in extra]
    err = rel_err(np.concatenate(logits), ref)
    print(f"\nfp8-row + q4 + bf16 weights: rel err {err:.2e}")
    assert err <= 1e-4
    seq = d.new_sequence()
    tokens = [int(np.argmax(d.prefill(seq, prompt)[-1]))]
    for _ in range(11):
        tokens.append(int(np.argmax(d.decode([seq], np.array([tokens[-1]]))[-1])))
    assert tokens == greedy


def test_tied_fp8_embedding_serves_as_head():
    hf = tiny_hf_model(seed=5, tie_word_embeddings=True)
    plan = WeightPlan(overrides=(("token_embedding", FP8),))
    with torch.no_grad():
        table = hf.model.embed_tokens.weight
        table.copy_(torch.tensor(fp8_as_stored(table.numpy())))
    cfg = Qwen35TextConfig.from_dict(hf.config.to_dict())
    opts = ModelOptions(weights=plan)
    compiled = build_model(Qwen35ForCausalLM(cfg, opts))
    assert not any(p.name.startswith("output_head") for p in compiled.params)
    params = fp8_params(hf_to_logical(hf.state_dict(), cfg), compiled.param_dtypes, plan)
    prompt = np.random.default_rng(9).integers(2, 400, size=20)
    with torch.no_grad():
        ref = hf(torch.tensor(prompt[None])).logits[0].numpy()
    d = Driver(compiled, params, cfg, opts)
    assert rel_err(d.prefill(d.new_sequence(), prompt, all_logits=True), ref) <= 1e-4


# ---- an fp8-row artifact from the converter, compiled for cpu ----------------------------------------

FP8_ROLES = ("embedding", "output_head", "attention.query_key_gate_value", "attention.output",
             "gdn.query_key_value_z", "gdn.output", "mlp.gate_up", "mlp.down")


def convert_fp8_row(out):
    """The tiny Qwen3.5 converted with an fp8-row test recipe: the nvfp4 recipe's packing (one parent
    per projection group: `[q; k; g; v]`, `[q; k; v; z]`, `[gate; up]`) with the embedding, the head and
    every projection stored fp8-row, except layer 0's MLP (kept nvfp4 / q8, as the Qwen3.8-27B recipe
    mixes nvfp4 and fp8-row MLPs by layer)."""
    from ninfer_compiler.convert import recipes
    from ninfer_compiler.convert.driver import convert
    from ninfer_compiler.testmodel.factory import cached_hf_model

    original = recipes.format_for

    def fmt(recipe: str, family: str, role: str, layer: int | None) -> str:
        if role in FP8_ROLES and not (role.startswith("mlp.") and layer == 0):
            return FP8
        return original(recipe, family, role, layer)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(recipes, "format_for", fmt)
        convert(cached_hf_model("qwen3_5"), out, "nvfp4")
    return out


@pytest.fixture(scope="module")
def fp8_package(tmp_path_factory):
    from ninfer_compiler.compile import CompileOptions, compile_artifact

    root = tmp_path_factory.mktemp("fp8-row")
    art = convert_fp8_row(root / "fp8.ninfer")
    compile_artifact(art, root / "pkg", CompileOptions(max_context=1024, prefill_chunk=32))
    return art, root / "pkg"


def test_converted_fp8_row_artifact_matches_hf(fp8_package):
    """Artifact -> binder (row views of packed fp8 parents) -> cpu package -> runtime, against HF on the
    artifact's decoded weights: one-shot and chunked prefill, decode, the greedy continuation."""
    from ninfer_runtime.artifact import Artifact
    from ninfer_runtime.runner import ModelRunner
    from tests.compiler.test_end_to_end import PROMPT, _greedy_continuation, _hf_from_artifact

    art, pkg = fp8_package
    with Artifact(art) as a:
        fmt = {name: a.tensor_object(b.parts[0].object).format for name, b in a.bindings.items()}
        (key,) = a.binding("text/layers/0/gdn/key").parts
    assert fmt["text/token_embedding"] == fmt["text/output_head"] == fmt["text/layers/3/attention/gate"] == FP8
    assert fmt["text/layers/1/mlp/down"] == FP8 and fmt["text/layers/0/mlp/gate"] == "nvfp4"
    assert key.begin == 64 * 64  # `key` is rows 64.. of the layer's [q; k; v; z] parent
    model = _hf_from_artifact(art)
    with torch.no_grad():
        ref = model(input_ids=torch.tensor([PROMPT])).logits[0].numpy()
        greedy = model.generate(torch.tensor([PROMPT]), max_new_tokens=16, do_sample=False, eos_token_id=None,
                                pad_token_id=0)[0, len(PROMPT):].tolist()
    runner = ModelRunner(pkg)
    seq = runner.pool.acquire()
    oneshot = runner.prefill(seq, PROMPT, all_logits=True)
    runner.pool.release(seq)
    err = rel_err(oneshot, ref)
    print(f"\nconverted fp8-row artifact: rel err {err:.2e}")
    assert err <= 1e-4
    seq = runner.pool.acquire()
    head = runner.prefill(seq, PROMPT[:40], all_logits=True)
    tail = [runner.decode([seq], [t])[0] for t in PROMPT[40:]]
    runner.pool.release(seq)
    assert rel_err(np.concatenate([head, np.stack(tail)]), ref) <= 1e-4
    assert _greedy_continuation(runner, oneshot[-1], 16) == greedy
    runner.pool.check_all_free()
