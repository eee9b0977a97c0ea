"""Quantizers from float32 weights to codec planes, and the error bound each one guarantees.

`quantize_grouped` is the spec's canonical `grouped_absmax` encoder (3.2) and reproduces upstream
bytes bit for bit. The nvfp4 and fp8-row quantizers are not normative (spec 8.12); they are
simple absmax schemes whose rounding is exact RNE onto the format's grid, so `rounding_bound` can
state a tight per-element error bound that the converter and tests check against.
"""

from __future__ import annotations

import numpy as np

from .codecs import (
    E4M3FN_VALUES,
    Fp8RowPlanes,
    GroupedPlanes,
    NvFp4Planes,
    bf16_words_to_f32,
    f16_words_to_f32,
    f32_to_bf16_words,
)
from .errors import ArtifactError
from .formats import BLOCK_SCALE, FORMATS, ROW_SCALE, ROW_SPLIT, GroupedIntFormat, geometry

_CHUNK_ELEMENTS = 1 << 21  # elements per row chunk: temporaries stay cache- and memory-friendly
_E4M3_MAX = 448.0
_E2M1_MAX = 6.0
_F32_MAX = np.float32(np.finfo(np.float32).max)
_TINY = 2.0**-148  # a few binary32 subnormal ulps: slack for results that underflow
_SLACK = 1 + 2.0**-10  # relative slack for the binary32 roundings before the final RNE step


def _matrix(x: np.ndarray, layout: str, fmt: str) -> np.ndarray:
    """float32 [N, K] after the layout's shape rules; non-finite weights cannot be encoded."""
    x = np.asarray(x, dtype=np.float32)
    geometry(layout, fmt, x.shape)
    if not np.isfinite(x).all():
        raise ArtifactError("non_finite", f"cannot quantize non-finite values to {fmt}")
    return x


def _row_chunks(n: int, k: int) -> list[slice]:
    """Row slices small enough that the many full-size temporaries stay cache-friendly."""
    step = max(1, _CHUNK_ELEMENTS // k)
    return [slice(r, r + step) for r in range(0, n, step)]


def _round_minifloat(mag: np.ndarray, mant_bits: int, min_exp: int, max_value: float) -> np.ndarray:
    """Word of the nearest value of a small float format (no inf/NaN), RNE, saturating.

    `mag` is a non-negative binary32 array. Normal magnitudes are rounded on their binary32 bits
    (the carry into the exponent is the correct RNE result); below 2^min_exp the spacing is the
    fixed subnormal step, so rint on the scaled value is exact RNE.
    """
    mag = np.minimum(mag, np.float32(max_value))
    shift = 23 - mant_bits
    u = mag.view(np.uint32)
    rounded = (u + np.uint32((1 << (shift - 1)) - 1) + ((u >> shift) & np.uint32(1))) >> shift
    rebias = np.uint32((127 - (1 - min_exp)) << mant_bits)
    normal = rounded - rebias  # wraps for subnormal magnitudes, which np.where discards
    subnormal = np.rint(mag * np.float32(2.0 ** (mant_bits - min_exp))).astype(np.uint32)
    return np.where(mag < np.float32(2.0**min_exp), subnormal, normal).astype(np.uint8)


def e4m3fn_words(v: np.ndarray) -> np.ndarray:
    """binary32 -> E4M3FN words, RNE, saturating to +-448, zero magnitude -> 0x00."""
    v = np.asarray(v, dtype=np.float32)
    words = _round_minifloat(np.abs(v), 3, -6, _E4M3_MAX)
    return words | ((v < 0) & (words != 0)).astype(np.uint8) << 7


def e2m1_words(v: np.ndarray) -> np.ndarray:
    """binary32 -> E2M1 words, RNE, saturating to +-6, zero magnitude -> 0x0."""
    v = np.asarray(v, dtype=np.float32)
    words = _round_minifloat(np.abs(v), 1, 0, _E2M1_MAX)
    return words | ((v < 0) & (words != 0)).astype(np.uint8) << 3


# --------------------------------------------------------------------------------------------
# grouped_absmax (q4/q5/q6/q8)
# --------------------------------------------------------------------------------------------


def _grouped_info(fmt: str) -> GroupedIntFormat:
    info = FORMATS.get(fmt)
    if not isinstance(info, GroupedIntFormat):
        raise ArtifactError("unknown_format", f"{fmt!r} is not a grouped integer format")
    return info


def _grouped_chunk(xg: np.ndarray, info: GroupedIntFormat) -> tuple[np.ndarray, np.ndarray]:
    """Spec 3.2 on padded groups [n, groups, G]: (int8 codes, uint16 scale words)."""
    amax = np.abs(xg).max(axis=2)
    with np.errstate(over="ignore"):
        words = (amax / np.float32(info.qmax)).astype(np.float16).view(np.uint16)
    words = np.where((amax > 0) & (words == 0), np.uint16(1), words)
    if (words == 0x7C00).any():
        raise ArtifactError(
            "scale_overflow", f"a group's absmax / {info.qmax} overflows binary16 ({info.name})"
        )
    scale = f16_words_to_f32(words)
    inv = np.divide(np.float32(1), scale, out=np.zeros_like(scale), where=words != 0)
    q = np.rint(xg * inv[:, :, None])
    return np.clip(q, info.qmin, info.qmax).astype(np.int8), words


def quantize_grouped(x: np.ndarray, fmt: str) -> GroupedPlanes:
    """Canonical `grouped_absmax` encoder, bit-exact (binary32, RNE, reciprocal then multiply)."""
    info = _grouped_info(fmt)
    x = _matrix(x, ROW_SPLIT, fmt)
    n, k = x.shape
    geo = geometry(ROW_SPLIT, fmt, x.shape)
    codes = np.empty((n, k), dtype=np.int8)
    scales = np.empty((n, geo.groups_per_row), dtype=np.uint16)
    for rows in _row_chunks(n, geo.k_pad):
        xp = np.pad(x[rows], ((0, 0), (0, geo.k_pad - k))) if k != geo.k_pad else x[rows]
        c, scales[rows] = _grouped_chunk(xp.reshape(len(xp), -1, info.group), info)
        codes[rows] = c.reshape(len(xp), geo.k_pad)[:, :k]
    return GroupedPlanes(fmt, codes, scales)


# --------------------------------------------------------------------------------------------
# nvfp4 and fp8 row
# --------------------------------------------------------------------------------------------


def _nvfp4_divisor(x: np.ndarray) -> np.float32:
    """Divisor mapping the global absmax to 6 * 448, so every block scale fits E4M3FN."""
    amax = np.abs(x).max()
    if amax == 0:
        return np.float32(1.0)
    with np.errstate(over="ignore"):
        d = np.float32(_E2M1_MAX * _E4M3_MAX) / amax
    return min(d, _F32_MAX)


def _nvfp4_scaled(x: np.ndarray, d: np.float32) -> tuple[np.ndarray, np.ndarray]:
    """(block scale words [n, K/16], x*d/scale as [n, K/16, 16]; 0 where the scale is 0)."""
    blocks = (x * d).reshape(x.shape[0], -1, 16)
    scale_words = e4m3fn_words(np.abs(blocks).max(axis=2) / np.float32(_E2M1_MAX))
    scale = E4M3FN_VALUES[scale_words][:, :, None]
    v = np.divide(blocks, scale, out=np.zeros_like(blocks), where=scale != 0)
    return scale_words, v


def quantize_nvfp4(x: np.ndarray) -> NvFp4Planes:
    """Absmax nvfp4: one fp32 divisor per matrix, E4M3 block scales, RNE E2M1 codes."""
    x = _matrix(x, BLOCK_SCALE, "nvfp4")
    n, k = x.shape
    d = _nvfp4_divisor(x)
    codes = np.empty((n, k), dtype=np.uint8)
    scales = np.empty((n, k // 16), dtype=np.uint8)
    for rows in _row_chunks(n, k):
        scales[rows], v = _nvfp4_scaled(x[rows], d)
        codes[rows] = e2m1_words(v).reshape(-1, k)
    return NvFp4Planes(codes, scales, np.array(d, dtype=np.float32).view(np.uint32))


def _fp8_scale_words(x: np.ndarray) -> np.ndarray:
    """Row scale bf16(amax/448), RNE; a non-zero row never gets the +0 scale."""
    amax = np.abs(x).max(axis=1)
    words = f32_to_bf16_words(amax / np.float32(_E4M3_MAX))
    return np.where((amax > 0) & (words == 0), np.uint16(1), words)


def _fp8_scaled(x: np.ndarray, words: np.ndarray) -> np.ndarray:
    scale = bf16_words_to_f32(words)[:, None]
    return np.divide(x, scale, out=np.zeros_like(x), where=scale != 0)


def quantize_fp8_row(x: np.ndarray) -> Fp8RowPlanes:
    """Per-row absmax fp8: bf16 scale = amax/448, E4M3FN codes of x/scale (RNE, saturating)."""
    x = _matrix(x, ROW_SCALE, "fp8_e4m3fn_row_bf16")
    n, k = x.shape
    codes = np.empty((n, k), dtype=np.uint8)
    scales = _fp8_scale_words(x)
    for rows in _row_chunks(n, k):
        codes[rows] = e4m3fn_words(_fp8_scaled(x[rows], scales[rows]))
    return Fp8RowPlanes(codes, scales)


# --------------------------------------------------------------------------------------------
# Error bounds
# --------------------------------------------------------------------------------------------


def _grouped_bound(x: np.ndarray, fmt: str) -> np.ndarray:
    """Half a step, or the clamp excess when a rounded-down binary16 scale saturates codes."""
    info = _grouped_info(fmt)
    x = np.asarray(x, dtype=np.float32)
    scales = f16_words_to_f32(quantize_grouped(x, fmt).scales)
    s = np.repeat(scales, info.group, axis=1)[:, : x.shape[1]].astype(np.float64)
    return np.maximum(0.5 * s, np.abs(x) - info.qmax * s) * _SLACK + _TINY


def _nvfp4_bound(x: np.ndarray) -> np.ndarray:
    x = _matrix(x, BLOCK_SCALE, "nvfp4")
    d = _nvfp4_divisor(x)
    scale_words, v = _nvfp4_scaled(x, d)
    mag = np.abs(v).astype(np.float64)
    half = np.where(mag < 2, 0.25, np.where(mag < 4, 0.5, 1.0))
    steps = np.maximum(half, mag - _E2M1_MAX)
    scale = E4M3FN_VALUES[scale_words][:, :, None].astype(np.float64)
    bound = np.where(scale > 0, steps * scale / float(d), np.abs(x).reshape(v.shape))
    return (bound * _SLACK + _TINY).reshape(x.shape)


def _e4m3_half_step(mag: np.ndarray) -> np.ndarray:
    """Half the E4M3FN spacing around a magnitude (subnormal spacing 2^-9 below 2^-6)."""
    _, e = np.frexp(np.maximum(mag, 2.0**-6))
    return np.ldexp(1.0, e - 5)


def _fp8_bound(x: np.ndarray) -> np.ndarray:
    x = _matrix(x, ROW_SCALE, "fp8_e4m3fn_row_bf16")
    words = _fp8_scale_words(x)
    mag = np.abs(_fp8_scaled(x, words)).astype(np.float64)
    steps = np.maximum(_e4m3_half_step(np.minimum(mag, _E4M3_MAX)), mag - _E4M3_MAX)
    scale = bf16_words_to_f32(words)[:, None].astype(np.float64)
    return steps * scale * _SLACK + _TINY


def _bf16_bound(x: np.ndarray) -> np.ndarray:
    """Half a bf16 ulp (subnormal spacing 2^-133)."""
    mag = np.abs(np.asarray(x, dtype=np.float64))
    _, e = np.frexp(np.maximum(mag, 2.0**-126))
    return np.ldexp(1.0, e - 9)


def rounding_bound(fmt: str, x: np.ndarray) -> np.ndarray:
    """Elementwise max |dequant(quantize(x)) - x| (float64) that this module's encoders respect."""
    if fmt in ("fp32", "int32"):
        return np.zeros(np.shape(x), dtype=np.float64)
    if fmt == "bf16":
        return _bf16_bound(x)
    if fmt == "nvfp4":
        return _nvfp4_bound(x)
    if fmt == "fp8_e4m3fn_row_bf16":
        return _fp8_bound(x)
    return _grouped_bound(x, fmt)
