"""The fused projection forms (`ops/fused_linear.py`) in a whole groupwise-int h200 export.

A synthetic Qwen3.5 Dense artifact with small but kernel-sized dims (every projection's K a
multiple of 256, 27B-like head layout) is exported for h200: prefill's MLP runs the SwiGLU GEMM and
its down projection and both mixers' output projections add the residual in the GEMM epilogue;
no separate `silu * up` or residual-add kernel is left. Reference-kernel exports keep the unfused
TE ops. Numerics of the fused kernels: tests/compiler/ops/test_qgemm.py (interpreter) and
tests/gpu/check_qgemm.py (H200).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .conftest import require_tool

CONFIG = {
    "hidden_size": 256, "vocab_size": 4096, "num_hidden_layers": 4,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256, "linear_num_key_heads": 2,
    "linear_key_head_dim": 128, "linear_num_value_heads": 6, "linear_value_head_dim": 128,
    "intermediate_size": 512,
}


@pytest.fixture(scope="module")
def mid_artifact(tmp_path_factory) -> Path:
    from ninfer_compiler.convert.synth import synthesize, text_config

    cfg = {**text_config("qwen3.6-27b", layers=4), **CONFIG}
    art = tmp_path_factory.mktemp("fused") / "model.ninfer"
    synthesize(art, "qwen3.6-27b", "groupwise-int", config=cfg, seed=1)
    return art


def _export(artifact: Path, reference: bool = False):  # noqa: ANN202 (an IRModule)
    import contextlib

    from ninfer_compiler.build import export_module
    from ninfer_compiler.codegen.targets import tvm_target
    from ninfer_compiler.frontend.options import ModelOptions
    from ninfer_compiler.frontend.qwen3_5 import binding
    from ninfer_compiler.frontend.qwen3_5.model import Qwen35ForCausalLM
    from ninfer_compiler.ops.common import reference_kernels
    from ninfer_runtime import targets
    from ninfer_runtime.artifact import Artifact

    target = targets.load("h200")
    with Artifact(artifact) as art:
        cfg, plan = binding.model_config(art), binding.weight_plan(art, target)
    model = Qwen35ForCausalLM(cfg, ModelOptions(dtype="bfloat16", weights=plan))
    with tvm_target(target), reference_kernels() if reference else contextlib.nullcontext():
        mod, _ = export_module(model, model.upper_bounds(max_prefill_tokens=128, max_batch=8))
    return mod


@pytest.fixture(scope="module")
def tuned(mid_artifact):  # noqa: ANN201 (an IRModule)
    require_tool("nvcc", "the CUDA toolkit builds device code")
    return _export(mid_artifact)


@pytest.fixture(scope="module")
def reference(mid_artifact):  # noqa: ANN201 (an IRModule)
    return _export(mid_artifact, reference=True)


def test_prefill_fuses_swiglu_residual_adds_and_narrow_gdn_inputs(tuned, reference):
    mod = tuned
    calls = _extern_calls(mod["prefill"].script())
    # one SwiGLU GEMM per layer; residual adds: 4 down projections + 3 GDN and 1 attention output
    assert calls.count("ninfer_qgemm_q4_512x256_swiglu") == 4
    assert calls.count("ninfer_qgemm_q5_256x512_add") == 4
    assert calls.count("ninfer_qgemm_q5_256x768_add") == 3 and calls.count("ninfer_qgemm_q5_256x1024_add") == 1
    prefill = mod["prefill"].script()
    assert "silu" not in prefill and "R.add(" not in prefill
    # the chunked GDN kernels get fp16 q, k from the L2 norms and v in bf16 (no fp32 copies)
    assert calls.count("ninfer_gdn_chunked_prep_hk2_hv6_dk128_dv128_fp16_bf16") == 3
    ref = reference["prefill"].script()
    assert "ninfer_" not in ref and "silu" in ref


def test_decode_fuses_projections_norms_and_epilogues(tuned, reference):
    """Decode runs the v4 launcher's fused forms: each layer's grouped-int projections on one input
    in one multi call writing their slices (no concatenation), SwiGLU and the residual adds in the
    GEMV epilogues, the RMS norms in the GEMVs' PDL chain; no elementwise kernel is left for them."""
    decode = tuned["decode"].script()
    calls = _extern_calls(decode)
    # 4 layers: one multi call each (GDN q, k, v | z; attention q | gate | k | v) on the input
    # norm's int8 activations, the bf16 GDN gates a, b computed by the GDN step kernel itself (no
    # dense launch); SwiGLU per layer; residual adds of the 4 mixers and 4 MLPs
    assert calls.count("ninfer_qgemv_multi_i8") == 4 and "ninfer_qgemv_multi" not in calls
    assert decode.count('"ninfer_gdn_decode_2_6_128_128_g256_xq"') == 3
    assert "ninfer_dense_gemv" not in calls and "ninfer_dense_gemv_pair" not in calls
    # every norm but the final one also writes int8 activations, which the q4 SwiGLUs and the
    # mixers' multi calls read (<= 4 rows); so do the GDN step and the attention combine for the
    # mixers' output projections, and a quantize kernel for the down projection (at one row)
    assert calls.count("ninfer_qgemv_swiglu_i8") == 4 and "ninfer_qgemv_add" not in calls
    assert decode.count('"ninfer_xq_quantize_k512_r1"') == 4
    assert calls.count("ninfer_rms_norm_xq") == 8 and "ninfer_qgemv_swiglu" not in calls
    assert calls.count("ninfer_qgemv_add_i8") == 4 and calls.count("ninfer_qgemv_add_i8h") == 4
    assert calls.count("ninfer_rms_norm") == 1  # the final norm
    assert calls.count("ninfer_qgemv") == 1  # the output head
    assert "silu" not in decode and "R.add(" not in decode and "R.concat" not in decode
    assert "rms_norm" not in decode.replace("ninfer_rms_norm", "")
    ref = reference["decode"].script()
    assert "ninfer_" not in ref and "silu" in ref


def _folded(mod):  # noqa: ANN001, ANN202 (IRModules)
    from ninfer_compiler.codegen.targets import tvm_target
    from ninfer_compiler.passes.add_norm import fold_add_norms
    from ninfer_runtime import targets

    with tvm_target(targets.load("h200")):
        return fold_add_norms(mod)


# the residual adds that read bf16 activations (the fold's form; the int8-input ones are not folded)
BF16_ADDS = "-gemv_int8_mlp,-gemv_int8_attn_out,-gemv_int8_gdn_out"


def test_decode_folds_norms_into_residual_adds(mid_artifact, monkeypatch):
    """passes/add_norm.py: every decode norm whose input a residual-add GEMV writes becomes part of
    that call (`ninfer_qgemv_add_norm[_xq]`, outputs y, the norm and its int8 activations), and the
    consumers read the fused call's outputs; only the first layer's input norm (after the embedding)
    stays a kernel. The module stays well formed and prefill is untouched. (With the residual adds
    on bf16 input, `BF16_ADDS`: the fold does not take the int8-input forms.)"""
    require_tool("nvcc", "the CUDA toolkit builds device code")
    monkeypatch.setenv("NINFER_KERNELS", BF16_ADDS)
    import tvm

    mod = _export(mid_artifact)
    before = {name: mod[name].script() for name in ("decode", "prefill")}
    mod, count = _folded(mod)
    assert count == 8  # 4 post-attention norms, 3 input norms, the final norm
    tvm.relax.analysis.well_formed(mod)
    decode = mod["decode"].script()
    calls = _extern_calls(decode)
    # the norms with int8 activations (4 post-attention, 3 input norms) and the final norm
    assert calls.count("ninfer_qgemv_add_norm_xq") == 7 and calls.count("ninfer_qgemv_add_norm") == 1
    assert "ninfer_qgemv_add" not in calls and calls.count("ninfer_rms_norm_xq") == 1
    assert "ninfer_rms_norm" not in calls and calls.count("ninfer_qgemv_swiglu_i8") == 4
    # each fused call's norm output feeds what the norm fed: the SwiGLU or the mixer's multi call
    # reads outputs 1 and 2 of one call
    fused = re.findall(r'(\w+) = R\.call_dps_packed\("ninfer_qgemv_add_norm_xq"', decode)
    for var in fused:
        n = re.search(rf"(\w+): R\.Tensor\(\(b, 1, 256\), dtype=\"bfloat16\"\) = {var}\[1\]", decode).group(1)
        q = re.search(rf"(\w+): R\.Tensor\(\(\d+,\), dtype=\"uint8\"\) = {var}\[2\]", decode).group(1)
        assert re.search(rf'"ninfer_qgemv_(swiglu|multi)_i8", \({n}, {q}, ', decode), var
    assert mod["prefill"].script() == before["prefill"]


def test_pipeline_folds_norms_only_when_opted_in(mid_artifact, monkeypatch):
    """The pipeline's form of the fold is the opt-in kernel feature "gemv_add_norm" (measured slower)."""
    require_tool("nvcc", "the CUDA toolkit builds device code")
    from ninfer_compiler.codegen.targets import tvm_target
    from ninfer_compiler.passes.add_norm import fold_add_norms_pass
    from ninfer_runtime import targets

    monkeypatch.setenv("NINFER_KERNELS", BF16_ADDS)
    mod = _export(mid_artifact)
    with tvm_target(targets.load("h200")):
        assert "ninfer_qgemv_add_norm" not in fold_add_norms_pass(mod)["decode"].script()
        monkeypatch.setenv("NINFER_KERNELS", "+gemv_add_norm")
        calls = _extern_calls(fold_add_norms_pass(mod)["decode"].script())
        assert calls.count("ninfer_qgemv_add_norm") + calls.count("ninfer_qgemv_add_norm_xq") == 8


def test_decode_folds_norms_into_int8_launches(mid_artifact, monkeypatch):
    """passes/norm_prologue.py: every decode norm whose int8 activations one launch reads (the input
    norms' multi calls, the post-attention norms' SwiGLUs) becomes one call with it at the norm's
    place (`ninfer_qgemv_norm_multi_i8` / `_norm_swiglu_i8x`: outputs the norm, its int8 activations,
    then the launch's), taking the norm's input and parameters and the launch's weights; what read
    the norm's output (the GDN step's gates, the attention) reads output 0. The final norm stays a
    kernel, the module stays well formed, prefill is untouched; the pipeline runs it only under the
    kernel feature "gemv_norm_prologue"."""
    require_tool("nvcc", "the CUDA toolkit builds device code")
    import tvm

    from ninfer_compiler.codegen.targets import tvm_target
    from ninfer_compiler.passes.norm_prologue import fold_norm_prologues, fold_norm_prologues_pass
    from ninfer_runtime import targets

    monkeypatch.setenv("NINFER_KERNELS", "-gemv_int8_mlp_kernel")  # (the SwiGLU's own handover, which it folds)
    mod = _export(mid_artifact)
    before = {name: mod[name].script() for name in ("decode", "prefill")}
    with tvm_target(targets.load("h200")):
        assert fold_norm_prologues_pass(mod)["decode"].script() == before["decode"]  # (off by default)
        folded, count = fold_norm_prologues(mod)
        monkeypatch.setenv("NINFER_KERNELS", "+gemv_norm_prologue,-gemv_int8_mlp_kernel")
        assert fold_norm_prologues_pass(mod)["decode"].script() == folded["decode"].script()
    assert count == 8
    tvm.relax.analysis.well_formed(folded)
    decode = folded["decode"].script()
    calls = _extern_calls(decode)
    assert calls.count("ninfer_qgemv_norm_multi_i8") == 4 and calls.count("ninfer_qgemv_norm_swiglu_i8x") == 4
    assert "ninfer_rms_norm_xq" not in calls and calls.count("ninfer_rms_norm") == 1  # the final norm
    assert "ninfer_qgemv_multi_i8" not in calls and "ninfer_qgemv_swiglu_i8x" not in calls
    assert calls.count("ninfer_qgemv_add_i8h") == 4  # the down projections read the SwiGLU's int8 output
    for symbol, norms in (("ninfer_qgemv_norm_multi_i8", 4), ("ninfer_qgemv_norm_swiglu_i8x", 4)):
        found = re.findall(rf'(\w+) = R\.call_dps_packed\("{symbol}", \((\w+), (\w+), T\.float64', decode)
        assert len(found) == norms
        for var, x, w in found:
            # the norm's input: the embedding or a residual-add projection (the residual stream)
            assert re.search(rf'{x}(: [^=]*)? = R\.call_(tir\(dequant_embedding|dps_packed\("ninfer_qgemv_add_i8)', decode), (var, x)
            assert re.search(rf"{w}: R\.Tensor\(\(256,\)", decode), (var, w)  # the norm's weight
    # the GDN steps read the input norms' output (their gate projections): output 0 of a fused call
    multis = re.findall(r'(\w+) = R\.call_dps_packed\("ninfer_qgemv_norm_multi_i8"', decode)
    outs0 = {re.search(rf"(\w+): R\.Tensor\(\(b, 1, 256\), dtype=\"bfloat16\"\) = {v}\[0\]", decode).group(1)
             for v in multis}
    gdn_reads = re.findall(r'R\.call_inplace_packed\("ninfer_gdn_decode\w*", ([^=]*)inplace_indices', decode)
    assert len(gdn_reads) == 3 and all(any(o in args.split(", ") for o in outs0) for args in gdn_reads)
    assert folded["prefill"].script() == before["prefill"]


def test_decode_mlp_on_int8_activations(mid_artifact, monkeypatch):
    """With the kernel feature "gemv_int8_mlp" (on by default) the q4 SwiGLUs' output reaches the q5
    down projections as int8 activations too (`ninfer_qgemv_add_i8h`, which reads them at the
    handover rows): quantized by a kernel of its own under "gemv_int8_mlp_kernel" (on by default:
    `ninfer_qgemv_swiglu_i8` writes bf16, `ninfer_xq_quantize_k512_r1` quantizes it in place on a
    fresh buffer, the down projection reads both), else by the SwiGLU itself (`..._swiglu_i8x`);
    without "gemv_int8_mlp" the SwiGLU writes bf16 only and the down projection reads that."""
    require_tool("nvcc", "the CUDA toolkit builds device code")
    decode = _export(mid_artifact)["decode"].script()
    calls = _extern_calls(decode)
    assert calls.count("ninfer_qgemv_swiglu_i8") == 4 and "ninfer_qgemv_swiglu_i8x" not in calls
    assert calls.count("ninfer_qgemv_add_i8h") == 4 and calls.count("ninfer_rms_norm_xq") == 8
    swiglus = re.findall(r'(\w+) = R\.call_dps_packed\("ninfer_qgemv_swiglu_i8"', decode)
    quants = re.findall(r'(\w+): R\.Tensor\(\(\d+,\), dtype="uint8"\) = '
                        r'R\.call_inplace_packed\("ninfer_xq_quantize_k512_r1", (\w+), ', decode)
    assert len(swiglus) == len(quants) == 4 and [y for _, y in quants] == swiglus
    for q, y in quants:
        assert re.search(rf'"ninfer_qgemv_add_i8h", \({y}, {q}, ', decode), (q, y)
    monkeypatch.setenv("NINFER_KERNELS", "-gemv_int8_mlp_kernel")
    calls = _extern_calls(_export(mid_artifact)["decode"].script())
    assert calls.count("ninfer_qgemv_swiglu_i8x") == 4 and calls.count("ninfer_qgemv_add_i8h") == 4
    assert "ninfer_qgemv_swiglu_i8" not in calls and "ninfer_xq_quantize" not in " ".join(calls)
    monkeypatch.setenv("NINFER_KERNELS", "-gemv_int8_mlp")
    calls = _extern_calls(_export(mid_artifact)["decode"].script())
    assert calls.count("ninfer_qgemv_swiglu_i8") == 4 and calls.count("ninfer_qgemv_add") == 4
    assert "ninfer_qgemv_swiglu_i8x" not in calls and "ninfer_qgemv_add_i8h" not in calls


def test_decode_mixers_on_int8_activations(mid_artifact, monkeypatch):
    """With the kernel feature "gemv_int8_multi" (on by default) every input norm also writes its
    output as int8 activations and the mixer's multi call reads them (`ninfer_qgemv_multi_i8`, x and
    xq from the same norm call); without it the input norms and multi calls are the bf16 forms."""
    require_tool("nvcc", "the CUDA toolkit builds device code")
    monkeypatch.setenv("NINFER_KERNELS", "-gemv_int8_multi")
    calls = _extern_calls(_export(mid_artifact)["decode"].script())
    assert calls.count("ninfer_qgemv_multi") == 4 and "ninfer_qgemv_multi_i8" not in calls
    assert calls.count("ninfer_rms_norm_xq") == 4 and calls.count("ninfer_rms_norm") == 5
    monkeypatch.delenv("NINFER_KERNELS")
    decode = _export(mid_artifact)["decode"].script()
    calls = _extern_calls(decode)
    assert calls.count("ninfer_qgemv_multi_i8") == 4 and "ninfer_qgemv_multi" not in calls
    assert calls.count("ninfer_rms_norm_xq") == 8 and calls.count("ninfer_rms_norm") == 1  # the final norm
    assert calls.count("ninfer_qgemv_swiglu_i8") == 4  # the MLP as by default
    for var in re.findall(r'(\w+) = R\.call_dps_packed\("ninfer_rms_norm_xq"', decode):
        n = re.search(rf"(\w+): R\.Tensor\(\(b, 1, 256\), dtype=\"bfloat16\"\) = {var}\[0\]", decode).group(1)
        q = re.search(rf"(\w+): R\.Tensor\(\(\d+,\), dtype=\"uint8\"\) = {var}\[1\]", decode).group(1)
        assert re.search(rf'"ninfer_qgemv_(multi|swiglu)_i8x?", \({n}, {q}, ', decode), var


def _extern_calls(script: str) -> list[str]:
    """The packed functions a Relax function calls, once per call site."""
    import re

    return re.findall(r'R\.call_dps_packed\("([A-Za-z0-9_]+)"', script)


def test_decode_gdn_output_on_int8_activations(mid_artifact, monkeypatch):
    """With the kernel feature "gemv_int8_gdn_out" (on by default) the fused GDN step also writes its
    output as int8 activations (`ninfer_gdn_decode_..._xq`) and the GDN layers' output projections
    read them (`ninfer_qgemv_add_i8`, x and xq from the same step call); attention's output
    projection and the MLP's down projection stay bf16. Without it, the step and projections are bf16."""
    require_tool("nvcc", "the CUDA toolkit builds device code")
    monkeypatch.setenv("NINFER_KERNELS", "-gemv_int8_gdn_out")
    calls = _extern_calls(_export(mid_artifact)["decode"].script())
    assert calls.count("ninfer_qgemv_add_i8") == 1 and calls.count("ninfer_qgemv_add") == 3  # 1: attention
    monkeypatch.delenv("NINFER_KERNELS")
    decode = _export(mid_artifact)["decode"].script()
    calls = _extern_calls(decode)
    steps = re.findall(r'(\w+): R\.Tuple\(.*?\) = R\.call_inplace_packed\("(ninfer_gdn_decode_\w+)"', decode)
    assert len(steps) == 3 and all(name.endswith("_xq") for _, name in steps)
    assert calls.count("ninfer_qgemv_add_i8") == 4 and "ninfer_qgemv_add" not in calls  # 3 + attention
    for var, _ in steps:
        o = re.search(rf"(\w+): R\.Tensor\(\(b, 1, \d+\), dtype=\"bfloat16\"\) = {var}\[0\]", decode).group(1)
        q = re.search(rf"(\w+): R\.Tensor\(\(\d+,\), dtype=\"uint8\"\) = {var}\[1\]", decode).group(1)
        assert re.search(rf'"ninfer_qgemv_add_i8", \({o}, {q}, ', decode), var


def test_decode_attention_output_on_int8_activations(mid_artifact, monkeypatch):
    """With the kernel feature "gemv_int8_attn_out" (on by default) the gated attention combine also
    writes its output as int8 activations (`..._gated_xq`, a DPS call with two outputs) and the
    attention layer's output projection reads them (`ninfer_qgemv_add_i8`, x and xq from the same
    combine call); without it the combine writes bf16 only."""
    require_tool("nvcc", "the CUDA toolkit builds device code")
    monkeypatch.setenv("NINFER_KERNELS", "-gemv_int8_attn_out")
    calls = _extern_calls(_export(mid_artifact)["decode"].script())
    assert [c for c in calls if "combine" in c][0].endswith("_gated") and calls.count("ninfer_qgemv_add") == 1
    monkeypatch.delenv("NINFER_KERNELS")
    decode = _export(mid_artifact)["decode"].script()
    calls = _extern_calls(decode)
    combines = [c for c in calls if "combine" in c]
    assert len(combines) == 1 and combines[0].endswith("_gated_xq"), combines
    assert calls.count("ninfer_qgemv_add_i8") == 4 and "ninfer_qgemv_add" not in calls
    var = re.search(r'(\w+) = R\.call_dps_packed\("' + combines[0] + '"', decode).group(1)
    o = re.search(rf"(\w+): R\.Tensor\(\(b, 1, \d+\), dtype=\"bfloat16\"\) = {var}\[0\]", decode).group(1)
    q = re.search(rf"(\w+): R\.Tensor\(\(\d+,\), dtype=\"uint8\"\) = {var}\[1\]", decode).group(1)
    assert re.search(rf'"ninfer_qgemv_add_i8", \({o}, {q}, ', decode)

