"""Tuned decode kernels (fused GDN step, split-KV attention) inside a whole Qwen3.5 h200 export."""

from __future__ import annotations

from .conftest import require_tool


def _qwen35_h200(tiny_artifact):  # noqa: ANN202
    """The tiny Qwen3.5 model for the h200 target and its exported module (decode batches <= 8)."""
    from ninfer_compiler.build import export_module
    from ninfer_compiler.codegen.targets import tvm_target
    from ninfer_compiler.frontend.options import ModelOptions
    from ninfer_compiler.frontend.qwen3_5 import binding
    from ninfer_compiler.frontend.qwen3_5.model import Qwen35ForCausalLM
    from ninfer_runtime import targets
    from ninfer_runtime.artifact import Artifact

    require_tool("nvcc", "the CUDA toolkit builds device code")
    target = targets.load("h200")
    ttarget = tvm_target(target)
    with Artifact(tiny_artifact) as art:
        cfg, plan = binding.model_config(art), binding.weight_plan(art, target)
    model = Qwen35ForCausalLM(cfg, ModelOptions(dtype="bfloat16", weights=plan))
    with ttarget:
        mod, _ = export_module(model, model.upper_bounds(max_prefill_tokens=128, max_batch=8))
    return cfg, model, ttarget, mod


def test_model_decode_graph_captures_the_fused_step(tiny_artifact):
    """In a whole Qwen3.5 h200 export, decode's CUDA graph holds the fused GDN step, the decode
    convolution, the attention prologue and the split-KV attention with its gated combine, prefill
    uses only the prologue of them, and reference-kernel exports use none."""
    import tvm

    from ninfer_compiler.build import export_module
    from ninfer_compiler.codegen.graphs import add_graph_variants
    from ninfer_compiler.codegen.toolchain import cuda_build
    from ninfer_compiler.ops.common import reference_kernels
    from ninfer_compiler.passes.pipeline import relax_pipeline

    _, model, ttarget, mod = _qwen35_h200(tiny_artifact)
    mod = add_graph_variants(mod)
    with cuda_build(ttarget), tvm.transform.PassContext(config={"relax.backend.use_cuda_graph": True}):
        mod = relax_pipeline(ttarget)(mod)
    captured = mod["decode_graph_cuda_graph_capture"].script()
    assert captured.count("ninfer_gdn_decode") > 0
    assert "ninfer_attention_decode_split" in captured and "ninfer_attention_decode_combine" in captured
    assert "ninfer_gdn_decode" not in mod["prefill"].script()
    prefill = mod["prefill"].script()
    assert "ninfer_attention_decode" not in prefill
    assert "ninfer_gdn_chunked_prep" in prefill and "ninfer_gdn_chunked_state" in prefill
    assert "ninfer_attention_prefill" in prefill
    # q/k norms, MRoPE and the KV append run as one kernel in both, none of the unfused kernels remain
    assert "ninfer_attention_prologue" in captured and "ninfer_attention_prologue" in prefill
    assert "kv_append" not in captured and "mrope" not in captured and "mrope" not in prefill
    # the GDN short convolution and the attention output gate run in PDL-chained kernels, not TVM's
    assert "ninfer_conv1d_decode" in captured and "causal_conv1d" not in captured
    assert "ninfer_attention_decode_combine_" in captured and "_gated" in captured and "sigmoid" not in captured
    assert "causal_conv1d" in prefill and "ninfer_conv1d_decode" not in prefill
    # each row's greedy choice is made on the device, after the head
    assert "ninfer_greedy_choice" in mod["decode_graph"].script() and "ninfer_greedy" not in prefill
    with ttarget, reference_kernels():
        ref, _ = export_module(model, model.upper_bounds(max_prefill_tokens=128, max_batch=8))
    assert "ninfer_" not in ref.script()  # no extern kernel at all


def test_decode_graph_with_the_convolution_in_the_step(tiny_artifact, monkeypatch):
    """`gdn_step_conv`: decode's GDN layers launch no convolution kernel; the step reads the multi
    launch's row before the convolution, takes the layer's taps and threads the history it updates
    from call to call (prefill keeps its convolution)."""
    import re

    monkeypatch.setenv("NINFER_KERNELS", "+gdn_step_conv")
    cfg, _, _, mod = _qwen35_h200(tiny_artifact)
    decode = mod["decode"].script()
    assert "ninfer_conv1d_decode" not in decode and "causal_conv1d" not in decode
    calls = re.findall(r"(\w+): R\.Tuple\(.*?\) = R\.call_inplace_packed\(\"ninfer_gdn_decode_\w+_conv\w*\", "
                       r"(.*?), inplace_indices", decode)
    assert len(calls) == sum(kind == "linear_attention" for kind in cfg.layer_types) > 0
    for layer, (_, args) in enumerate(calls):
        assert f"layers_{layer}_gdn_convolution" in args
    for (previous, _), (_, args) in zip(calls[:-1], calls[1:], strict=True):
        # the history the call before returned (its last output) goes into this one
        history = re.search(rf"(\w+): R\.Tensor\(.*?\) = {previous}\[2\]", decode)
        assert history is not None and history.group(1) in args.split(", ")
    assert "causal_conv1d" in mod["prefill"].script()
