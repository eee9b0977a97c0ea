"""Our decode GEMV (`ops/qgemv.py`) inside groupwise-int packages for h200/rtx5090/dgx-spark.

Structural only (numerics and speed: tests/gpu/check_qgemv.py on the H200): the library still
passes the AOT check (SASS for exactly the target's arch, no PTX, no CUDA source, host code for
the target's CPU), one of its fatbins holds our kernels, and the launcher symbol is linked in.
A bf16 package has no grouped-int weight, so it must not carry the kernel (checked on the bf16
packages of test_packages.py). The calls sit inside decode's CUDA-graph capture region (one graph
per step) and prefill does not use the kernel.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ninfer_compiler.codegen.fatbin import extract_fatbins, inspect_library
from ninfer_compiler.compile import CompileOptions, compile_artifact

from .conftest import require_tool

TARGETS = {"h200": ("sm_90a", "x86_64"), "rtx5090": ("sm_120a", "x86_64"), "dgx-spark": ("sm_121a", "aarch64")}
OPTIONS = {"max_context": 1024, "prefill_chunk": 128, "max_batch": 8}
KERNEL = b"ninfer_qgemv_q4_b1_bf16"


@pytest.fixture(scope="module")
def int_artifact(tmp_path_factory) -> Path:
    from ninfer_compiler.convert.driver import convert
    from ninfer_compiler.testmodel.factory import cached_hf_model

    art = tmp_path_factory.mktemp("qgemv") / "model.ninfer"
    convert(cached_hf_model("qwen3_5"), art, "groupwise-int")
    return art


@pytest.mark.parametrize("name", list(TARGETS))
def test_package_carries_qgemv_sass_only(int_artifact, tmp_path, name):
    require_tool("nvcc", "the CUDA toolkit builds device code")
    require_tool("aarch64-linux-gnu-g++", "links the DGX Spark's host code")
    arch, host = TARGETS[name]
    compile_artifact(int_artifact, tmp_path / name, CompileOptions(target=name, **OPTIONS))
    lib = tmp_path / name / "model.so"
    code = inspect_library(lib)
    assert code.problems(arch) == []
    assert code.sass_archs == {arch} and not code.ptx_archs and not code.has_cuda_source
    assert code.host_machine == host
    assert any(KERNEL in fb for fb in extract_fatbins(lib)), "our GEMV's SASS is not in the library"
    assert b"ninfer_qgemv" in lib.read_bytes()


def test_decode_graph_captures_qgemv(int_artifact):
    """The GEMV launches are inside decode's CUDA-graph capture region, not split around it."""
    import tvm

    from ninfer_compiler.build import export_module
    from ninfer_compiler.codegen.graphs import add_graph_variants
    from ninfer_compiler.codegen.targets import tvm_target
    from ninfer_compiler.codegen.toolchain import cuda_build
    from ninfer_compiler.frontend.options import ModelOptions
    from ninfer_compiler.frontend.qwen3_5 import binding
    from ninfer_compiler.frontend.qwen3_5.model import Qwen35ForCausalLM
    from ninfer_compiler.passes.pipeline import relax_pipeline
    from ninfer_runtime import targets
    from ninfer_runtime.artifact import Artifact

    require_tool("nvcc", "the CUDA toolkit builds device code")
    target = targets.load("h200")
    ttarget = tvm_target(target)
    with Artifact(int_artifact) as art:
        cfg, plan = binding.model_config(art), binding.weight_plan(art, target)
    model = Qwen35ForCausalLM(cfg, ModelOptions(dtype="bfloat16", weights=plan))
    with ttarget:
        mod, _ = export_module(model, model.upper_bounds(max_prefill_tokens=128, max_batch=8))
    mod = add_graph_variants(mod)
    with cuda_build(ttarget), tvm.transform.PassContext(config={"relax.backend.use_cuda_graph": True}):
        mod = relax_pipeline(ttarget)(mod)
    captured = mod["decode_graph_cuda_graph_capture"].script().count("ninfer_qgemv")
    assert captured > 0
    assert "ninfer_qgemv" not in mod["decode_graph"].script()
    assert "ninfer_qgemv" in mod["decode"].script()  # eager decode uses it too
    assert "ninfer_qgemv" not in mod["prefill"].script()
