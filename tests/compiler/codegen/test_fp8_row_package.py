"""fp8-row weights in h200 exports and packages (structural; no GPU needed).

The tiny model converted with the fp8-row test recipe (`convert_fp8_row`: embedding, head and every
projection fp8-row except layer 0's MLP) is exported for h200. With the tuned fp8 kernels (the
default), decode's CUDA graph holds the tensor-core GEMV (projections with K % 128 == 0) and the
Triton GEMV (K = 64, 192), prefill the Triton GEMM; switched off (NINFER_KERNELS), both keep the
reference TE ops and the package builds with them. Numerics on the cpu target: tests/compiler/test_qwen3_5_weight_formats.py;
on the GPU: tests/gpu/check_fp8_row.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import require_tool

OPTIONS = {"max_context": 1024, "prefill_chunk": 128, "max_batch": 8}


@pytest.fixture(scope="module")
def fp8_artifact(tmp_path_factory) -> Path:
    from ..test_qwen3_5_weight_formats import convert_fp8_row

    return convert_fp8_row(tmp_path_factory.mktemp("fp8-row") / "model.ninfer")


def _features(monkeypatch, on: bool) -> None:
    from ninfer_compiler.ops import fp8_row

    sign = "+" if on else "-"
    monkeypatch.setenv("NINFER_KERNELS", f"{sign}{fp8_row.TRITON_FEATURE},{sign}{fp8_row.TC_FEATURE}")


def _lowered(art: Path):
    """The h200 module after the Relax pipeline with decode's CUDA graph variant."""
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

    target = targets.load("h200")
    ttarget = tvm_target(target)
    with Artifact(art) as a:
        cfg, plan = binding.model_config(a), binding.weight_plan(a, target)
    assert plan.format_of("layers.1.gdn.key") == "fp8_e4m3fn_row_bf16"
    model = Qwen35ForCausalLM(cfg, ModelOptions(dtype="bfloat16", weights=plan))
    with ttarget:
        mod, _ = export_module(model, model.upper_bounds(max_prefill_tokens=128, max_batch=8))
    mod = add_graph_variants(mod)
    with cuda_build(ttarget), tvm.transform.PassContext(config={"relax.backend.use_cuda_graph": True}):
        return relax_pipeline(ttarget)(mod)


def test_decode_graph_holds_the_fp8_kernels(fp8_artifact, monkeypatch):
    require_tool("nvcc", "the CUDA toolkit builds device code")
    from ninfer_compiler.ops import fp8_row

    _features(monkeypatch, True)
    mod = _lowered(fp8_artifact)
    captured = mod["decode_graph_cuda_graph_capture"].script()
    prefill = mod["prefill"].script()
    assert fp8_row.TC_SYMBOL in captured  # mlp.down (K 128), attention.output (K 256)
    assert fp8_row.GEMV_SYMBOL in captured  # K = 64 projections and the head, gdn.output (K 192)
    assert fp8_row.GEMM_SYMBOL in prefill and fp8_row.GEMM_SYMBOL not in captured
    assert "fp8_row_matmul" not in captured and "fp8_row_matmul" not in prefill  # no TE fallback left
    assert "fp8_row_embedding" in captured and "fp8_row_embedding" in prefill  # the gather stays TE


def test_reference_fp8_ops_when_switched_off(fp8_artifact, monkeypatch):
    require_tool("nvcc", "the CUDA toolkit builds device code")
    _features(monkeypatch, False)
    mod = _lowered(fp8_artifact)
    for fn in ("decode_graph_cuda_graph_capture", "prefill"):
        assert "ninfer_fp8_row" not in mod[fn].script()


@pytest.mark.parametrize("tuned", [True, False], ids=["tuned-kernels", "te-ops"])
def test_h200_package_builds(fp8_artifact, tmp_path, monkeypatch, tuned):
    """The whole package: SASS for sm_90a only; with the tuned fp8 kernels (the default) their images
    and launchers inside and recorded in the manifest, switched off none of them (the TE ops)."""
    require_tool("nvcc", "the CUDA toolkit builds device code")
    from ninfer_compiler.codegen.fatbin import extract_fatbins, inspect_library
    from ninfer_compiler.compile import CompileOptions, compile_artifact
    from ninfer_compiler.ops import fp8_row

    _features(monkeypatch, tuned)
    compile_artifact(fp8_artifact, tmp_path / "pkg", CompileOptions(target="h200", **OPTIONS))
    lib = tmp_path / "pkg" / "model.so"
    code = inspect_library(lib)
    assert code.problems("sm_90a") == []
    assert code.sass_archs == {"sm_90a"} and not code.ptx_archs and not code.has_cuda_source
    fatbins = extract_fatbins(lib)
    data = lib.read_bytes()
    for kernel in (b"fp8_row_gemm_kernel", b"fp8_row_gemv_kernel", b"ninfer_fp8_row_gemv_ybf16"):
        assert any(kernel in fb for fb in fatbins) == tuned, kernel.decode()
    for symbol in (fp8_row.GEMM_SYMBOL, fp8_row.GEMV_SYMBOL, fp8_row.TC_SYMBOL):
        assert (symbol.encode() in data) == tuned, symbol
    manifest = json.loads((tmp_path / "pkg" / "manifest.json").read_text())
    features = manifest["compile"]["kernel_features"]
    assert features[fp8_row.TRITON_FEATURE] == features[fp8_row.TC_FEATURE] == tuned
    planes = {p["plane"]: p["dtype"] for p in manifest["params"] if p["binding"] == "text/output_head"}
    assert planes == {"codes": "uint8", "row_scales": "bfloat16"}
