"""The fp8-row Triton kernels (`ops/fp8_row_triton.py`) in Triton's CPU interpreter against float64.

Both decodes (`DEQUANT` 0: fp8 -> bf16, 1: fp8 -> f16 -> f32 -> bf16) are exact, so the only error is
the fp32 summation order; shapes are ragged in M, N and K (K % 16 == 0, not a multiple of BLOCK_K).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from .test_fp8_row import VALID, e4m3fn64, random_planes, reference

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from ninfer_compiler.ops.fp8_row_triton import _codes_bf16  # noqa: E402


def _inputs(m: int, n: int, k: int, seed: int):
    rng = np.random.default_rng(seed)
    codes, words = random_planes(rng, n, k)
    # x with a spread of magnitudes, bf16-exact
    x = torch.tensor(rng.standard_normal((m, k)) * 2.0 ** rng.integers(-6, 4, size=(m, 1)), dtype=torch.bfloat16)
    ref = reference(x.float().numpy(), codes, words)
    scales = torch.from_numpy(words.view(np.int16).copy()).view(torch.bfloat16)
    return x, torch.from_numpy(codes), scales, ref


def _close(y: np.ndarray, ref: np.ndarray) -> None:
    """Exact products, fp32 sums: errors relative to the largest output are ~1e-7."""
    assert np.isfinite(y).all()
    assert float(np.abs(y - ref).max() / np.abs(ref).max()) < 1e-5


@triton.jit
def _decode_kernel(c_ptr, o_ptr, DEQUANT: tl.constexpr):
    i = tl.arange(0, 256)
    tl.store(o_ptr + i, _codes_bf16(tl.load(c_ptr + i), DEQUANT))


@pytest.mark.parametrize("dequant", [0, 1])
def test_codes_decode_exactly(dequant):
    """Every valid word through the kernels' decode is its E4M3FN value (bf16-exact)."""
    from ninfer_compiler.ops.triton_aot import interpreted

    codes = np.zeros(256, np.uint8)
    codes[: VALID.size] = VALID
    out = torch.zeros(256, dtype=torch.bfloat16)
    interpreted(_decode_kernel)[(1,)](torch.from_numpy(codes), out, DEQUANT=dequant)
    np.testing.assert_array_equal(out.float().numpy().astype(np.float64), e4m3fn64(codes))


@pytest.mark.parametrize("m,n,k,trans,dequant", [(1, 16, 64, False, 0), (3, 130, 192, True, 1),
                                                 (8, 64, 128, False, 1), (70, 192, 256, True, 0),
                                                 (130, 100, 64, True, 1)])
def test_gemm_matches_float64(m, n, k, trans, dequant):
    """Ragged M and N (clamped rows, masked stores), both operand orders, both decodes."""
    from ninfer_compiler.ops import fp8_row_triton as ft
    from ninfer_compiler.ops.triton_aot import interpreted

    x, codes, scales, ref = _inputs(m, n, k, m * 7 + n + k)
    y = torch.full((m, n), float("nan"), dtype=torch.float32)  # fp32 out: checks the sum itself
    bm, bn = 64, 64  # smaller tiles than the GPU's: several programs and bands in the interpreter
    grid = (ft.gemm_grid(m, n, bm, bn),)
    interpreted(ft.fp8_row_gemm_kernel)[grid](x, codes, scales, y, m, n, k // 64, BLOCK_M=bm, BLOCK_N=bn,
                                              BLOCK_K=ft.GEMM_BLOCK_K, GROUP_M=2, TRANS=trans, DEQUANT=dequant,
                                              F32_DOT=True)
    _close(y.numpy(), ref)


def test_gemm_bf16_output_rounds_once():
    """A bf16 y is the fp32 result rounded to nearest (the scale applied before the one rounding)."""
    from ninfer_compiler.ops import fp8_row_triton as ft
    from ninfer_compiler.ops.triton_aot import interpreted

    m, n, k = 5, 64, 64
    x, codes, scales, ref = _inputs(m, n, k, 11)
    y = torch.empty((m, n), dtype=torch.bfloat16)
    interpreted(ft.fp8_row_gemm_kernel)[(ft.gemm_grid(m, n, 64, 64),)](
        x, codes, scales, y, m, n, k // 64, BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, GROUP_M=1, TRANS=True, DEQUANT=1,
        F32_DOT=True)
    err = np.abs(y.float().numpy() - ref) / np.maximum(np.abs(ref), 1e-30)
    assert float(err[np.abs(ref) > 1e-3 * np.abs(ref).max()].max()) <= 2.0**-8 * 1.01


def test_gemm_config_takes_the_wide_tile_once_it_fills_the_gpu():
    from ninfer_compiler.ops.fp8_row_triton import GEMM_CONFIGS, gemm_config

    assert gemm_config("sm_90a", 7680, 17408) == ("wide", GEMM_CONFIGS["sm_90a"]["wide"])
    assert gemm_config("sm_90a", 128, 5120)[0] == "narrow"  # 40 wide tiles would leave SMs idle
    assert gemm_config("sm_120a", 7680, 17408)[0] == "narrow"
    for configs in GEMM_CONFIGS.values():
        assert len({c[1] for c in configs.values()}) == 1  # one BLOCK_N (the launcher's tile count)


@pytest.mark.parametrize("m,n,k", [(1, 128, 64), (3, 256, 320), (8, 384, 192), (17, 130, 1040)])
def test_gemv_matches_float64(m, n, k):
    """K-split fp32 partials, summed and scaled as `ops/fp8_row.py` does after the kernel."""
    from ninfer_compiler.ops import fp8_row_triton as ft
    from ninfer_compiler.ops.triton_aot import interpreted

    x, codes, scales, ref = _inputs(m, n, k, m * 5 + n + k)
    splits, steps = ft.gemv_split(n, k)
    assert (splits - 1) * steps * ft.GEMV_BLOCK_K < k <= splits * steps * ft.GEMV_BLOCK_K
    part = torch.full((splits, m, n), float("nan"), dtype=torch.float32)
    grid = (-(-n // ft.GEMV_BLOCK_N), splits, -(-m // ft.GEMV_BLOCK_M))
    interpreted(ft.fp8_row_gemv_kernel)[grid](x, codes, part, m, n, k // 16, steps, BLOCK_M=ft.GEMV_BLOCK_M,
                                              BLOCK_N=ft.GEMV_BLOCK_N, BLOCK_K=ft.GEMV_BLOCK_K,
                                              DEQUANT=ft.DEQUANT["sm_90a"], F32_DOT=True)
    s = scales.float().numpy().astype(np.float32)
    _close(part.numpy().sum(axis=0) * s, ref)


def test_gemv_split_fills_the_gpu():
    from ninfer_compiler.ops.fp8_row_triton import GEMV_BLOCK_K, GEMV_BLOCK_N, gemv_split

    assert gemv_split(17408, 5120) == (2, 10)  # 136 row tiles: two K halves
    splits, steps = gemv_split(5120, 6144)  # 40 row tiles: 24 K steps in 6 splits of 4 (240 programs)
    assert (splits, steps) == (6, 4) and 5120 // GEMV_BLOCK_N * splits >= 240
    assert (splits - 1) * steps * GEMV_BLOCK_K < 6144 <= splits * steps * GEMV_BLOCK_K


def test_scales_are_bf16_words():
    """The test inputs carry the scale words unchanged (bf16 view of the uint16 plane)."""
    _, _, scales, _ = _inputs(1, 16, 16, 1)
    assert scales.dtype == torch.bfloat16
    rng = np.random.default_rng(1)
    _, words = random_planes(rng, 16, 16)
    np.testing.assert_array_equal(scales.float().numpy(), words.view(ml_dtypes.bfloat16).astype(np.float32))
