"""The nvfp4 Triton kernels (`ops/nvfp4_triton.py`) in Triton's CPU interpreter against float64."""

from __future__ import annotations

import numpy as np
import pytest

from ninfer_runtime.artifact.codecs import E2M1_VALUES, E4M3FN_VALUES

from .test_nvfp4 import random_planes

torch = pytest.importorskip("torch")
pytest.importorskip("triton")


def reference(x: np.ndarray, codes: np.ndarray, scales: np.ndarray, divisor: np.float32) -> np.ndarray:
    w = E2M1_VALUES[codes].astype(np.float64) * np.repeat(E4M3FN_VALUES[scales].astype(np.float64), 16, axis=1)
    return x.astype(np.float64) @ (w / np.float64(divisor)).T


def _inputs(m: int, n: int, k: int, seed: int):
    rng = np.random.default_rng(seed)
    codes, packed, scales, divisor = random_planes(rng, n, k)
    # x with a spread of magnitudes, bf16-exact
    x = torch.tensor(rng.standard_normal((m, k)) * 2.0 ** rng.integers(-6, 4, size=(m, 1)), dtype=torch.bfloat16)
    ref = reference(x.float().numpy(), codes, scales, divisor)
    args = (x, torch.from_numpy(packed), torch.from_numpy(scales), torch.tensor([divisor]))
    return args, ref


def _close(y: np.ndarray, ref: np.ndarray) -> None:
    """Exact products, fp32 sums: errors relative to the largest output are ~1e-7."""
    assert np.isfinite(y).all()
    assert float(np.abs(y - ref).max() / np.abs(ref).max()) < 1e-5


@pytest.mark.parametrize("m,n,k,trans", [(1, 128, 64, True), (3, 256, 320, False), (8, 384, 128, True),
                                         (70, 192, 256, True), (130, 128, 192, False)])
def test_gemm_matches_float64(m, n, k, trans):
    from ninfer_compiler.ops import nvfp4_triton as nt
    from ninfer_compiler.ops.triton_aot import interpreted

    args, ref = _inputs(m, n, k, m * 7 + n + k)
    y = torch.full((m, n), float("nan"), dtype=torch.float32)  # fp32 out: checks the sum itself
    bm, bn = 64, 64  # smaller tiles than the GPU's: several programs and bands in the interpreter
    grid = (-(-m // bm) * -(-n // bn),)
    interpreted(nt.nvfp4_gemm_kernel)[grid](*args, y, m, n, k // 64, BLOCK_M=bm, BLOCK_N=bn,
                                            BLOCK_K=nt.GEMM_BLOCK_K, GROUP_M=2, TRANS=trans, F32_DOT=True)
    _close(y.numpy(), ref)


@pytest.mark.parametrize("m,n,k", [(1, 128, 64), (3, 256, 320), (8, 384, 192), (17, 128, 1024)])
def test_gemv_matches_float64(m, n, k):
    from ninfer_compiler.ops import nvfp4_triton as nt
    from ninfer_compiler.ops.triton_aot import interpreted

    args, ref = _inputs(m, n, k, m * 5 + n + k)
    splits, steps = nt.gemv_split(n, k)
    assert (splits - 1) * steps * nt.GEMV_BLOCK_K < k <= splits * steps * nt.GEMV_BLOCK_K
    part = torch.full((splits, m, n), float("nan"), dtype=torch.float32)
    grid = (-(-n // nt.GEMV_BLOCK_N), splits, -(-m // nt.GEMV_BLOCK_M))
    interpreted(nt.nvfp4_gemv_kernel)[grid](*args, part, m, n, k // 64, steps, BLOCK_M=nt.GEMV_BLOCK_M,
                                            BLOCK_N=nt.GEMV_BLOCK_N, BLOCK_K=nt.GEMV_BLOCK_K, F32_DOT=True)
    _close(part.numpy().sum(axis=0), ref)


def test_gemv_split_fills_the_gpu():
    from ninfer_compiler.ops.nvfp4_triton import GEMV_BLOCK_N, gemv_split

    assert gemv_split(17408, 5120) == (2, 10)  # 136 row tiles: two K halves
    splits, steps = gemv_split(5120, 17408)
    assert 5120 // GEMV_BLOCK_N * splits >= 264 and splits * steps >= 68
