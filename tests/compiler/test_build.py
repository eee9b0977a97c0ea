"""Pipeline order, export attributes, and the compiled library's round trip through a file."""

from __future__ import annotations

import pytest

tvm = pytest.importorskip("tvm")

from ninfer_compiler.build import export_module  # noqa: E402
from ninfer_compiler.frontend.qwen3_5.config import Qwen35TextConfig  # noqa: E402
from ninfer_compiler.frontend.qwen3_5.model import Qwen35ForCausalLM  # noqa: E402
from ninfer_compiler.passes.pipeline import relax_passes  # noqa: E402

TEXT = {
    "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
    "layer_types": ["linear_attention", "full_attention"], "num_attention_heads": 2,
    "num_key_value_heads": 1, "head_dim": 16, "linear_num_key_heads": 1,
    "linear_num_value_heads": 2, "linear_key_head_dim": 8, "linear_value_head_dim": 8,
    "linear_conv_kernel_dim": 4, "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_theta": 1e4, "partial_rotary_factor": 0.5, "mrope_section": [2, 1, 1]},
}  # fmt: skip


def test_pipeline_fuses_and_transposes_before_legalize():
    names = [p.info.name for p in relax_passes(tvm.target.Target("llvm"))]
    assert names.index("FuseTransposeMatmul") < names.index("LegalizeOps")
    assert names.index("LegalizeOps") < names.index("FuseOps") < names.index("FuseTIR")
    assert names.index("FuseTIR") < names.index("StaticPlanBlockMemory")


def test_export_sets_bounds_and_entry_signatures():
    model = Qwen35ForCausalLM(Qwen35TextConfig.from_dict(TEXT))
    mod, params = export_module(model, {"prefill": {"n": 512}, "decode": {"b": 8}})
    assert mod["prefill"].attrs["tir_var_upper_bound"]["n"] == 512
    assert mod["decode"].attrs["tir_var_upper_bound"]["b"] == 8
    decode_args = [p.name for p in mod["decode"].params]
    assert decode_args == ["input_ids", "positions", "page_table", "seq_lens", "slot_ids",
                           "kv_pool", "gdn_state", "conv_state", "packed_params"]  # fmt: skip
    assert params[0].name == "token_embedding.weight"
