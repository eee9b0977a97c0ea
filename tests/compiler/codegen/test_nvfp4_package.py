"""nvfp4 weights in an h200 package: the Triton kernels of `ops/nvfp4.py` as SASS for sm_90a only.

Structural (numerics and speed: tests/gpu/check_nvfp4.py on the H200; the model's numerics on the
cpu target: tests/compiler/test_end_to_end.py). The tiny model's nvfp4 artifact binds GDN q/k/v/z
and MLP gate/up as nvfp4 (the other projections do not fit the 128-row tiling and stay q8).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ninfer_compiler.codegen.fatbin import extract_fatbins, inspect_library
from ninfer_compiler.compile import CompileOptions, compile_artifact

from .conftest import require_tool

OPTIONS = {"max_context": 1024, "prefill_chunk": 128, "max_batch": 8}


@pytest.fixture(scope="module")
def nvfp4_artifact(tmp_path_factory) -> Path:
    from ninfer_compiler.convert.driver import convert
    from ninfer_compiler.testmodel.factory import cached_hf_model

    art = tmp_path_factory.mktemp("nvfp4") / "model.ninfer"
    convert(cached_hf_model("qwen3_5"), art, "nvfp4")
    return art


def test_h200_package_carries_the_nvfp4_kernels(nvfp4_artifact, tmp_path):
    require_tool("nvcc", "the CUDA toolkit builds device code")
    compile_artifact(nvfp4_artifact, tmp_path / "pkg", CompileOptions(target="h200", **OPTIONS))
    lib = tmp_path / "pkg" / "model.so"
    code = inspect_library(lib)
    assert code.problems("sm_90a") == []
    assert code.sass_archs == {"sm_90a"} and not code.ptx_archs and not code.has_cuda_source
    fatbins = extract_fatbins(lib)
    for kernel in (b"nvfp4_gemm_kernel", b"nvfp4_gemv_kernel"):
        assert any(kernel in fb for fb in fatbins), f"{kernel.decode()} is not in the library"
    data = lib.read_bytes()
    assert b"ninfer_nvfp4_gemm" in data and b"ninfer_nvfp4_gemv" in data
