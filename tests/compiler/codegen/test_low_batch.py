"""Decode's matmuls take dlight's low-batch GEMV; prefill's keep `Matmul` (CPU only, no GPU)."""

from __future__ import annotations

import re

import tvm
from tvm import tirx

from ninfer_compiler.build import export_module
from ninfer_compiler.codegen.graphs import add_graph_variants
from ninfer_compiler.codegen.targets import tvm_target
from ninfer_compiler.frontend.options import ModelOptions, WeightPlan
from ninfer_compiler.frontend.qwen3_5.config import Qwen35TextConfig
from ninfer_compiler.frontend.qwen3_5.model import Qwen35ForCausalLM
from ninfer_compiler.passes.low_batch import low_batch_functions, schedule_low_batch
from ninfer_compiler.passes.pipeline import _fusion_passes
from ninfer_runtime import targets
from tests.compiler.test_build import TEXT


def _callers(mod: tvm.IRModule) -> dict[str, set[str]]:
    """PrimFunc name -> names of the Relax functions that call it."""
    out: dict[str, set[str]] = {}
    for gv, func in mod.functions.items():
        if isinstance(func, tvm.relax.Function):
            for name in set(re.findall(r"R\.call_tir\((?:cls\.)?(\w+),", func.script())):
                out.setdefault(name, set()).add(gv.name_hint)
    return out


def test_decode_matmuls_are_low_batch_gemvs():
    target = tvm_target(targets.load("h200"))
    plan = WeightPlan(default="q4_g64_fp16", overrides=(("token_embedding", "bfloat16"),))
    model = Qwen35ForCausalLM(Qwen35TextConfig.from_dict(TEXT), ModelOptions(dtype="bfloat16", weights=plan))
    with target:
        mod, _ = export_module(model, model.upper_bounds(max_prefill_tokens=64, max_batch=8))
        mod = tvm.transform.Sequential(_fusion_passes())(add_graph_variants(mod))
        chosen = {gv.name_hint for gv in low_batch_functions(mod)}
        scheduled = schedule_low_batch(mod)
    callers = _callers(mod)
    matmuls = {n for n in callers if "matmul" in n}
    decode_only = {n for n in matmuls if callers[n] <= {"decode", "decode_graph"}}
    assert decode_only, "the tiny model has decode matmuls"
    assert decode_only <= chosen
    assert not {n for n in chosen if callers[n] - {"decode", "decode_graph"}}, "prefill kernels stay with Matmul"
    for name in decode_only:  # including the output head, which decode no longer shares with prefill
        func = scheduled[name]
        assert isinstance(func, tirx.PrimFunc) and func.attrs.get("tirx.is_scheduled"), name
        assert "matmul_pad" in func.script(), name  # LowBatchGEMV pads the batch to its bucket
    for name in matmuls - decode_only:
        assert not scheduled[name].attrs.get("tirx.is_scheduled"), name
