"""The Triton dense GEMM for many tokens (`ops/dense_triton.py`): numerics in Triton's
interpreter against numpy, and an h200 library that carries it (SASS only)."""

from __future__ import annotations

import numpy as np
import pytest

from ..codegen.conftest import require_tool
from ..conftest import _op_module

torch = pytest.importorskip("torch")
pytest.importorskip("triton")


@pytest.mark.parametrize("m,n,k,block_m,block_k", [(1, 48, 64, 16, 64), (70, 48, 192, 16, 128),
                                                   (130, 100, 128, 64, 64), (33, 48, 200, 32, 64)])
def test_interpreter_matches_numpy(m, n, k, block_m, block_k):
    from ninfer_compiler.ops.dense_triton import BLOCK_N, dense_nt_kernel
    from ninfer_compiler.ops.triton_aot import interpreted

    rng = np.random.default_rng(m + n + k)
    x = torch.tensor(rng.standard_normal((m, k)), dtype=torch.bfloat16)
    w = torch.tensor(rng.standard_normal((n, k)) * 0.05, dtype=torch.bfloat16)
    y = torch.full((m, n), float("nan"), dtype=torch.float32)  # fp32 out: exact check of the sum
    grid = (-(-m // block_m), -(-n // BLOCK_N))
    interpreted(dense_nt_kernel)[grid](x, w, y, m, N=n, K=k, BLOCK_M=block_m, BLOCK_N=BLOCK_N, BLOCK_K=block_k)
    ref = x.double().numpy() @ w.double().numpy().T
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_120a"])
def test_images_fit_the_arch(arch):
    from ninfer_compiler.ops import dense_triton

    require_tool("nvcc", "the CUDA toolkit wraps cubins into fatbins")
    for cfg in dense_triton.configs(arch):
        img = dense_triton.image("bfloat16", arch, 48, 5120, cfg)
        assert img.name == f"ninfer_dense_nt_bf16_n48_k5120_t{cfg.block_m}x64k{cfg.block_k}"
        assert img.shared <= (227 if arch == "sm_90a" else 99) * 1024


def test_h200_library_carries_the_gemm(tmp_path):
    from ninfer_compiler.build import compile_module, export_module
    from ninfer_compiler.codegen.export import export_library
    from ninfer_compiler.codegen.fatbin import inspect_library
    from ninfer_compiler.codegen.targets import tvm_target
    from ninfer_compiler.codegen.toolchain import cuda_build
    from ninfer_compiler.ops import dense_triton
    from ninfer_runtime import targets

    require_tool("nvcc", "the CUDA toolkit builds device code")
    target = targets.load("h200")
    ttarget = tvm_target(target)

    def main(x, w):
        assert dense_triton.supported(x, w)
        return dense_triton.dense_nt(x, w)

    with ttarget:
        mod, _ = export_module(_op_module(main, {"x": ([1, "n", 256], "bfloat16"), "w": ([48, 256], "bfloat16")}), {})
    with cuda_build(ttarget):
        exe = compile_module(mod, ttarget)
    lib = export_library(exe, tmp_path / "model.so", target)
    code = inspect_library(lib)
    assert code.problems("sm_90a") == [] and code.sass_archs == {"sm_90a"}
    data = lib.read_bytes()
    assert b"ninfer_dense_nt_bf16_48x256" in data and b"ninfer_dense_nt_bf16_n48_k256_t32x64k128" in data
