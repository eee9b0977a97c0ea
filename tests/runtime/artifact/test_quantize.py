"""Quantizer tests: spec 3.2 grouped_absmax bit for bit, nvfp4/fp8 rounding, error bounds."""

from __future__ import annotations

import struct

import ml_dtypes
import numpy as np
import pytest

from ninfer_runtime.artifact import formats
from ninfer_runtime.artifact.codecs import (
    decode_tensor,
    dequantize,
    encode_direct,
    memory_reader,
    pack_planes,
    unpack_planes,
)
from ninfer_runtime.artifact.errors import ArtifactError
from ninfer_runtime.artifact.quantize import (
    e2m1_words,
    e4m3fn_words,
    quantize_fp8_row,
    quantize_grouped,
    quantize_nvfp4,
    rounding_bound,
)

ROW_SPLIT = "row_split_k128_v1"
BLOCK = "block_scale_k16_m128x4_v1"
ROW_SCALE = "row_scale_v1"
FP8 = "fp8_e4m3fn_row_bf16"
GROUPED = ["q4_g64_fp16", "q5_g64_fp16", "q6_g64_fp16", "q8_g32_fp16"]


def f32(v: float) -> float:
    return float(np.float32(v))


def reference_grouped(x: np.ndarray, fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """Spec 3.2 written with Python floats and struct's binary16 (independent of the module).

    f32(a op b) via double is exact for products and innocuous double rounding for quotients
    of binary32 operands, so this is true binary32 RNE arithmetic.
    """
    info = formats.FORMATS[fmt]
    geo = formats.geometry(ROW_SPLIT, fmt, x.shape)
    n, k = x.shape
    codes = np.zeros((n, k), np.int8)
    scales = np.zeros((n, geo.groups_per_row), np.uint16)
    for r in range(n):
        for g in range(geo.groups_per_row):
            vals = [float(v) for v in x[r, g * info.group : (g + 1) * info.group]]
            amax = max((abs(v) for v in vals), default=0.0)
            if amax == 0:
                continue
            word = struct.unpack("<H", struct.pack("<e", f32(amax / info.qmax)))[0] or 1
            s16 = struct.unpack("<e", struct.pack("<H", word))[0]
            inv = f32(1.0 / s16)
            scales[r, g] = word
            for i, v in enumerate(vals):
                codes[r, g * info.group + i] = min(max(round(f32(v * inv)), info.qmin), info.qmax)
    return codes, scales


def spread(shape: tuple[int, int], seed: int, lo: float = -3.0, hi: float = 2.0) -> np.ndarray:
    """Normal values with a per-row magnitude spanning many binades."""
    g = np.random.default_rng(seed)
    mags = 10.0 ** g.uniform(lo, hi, size=(shape[0], 1))
    return (g.standard_normal(shape) * mags).astype(np.float32)


# ------------------------------------------------------------------------------------------
# grouped_absmax (spec 3.2)
# ------------------------------------------------------------------------------------------


def test_grouped_hand_example_unit_scale():
    x = np.zeros((1, 64), np.float32)
    x[0, :8] = [7, -7, 3.5, 2.5, -0.5, 0.5, 1.5, -2.5]  # amax 7 -> scale 1.0 exactly
    p = quantize_grouped(x, "q4_g64_fp16")
    assert p.scales.tolist() == [[0x3C00, 0x0000]]  # second group is all padding
    assert p.codes[0, :8].tolist() == [7, -7, 4, 2, 0, 0, 2, -2]  # ties to even


def test_grouped_hand_example_reciprocal_order():
    # amax 1: f32(1/7) = 0.142857149 -> binary16 0x3092 = 0.142822265625;
    # inv = f32(1/0.142822265625) = 7.0017095, so 0.5 -> 3.50085 -> 4 and 0.0715 -> 0.5006 -> 1.
    x = np.zeros((1, 8), np.float32)
    x[0, :6] = [1.0, -1.0, 0.5, 0.25, -0.0714, 0.0715]
    p = quantize_grouped(x, "q4_g64_fp16")
    assert p.scales.tolist() == [[0x3092, 0]]
    assert p.codes[0, :6].tolist() == [7, -7, 4, 2, 0, 1]


def test_grouped_hand_example_scale_underflow_uses_smallest_subnormal():
    # 3e-7/127 rounds to binary16 +0, so the scale is 0x0001 = 2^-24 and inv = 2^24.
    p = quantize_grouped(np.array([[3e-7, -1e-7]], np.float32), "q8_g32_fp16")
    assert p.scales.tolist() == [[1, 0, 0, 0]]
    assert p.codes.tolist() == [[5, -2]]


def test_grouped_hand_example_clamp_after_subnormal_rounding():
    # amax/qmax = 1.4 * 2^-24 rounds down to 2^-24, so x*inv = 1.4*qmax and codes clamp.
    a = np.float32(127 * 1.4 * 2.0**-24)
    p = quantize_grouped(np.array([[a, -a]], np.float32), "q8_g32_fp16")
    assert p.scales[0, 0] == 1 and p.codes.tolist() == [[127, -127]]  # never the illegal -128
    a = np.float32(7 * 1.4 * 2.0**-24)
    p = quantize_grouped(np.array([[a, -a]], np.float32), "q4_g64_fp16")
    assert p.codes.tolist() == [[7, -8]]  # qmin of q4 is -8


def test_grouped_scale_overflow_boundary():
    p = quantize_grouped(np.array([[7 * 65504.0]], np.float32), "q4_g64_fp16")
    assert p.scales[0, 0] == 0x7BFF and p.codes[0, 0] == 7
    with pytest.raises(ArtifactError) as e:  # 65520 ties to even -> binary16 Inf
        quantize_grouped(np.array([[7 * 65520.0]], np.float32), "q4_g64_fp16")
    assert e.value.rule == "scale_overflow"


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_grouped_non_finite_rejected(bad):
    x = np.ones((2, 10), np.float32)
    x[1, 3] = bad
    with pytest.raises(ArtifactError) as e:
        quantize_grouped(x, "q6_g64_fp16")
    assert e.value.rule == "non_finite"


def test_grouped_zero_and_partial_groups():
    x = np.zeros((2, 100), np.float32)
    x[0, 70] = 7.0
    p = quantize_grouped(x, "q4_g64_fp16")
    assert p.scales.tolist() == [[0, 0x3C00], [0, 0]]
    assert p.codes.shape == (2, 100) and p.codes[0, 70] == 7 and np.count_nonzero(p.codes) == 1


@pytest.mark.parametrize("fmt", GROUPED)
def test_grouped_matches_reference(fmt):
    x = spread((6, 300), seed=len(fmt) + formats.FORMATS[fmt].bits, lo=-9, hi=3)
    x[0] *= np.float32(1e-30)  # tiny rows exercise subnormal and 0x0001 scales
    x[1, :64] = 0
    codes, scales = reference_grouped(x, fmt)
    p = quantize_grouped(x, fmt)
    assert np.array_equal(p.scales, scales)
    assert np.array_equal(p.codes, codes)
    assert p.codes.dtype == np.int8 and p.scales.dtype == np.uint16


def test_numpy_binary16_conversion_is_rne():
    """quantize_grouped relies on numpy's float32 -> float16 cast; check it against struct."""
    g = np.random.default_rng(5)
    x = (g.standard_normal(20_000) * 10.0 ** g.uniform(-9, 4.8, 20_000)).astype(np.float32)
    x = x[np.abs(x) < 65504]  # struct refuses values that round to Inf
    ties = np.array([1 + 2.0**-11, 1 + 3 * 2.0**-11, 2.0**-25, 3 * 2.0**-25, 65504 + 8], np.float32)
    for v in np.concatenate([x, ties]):
        got = int(np.float32(v).astype(np.float16).view(np.uint16))
        assert got == struct.unpack("<H", struct.pack("<e", float(v)))[0], v


def test_grouped_large_shape_is_fast_and_exact():
    x = spread((248320, 64), seed=8)
    p = quantize_grouped(x, "q4_g64_fp16")
    assert p.codes.shape == (248320, 64) and p.scales.shape == (248320, 2)
    rows = [0, 12345, 248319]
    codes, scales = reference_grouped(x[rows], "q4_g64_fp16")
    assert np.array_equal(p.codes[rows], codes) and np.array_equal(p.scales[rows], scales)


# ------------------------------------------------------------------------------------------
# Minifloat rounding
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value,word",
    [
        (0.0, 0x00),
        (-0.0, 0x00),
        (2.0**-9, 0x01),
        (2.0**-10, 0x00),  # tie between 0 and 2^-9 -> even 0
        (3 * 2.0**-10, 0x02),  # tie 1.5 sub-steps -> even 2
        (7.5 * 2.0**-9, 0x08),  # tie between largest subnormal and 2^-6
        (2.0**-6, 0x08),
        (1.0, 0x38),
        (1.0625, 0x38),  # tie -> mantissa 0
        (1.1875, 0x3A),  # tie -> mantissa 2
        (-1.5, 0xBC),
        (224.0, 0x76),
        (448.0, 0x7E),
        (464.0, 0x7E),  # would round to 480 (NaN) without saturation
        (1e30, 0x7E),
        (-1e30, 0xFE),
    ],
)
def test_e4m3fn_words_hand_values(value, word):
    assert int(e4m3fn_words(np.float32([value]))[0]) == word


def test_e4m3fn_words_match_ml_dtypes():
    g = np.random.default_rng(6)
    x = (g.standard_normal(200_000) * 10.0 ** g.uniform(-4, 2.7, 200_000)).astype(np.float32)
    ref = np.clip(x, -448, 448).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    ref = np.where((ref & 0x7F) == 0, 0, ref)  # we never emit -0
    assert np.array_equal(e4m3fn_words(x), ref)


@pytest.mark.parametrize(
    "value,word",
    [
        (0.0, 0x0),
        (0.25, 0x0),
        (0.26, 0x1),
        (0.75, 0x2),
        (1.25, 0x2),
        (1.75, 0x4),
        (2.5, 0x4),
        (3.5, 0x6),
        (5.0, 0x6),
        (5.01, 0x7),
        (100.0, 0x7),
        (-0.5, 0x9),
        (-3.0, 0xD),
        (-0.1, 0x0),
    ],
)
def test_e2m1_words_hand_values(value, word):
    assert int(e2m1_words(np.float32([value]))[0]) == word


def test_e2m1_words_match_ml_dtypes():
    x = (np.random.default_rng(7).standard_normal(100_000) * 3).astype(np.float32)
    ref = np.clip(x, -6, 6).astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0xF
    ref = np.where((ref & 7) == 0, 0, ref)
    assert np.array_equal(e2m1_words(x), ref)


# ------------------------------------------------------------------------------------------
# nvfp4 and fp8 row quantizers
# ------------------------------------------------------------------------------------------


def test_nvfp4_hand_example():
    x = np.zeros((128, 64), np.float32)
    x[0, :8] = [6, 2.5, 5, 0.25, 0.75, -1.25, 1.75, -3.5]  # global amax 6 -> divisor 448
    x[0, 16:18] = [3, -1.5]  # block amax 3 -> scale e4m3(224) = 0x76, v = 2x
    x[1, 0] = 0.1  # scale e4m3(0.1*448/6 = 7.47) = 7.5 (0x4F), v = 5.97 -> 6
    p = quantize_nvfp4(x)
    assert int(p.divisor) == 0x43E00000 and p.divisor.shape == ()
    assert p.codes[0, :8].tolist() == [0x7, 0x4, 0x6, 0x0, 0x2, 0xA, 0x4, 0xE]
    assert p.codes[0, 16:18].tolist() == [0x7, 0xD]
    assert p.scales[0, :2].tolist() == [0x7E, 0x76] and p.scales[1, 0] == 0x4F
    assert p.codes[1, 0] == 0x7
    assert np.count_nonzero(p.scales) == 3
    w = dequantize(p)
    assert w[0, :8].tolist() == [6, 2, 4, 0, 1, -1, 2, -4]
    assert w[1, 0] == np.float32(np.float32(6 * 7.5) / np.float32(448))


def test_nvfp4_zero_matrix():
    p = quantize_nvfp4(np.zeros((128, 64), np.float32))
    assert int(p.divisor) == 0x3F800000 and not p.codes.any() and not p.scales.any()


def test_nvfp4_shape_and_finiteness():
    with pytest.raises(ArtifactError) as e:
        quantize_nvfp4(np.ones((100, 64), np.float32))
    assert e.value.rule == "layout_shape"
    x = np.ones((128, 64), np.float32)
    x[5, 5] = np.nan
    with pytest.raises(ArtifactError) as e:
        quantize_nvfp4(x)
    assert e.value.rule == "non_finite"


def test_fp8_hand_example():
    x = np.zeros((3, 4), np.float32)
    x[0] = [448, -224, 1, 0]  # scale bf16(1.0) = 0x3F80
    x[2, 0] = 1.0  # scale bf16(1/448) = 0x3B12 < 1/448, so 1/scale = 448.88 saturates to 448
    p = quantize_fp8_row(x)
    assert p.scales.tolist() == [0x3F80, 0x0000, 0x3B12]
    assert p.codes.tolist() == [[0x7E, 0xF6, 0x38, 0x00], [0] * 4, [0x7E, 0, 0, 0]]
    assert dequantize(p)[2, 0] == np.float32(448 * 0.002227783203125)


def test_fp8_tiny_row_never_gets_zero_scale():
    x = np.array([[1e-44, -1e-45]], np.float32)  # amax/448 rounds to bf16 +0
    p = quantize_fp8_row(x)
    assert p.scales.tolist() == [1]
    assert np.abs(dequantize(p) - x).max() <= rounding_bound(FP8, x).max()


# ------------------------------------------------------------------------------------------
# quantize -> pack -> unpack -> pack, and error bounds
# ------------------------------------------------------------------------------------------

GROUPED_SHAPES = [(1, 1), (1, 64), (3, 100), (2, 130), (5, 200), (7, 129), (16, 512), (4, 1)]


@pytest.mark.parametrize("fmt", GROUPED)
@pytest.mark.parametrize("shape", GROUPED_SHAPES)
def test_grouped_quantize_round_trip_and_bound(fmt, shape):
    x = spread(shape, seed=shape[0] * 1000 + shape[1])
    p = quantize_grouped(x, fmt)
    data = pack_planes(ROW_SPLIT, fmt, shape, p)
    back = unpack_planes(ROW_SPLIT, fmt, shape, memory_reader(data))
    assert pack_planes(ROW_SPLIT, fmt, shape, back) == data
    w = decode_tensor(fmt, ROW_SPLIT, shape, memory_reader(data))
    bound = rounding_bound(fmt, x)
    assert (np.abs(w.astype(np.float64) - x) <= bound).all()
    group = formats.FORMATS[fmt].group
    scale = np.repeat(back.scales.view(np.float16).astype(np.float64), group, axis=1)
    scale = scale[:, : shape[1]]
    normal = scale >= 2.0**-14  # subnormal binary16 scales may clamp codes: larger bound
    assert (bound[normal] <= 0.51 * scale[normal]).all()  # tight: about half a step


@pytest.mark.parametrize("shape", [(128, 64), (256, 128), (128, 320)])
def test_nvfp4_quantize_round_trip_and_bound(shape):
    x = spread(shape, seed=shape[1], lo=-2, hi=1)
    x[3, :16] *= np.float32(1e-6)  # a block far below the global amax
    p = quantize_nvfp4(x)
    data = pack_planes(BLOCK, "nvfp4", shape, p)
    back = unpack_planes(BLOCK, "nvfp4", shape, memory_reader(data))
    assert pack_planes(BLOCK, "nvfp4", shape, back) == data
    err = np.abs(dequantize(back).astype(np.float64) - x)
    bound = rounding_bound("nvfp4", x)
    assert (err <= bound).all()
    divisor = float(back.divisor.view(np.float32))
    assert bound.max() <= 1.01 * 448 / divisor


@pytest.mark.parametrize("shape", [(1, 1), (3, 100), (7, 37), (64, 300), (50, 1)])
def test_fp8_quantize_round_trip_and_bound(shape):
    x = spread(shape, seed=shape[0] + 17, lo=-30, hi=30)
    x[0] = 0
    p = quantize_fp8_row(x)
    data = pack_planes(ROW_SCALE, FP8, shape, p)
    back = unpack_planes(ROW_SCALE, FP8, shape, memory_reader(data))
    assert pack_planes(ROW_SCALE, FP8, shape, back) == data
    err = np.abs(dequantize(back).astype(np.float64) - x)
    bound = rounding_bound(FP8, x)
    assert (err <= bound).all()
    scale = back.scales.view(ml_dtypes.bfloat16).astype(np.float64)[:, None]
    assert (bound <= 16.1 * scale + 1e-40).all()
    assert not back.codes[0].any() and back.scales[0] == 0


@pytest.mark.parametrize("fmt", GROUPED + ["nvfp4", FP8])
def test_bound_holds_on_wide_dynamic_range(fmt):
    g = np.random.default_rng(11)
    shape = (128, 192)
    x = (g.standard_normal(shape) * 10.0 ** g.uniform(-12, 3, shape)).astype(np.float32)
    if fmt == "nvfp4":
        w = dequantize(quantize_nvfp4(x))
    elif fmt == FP8:
        w = dequantize(quantize_fp8_row(x))
    else:
        w = dequantize(quantize_grouped(x, fmt))
    assert (np.abs(w.astype(np.float64) - x) <= rounding_bound(fmt, x)).all()


def test_bf16_and_fp32_bounds():
    g = np.random.default_rng(12)
    x = (g.standard_normal(10_000) * 10.0 ** np.linspace(-40, 30, 10_000)).astype(np.float32)
    w = np.frombuffer(encode_direct("bf16", x), "<u2")
    back = (w.astype(np.uint32) << 16).view(np.float32)
    assert (np.abs(back.astype(np.float64) - x) <= rounding_bound("bf16", x)).all()
    assert not rounding_bound("fp32", x).any()
