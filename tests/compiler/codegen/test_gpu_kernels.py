"""Our GPU kernels, checked on the CPU: selected by target kind, thread-bound, and correct.

Each GPU kernel is written as phases of `for tx in thread_loop(...)` over shared buffers
(`ops.common.thread_loop`); TVM places the barriers between phases. With `serial_gpu_kernels()`
the same kernels are emitted with serial loops, which compute exactly what the GPU does, so
the op tests' numpy references check their arithmetic here. Thread binding and barrier
placement are checked on the compiled CUDA source.
"""

from __future__ import annotations

import contextlib

import pytest
import tvm

from ninfer_compiler.codegen.targets import tvm_target
from ninfer_compiler.ops.common import kernel_flavor, serial_gpu_kernels
from ninfer_runtime import targets
from tests.compiler.ops import test_conv1d, test_gated_delta_rule, test_paged_attention


def test_flavor_follows_the_target():
    assert kernel_flavor() == "cpu"
    with tvm_target(targets.load("h200")):
        assert kernel_flavor() == "gpu"
    with serial_gpu_kernels():
        assert kernel_flavor() == "gpu-serial"
    assert kernel_flavor() == "cpu"


def test_attention_serial_form(op_compiler):
    with serial_gpu_kernels():
        test_paged_attention.test_append_then_attend_matches_dense(op_compiler)


@pytest.mark.parametrize("chunked", [True, False])
def test_gated_delta_rule_serial_form(op_compiler, chunked):
    with serial_gpu_kernels():
        test_gated_delta_rule.test_gdn_matches_recurrence(op_compiler, chunked)


def test_conv1d_serial_form(op_compiler):
    with serial_gpu_kernels():
        test_conv1d.test_conv_carries_history_across_calls(op_compiler)


def test_cuda_export_binds_threads():
    """Under a CUDA target every custom kernel is the `_gpu` variant, marked scheduled."""
    from ninfer_compiler.build import export_module
    from ninfer_compiler.frontend.options import ModelOptions
    from ninfer_compiler.frontend.qwen3_5.config import Qwen35TextConfig
    from ninfer_compiler.frontend.qwen3_5.model import Qwen35ForCausalLM
    from ninfer_compiler.ops.common import reference_kernels
    from tests.compiler.test_build import TEXT

    model = Qwen35ForCausalLM(Qwen35TextConfig.from_dict(TEXT), ModelOptions(dtype="bfloat16"))
    # tuned kernels on: the KV append is part of the attention prologue and the greedy choice runs
    # in Triton (externs); the reference kernels have TIR forms of both
    expected = {False: ["causal_conv1d_gpu", "gdn_chunked_gpu", "gdn_recurrent_gpu", "paged_attention_gpu"],
                True: ["causal_conv1d_gpu", "gdn_chunked_gpu", "gdn_recurrent_gpu", "greedy_gpu", "kv_append_gpu",
                       "paged_attention_gpu"]}
    for reference in (False, True):
        with tvm_target(targets.load("h200")), reference_kernels() if reference else contextlib.nullcontext():
            mod, _ = export_module(model)
        custom = {gv.name_hint: f for gv, f in mod.functions.items()
                  if isinstance(f, tvm.tirx.PrimFunc) and f.attrs and "tirx.is_scheduled" in f.attrs}
        assert sorted(custom) == expected[reference]
        for name, func in custom.items():
            assert "threadIdx.x" in func.script() and "blockIdx.x" in func.script(), name
