"""Byte-exact codecs for every numeric format x storage layout (artifact spec sections 3 and 4).

Quantized tensors are handled as *planes*: the raw logical words (codes, scale words, divisor
word) without any float round trip, so a decode -> encode cycle reproduces the bytes exactly.
`dequantize` turns planes into float32 values using the reconstruction rules of section 3.

All byte access goes through a `ReadFn(offset, length)` relative to the start of the object, so a
row slice reads only the spans it needs (a row_split slice is three spans, spec 4.3.7). Every
word read is validated; a violation raises `ArtifactError` naming the object.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from .errors import ArtifactError
from .formats import (
    CONTIGUOUS,
    DIRECT_WORD_BYTES,
    FORMATS,
    BlockScaleGeometry,
    GroupedIntFormat,
    RowScaleGeometry,
    RowSplitGeometry,
    elements,
    geometry,
)

ReadFn = Callable[[int, int], bytes | memoryview]
Rows = tuple[int, int] | None

# --------------------------------------------------------------------------------------------
# Planes
# --------------------------------------------------------------------------------------------


@dataclass
class GroupedPlanes:
    """q4/q5/q6/q8 planes: signed logical codes [N, K] and binary16 scale words [N, groups]."""

    fmt: str
    codes: np.ndarray  # int8 [N, K]
    scales: np.ndarray  # uint16 [N, groups_per_row], all-padding groups included (0)


@dataclass
class NvFp4Planes:
    """nvfp4 planes: E2M1 words [N, K], natural E4M3FN block scales [N, K/16], divisor word."""

    codes: np.ndarray  # uint8 [N, K], 0..15
    scales: np.ndarray  # uint8 [N, K // 16], unswizzled
    divisor: np.ndarray  # uint32 0-d, raw binary32 word


@dataclass
class Fp8RowPlanes:
    """fp8 row-scaled planes: E4M3FN codes [N, K] and one bf16 scale word per row."""

    codes: np.ndarray  # uint8 [N, K]
    scales: np.ndarray  # uint16 [N]


Planes = GroupedPlanes | NvFp4Planes | Fp8RowPlanes

# --------------------------------------------------------------------------------------------
# Word tables and exact conversions
# --------------------------------------------------------------------------------------------

E2M1_MAGNITUDES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)


def _e4m3fn_table() -> np.ndarray:
    """Value of every E4M3FN word (spec 3.3 table), written out rather than taken from a library."""
    table = np.empty(256, dtype=np.float32)
    for word in range(256):
        sign = -1.0 if word & 0x80 else 1.0
        e, m = (word >> 3) & 0xF, word & 0x7
        if e == 15 and m == 7:
            value = float("nan")
        elif e == 0:
            value = m * 2.0**-9
        else:
            value = (1 + m / 8) * 2.0 ** (e - 7)
        table[word] = sign * value
    return table


E4M3FN_VALUES = _e4m3fn_table()
E2M1_VALUES = np.concatenate([E2M1_MAGNITUDES, -E2M1_MAGNITUDES])


def bf16_words_to_f32(words: np.ndarray) -> np.ndarray:
    """Exact bf16 -> binary32: the word becomes the high half (NaN payloads kept)."""
    return (np.asarray(words, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_words(x: np.ndarray) -> np.ndarray:
    """binary32 -> bf16 words, round to nearest even; NaN stays NaN (quiet bit forced)."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    nan_words = ((u >> 16) | np.uint32(0x0040)).astype(np.uint16)
    is_nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    return np.where(is_nan, nan_words, rounded)


def f16_words_to_f32(words: np.ndarray) -> np.ndarray:
    """Exact binary16 -> binary32 of raw words."""
    return np.asarray(words, dtype=np.uint16).view(np.float16).astype(np.float32)


# --------------------------------------------------------------------------------------------
# Reading helpers
# --------------------------------------------------------------------------------------------


def memory_reader(buf: bytes | bytearray | memoryview) -> ReadFn:
    """A ReadFn over an in-memory object (tests, freshly encoded tensors)."""
    view = memoryview(buf).cast("B")

    def read(offset: int, length: int) -> memoryview:
        return view[offset : offset + length]

    return read


def _read(read: ReadFn, offset: int, length: int, obj: str | None) -> np.ndarray:
    """Read exactly `length` bytes as uint8; a short or long answer is a damaged object."""
    if length == 0:
        return np.empty(0, dtype=np.uint8)
    data = read(offset, length)
    got = memoryview(data).nbytes
    if got != length:
        raise ArtifactError(
            "short_read", f"read of {length} bytes at offset {offset} returned {got}", obj=obj
        )
    return np.frombuffer(data, dtype=np.uint8)


def _check_zero_gap(read: ReadFn, start: int, end: int, obj: str | None) -> None:
    """Gap bytes between planes must be zero (spec 4.3.2, 4.4, 4.5)."""
    gap = _read(read, start, end - start, obj)
    if gap.any():
        at = start + int(np.flatnonzero(gap)[0])
        raise ArtifactError("padding", f"non-zero gap byte at offset {at}", obj=obj)


def _row_range(rows: Rows, n: int, obj: str | None) -> tuple[int, int]:
    if rows is None:
        return 0, n
    r0, r1 = (int(r) for r in rows)
    if not 0 <= r0 <= r1 <= n:
        raise ArtifactError(
            "row_range", f"rows [{r0}, {r1}) are not a range within [0, {n}]", obj=obj
        )
    return r0, r1


def _first(mask: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i) for i in np.argwhere(mask)[0])


# --------------------------------------------------------------------------------------------
# Direct formats (contiguous_le_v1)
# --------------------------------------------------------------------------------------------

_WORD_DTYPES = {"bf16": np.dtype("<u2"), "fp32": np.dtype("<u4"), "int32": np.dtype("<i4")}


def _direct_words(fmt: str, values: np.ndarray) -> np.ndarray:
    """Raw words of a direct-format array; only the documented input dtypes are accepted."""
    arr = np.asarray(values)
    dt = arr.dtype
    if fmt == "bf16":
        if dt == ml_dtypes.bfloat16:
            return arr.view(np.uint16)
        if dt == np.uint16:
            return arr
        if dt == np.float32:
            return f32_to_bf16_words(arr)
    elif fmt == "fp32" and dt in (np.float32, np.uint32):
        return arr.view(np.uint32)
    elif fmt == "int32" and dt == np.int32:
        return arr
    if fmt not in _WORD_DTYPES:
        raise ArtifactError("unknown_format", f"{fmt!r} is not a direct format")
    raise ArtifactError("data_dtype", f"cannot encode a {dt} array as {fmt}")


def encode_direct(fmt: str, values: np.ndarray) -> bytes:
    """Little-endian C-order words of a bf16/fp32/int32 array (spec 4.2)."""
    words = _direct_words(fmt, values)
    return np.ascontiguousarray(words).astype(_WORD_DTYPES[fmt], copy=False).tobytes()


def decode_direct_words(
    fmt: str, shape, read: ReadFn, rows: Rows = None, obj: str | None = None
) -> np.ndarray:
    """Raw words (uint16 bf16, uint32 fp32, int32 int32), optionally rows [r0, r1) of axis 0."""
    shape = tuple(int(d) for d in shape)
    geometry(CONTIGUOUS, fmt, shape, obj)
    word = DIRECT_WORD_BYTES[fmt]
    if rows is not None and not shape:
        raise ArtifactError("row_range", "a rank-0 tensor has no rows to select", obj=obj)
    r0, r1 = _row_range(rows, shape[0] if shape else 1, obj)
    row_words = elements(shape[1:]) if shape else 1
    raw = _read(read, r0 * row_words * word, (r1 - r0) * row_words * word, obj)
    out_shape = (r1 - r0, *shape[1:]) if shape else ()
    native = {"bf16": np.uint16, "fp32": np.uint32, "int32": np.int32}[fmt]
    return raw.view(_WORD_DTYPES[fmt]).astype(native).reshape(out_shape)


# --------------------------------------------------------------------------------------------
# row_split_k128_v1 (q4/q5/q6/q8)
# --------------------------------------------------------------------------------------------


def _check_grouped_scales(geo: RowSplitGeometry, scales: np.ndarray, row0: int, obj) -> None:
    """Scale words: +0 or finite positive; all-padding groups must be +0."""
    bad = ((scales & 0x8000) != 0) | ((scales & 0x7C00) == 0x7C00)
    if bad.any():
        r, g = _first(bad)
        raise ArtifactError(
            "invalid_scale",
            f"scale word 0x{int(scales[r, g]):04X} of row {row0 + r} group {g} is negative, "
            "-0, Inf or NaN",
            obj=obj,
        )
    first_pad = -(-geo.cols // geo.fmt.group)  # groups from here lie entirely in [K, K_pad)
    pad = scales[:, first_pad:] != 0
    if pad.any():
        r, g = _first(pad)
        raise ArtifactError(
            "padding",
            f"all-padding group {first_pad + g} of row {row0 + r} has non-zero scale",
            obj=obj,
        )


def _check_grouped_codes(geo: RowSplitGeometry, u: np.ndarray, scales: np.ndarray, row0, obj):
    """Padded unsigned codes [c, K_pad]: padding lanes zero, q8 0x80 illegal, +0 scale => zeros."""
    k = geo.cols
    pad = u[:, k:] != 0
    if pad.any():
        r, c = _first(pad)
        raise ArtifactError(
            "padding", f"padding lane {k + c} of row {row0 + r} holds a non-zero code", obj=obj
        )
    if geo.fmt.bits == 8:
        illegal = u == 0x80
        if illegal.any():
            r, c = _first(illegal)
            raise ArtifactError(
                "invalid_code", f"q8 code 0x80 at row {row0 + r} column {c}", obj=obj
            )
    nonzero = (u != 0).reshape(u.shape[0], geo.groups_per_row, geo.fmt.group).any(axis=2)
    bad = nonzero & (scales == 0)
    if bad.any():
        r, g = _first(bad)
        raise ArtifactError(
            "invalid_code",
            f"group {g} of row {row0 + r} has scale +0 but non-zero codes",
            obj=obj,
        )


def _pad_unsigned(geo: RowSplitGeometry, codes: np.ndarray) -> np.ndarray:
    """Codes as b-bit two's-complement words, K padded to K_pad with code 0."""
    mask = (1 << geo.fmt.bits) - 1
    u = np.zeros((codes.shape[0], geo.k_pad), dtype=np.uint8)
    u[:, : geo.cols] = codes.astype(np.int16) & mask
    return u


def _pack_base(bits: int, u: np.ndarray) -> np.ndarray:
    if bits == 8:
        return u
    low = u & 0xF
    return low[:, 0::2] | (low[:, 1::2] << 4)


def _pack_high(bits: int, u: np.ndarray) -> np.ndarray:
    if bits == 5:
        return np.packbits((u >> 4) & 1, axis=1, bitorder="little")
    if bits == 6:
        hi = (u >> 4) & 3
        return hi[:, 0::4] | (hi[:, 1::4] << 2) | (hi[:, 2::4] << 4) | (hi[:, 3::4] << 6)
    return np.empty((u.shape[0], 0), dtype=np.uint8)


def _unpack_unsigned(geo: RowSplitGeometry, base: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Padded unsigned b-bit words [c, K_pad] from the base and high row bytes."""
    bits, c = geo.fmt.bits, base.shape[0]
    if bits == 8:
        return base
    u = np.empty((c, geo.k_pad), dtype=np.uint8)
    u[:, 0::2] = base & 0xF
    u[:, 1::2] = base >> 4
    if bits == 5:
        u |= np.unpackbits(high, axis=1, bitorder="little") << 4
    elif bits == 6:
        for j in range(4):
            u[:, j::4] |= ((high >> (2 * j)) & 3) << 4
    return u


def _sign_extend(bits: int, u: np.ndarray) -> np.ndarray:
    shift = 8 - bits
    return (u << shift).view(np.int8) >> shift


def _grouped_arrays(geo: RowSplitGeometry, fmt: str, planes, obj) -> tuple[np.ndarray, np.ndarray]:
    """Shape/dtype checks of GroupedPlanes for packing; returns (codes int16, scale words)."""
    if not isinstance(planes, GroupedPlanes) or planes.fmt != fmt:
        raise ArtifactError("plane_dtype", f"{fmt} needs GroupedPlanes with fmt={fmt!r}", obj=obj)
    codes, scales = np.asarray(planes.codes), np.asarray(planes.scales)
    if codes.shape != (geo.rows, geo.cols) or scales.shape != (geo.rows, geo.groups_per_row):
        raise ArtifactError(
            "plane_shape",
            f"codes {codes.shape} / scales {scales.shape} do not match "
            f"[{geo.rows}, {geo.cols}] / [{geo.rows}, {geo.groups_per_row}]",
            obj=obj,
        )
    if scales.dtype == np.float16:
        scales = scales.view(np.uint16)
    if not np.issubdtype(codes.dtype, np.integer) or scales.dtype != np.uint16:
        raise ArtifactError("plane_dtype", "codes must be integers, scales uint16 words", obj=obj)
    bad = (codes < geo.fmt.qmin) | (codes > geo.fmt.qmax)  # before narrowing, so nothing wraps
    if bad.any():
        r, c = _first(bad)
        raise ArtifactError(
            "invalid_code", f"code {int(codes[r, c])} at ({r}, {c}) outside {fmt} range", obj=obj
        )
    return codes.astype(np.int16), scales


def _pack_row_split(geo: RowSplitGeometry, fmt: str, planes, obj) -> bytes:
    codes, scales = _grouped_arrays(geo, fmt, planes, obj)
    _check_grouped_scales(geo, scales, 0, obj)
    u = _pad_unsigned(geo, codes)
    _check_grouped_codes(geo, u, scales, 0, obj)
    out = bytearray(geo.encoded_size)
    out[: geo.base_bytes] = _pack_base(geo.fmt.bits, u).tobytes()
    out[geo.high_offset : geo.high_offset + geo.high_bytes] = _pack_high(geo.fmt.bits, u).tobytes()
    out[geo.scale_offset :] = scales.astype("<u2").tobytes()
    return bytes(out)


def _unpack_row_split(geo: RowSplitGeometry, read: ReadFn, r0: int, r1: int, obj) -> GroupedPlanes:
    """Read the three row spans (spec 4.3.7) and validate every word."""
    c = r1 - r0
    base = _read(read, r0 * geo.base_row_bytes, c * geo.base_row_bytes, obj)
    high = _read(read, geo.high_offset + r0 * geo.high_row_bytes, c * geo.high_row_bytes, obj)
    raw_scales = _read(
        read, geo.scale_offset + r0 * geo.scale_row_bytes, c * geo.scale_row_bytes, obj
    )
    scales = raw_scales.view("<u2").astype(np.uint16).reshape(c, geo.groups_per_row)
    _check_grouped_scales(geo, scales, r0, obj)
    u = _unpack_unsigned(
        geo, base.reshape(c, geo.base_row_bytes), high.reshape(c, geo.high_row_bytes)
    )
    _check_grouped_codes(geo, u, scales, r0, obj)
    codes = _sign_extend(geo.fmt.bits, np.ascontiguousarray(u[:, : geo.cols]))
    return GroupedPlanes(geo.fmt.name, codes, scales)


def _row_split_gaps(geo: RowSplitGeometry, read: ReadFn, obj) -> None:
    _check_zero_gap(read, geo.base_bytes, geo.high_offset, obj)
    _check_zero_gap(read, geo.high_offset + geo.high_bytes, geo.scale_offset, obj)


# --------------------------------------------------------------------------------------------
# block_scale_k16_m128x4_v1 (nvfp4)
# --------------------------------------------------------------------------------------------


def _swizzle(natural: np.ndarray) -> np.ndarray:
    """Natural [N, K/16] scales -> plane order (spec 4.4: [N/128,4,32,K/64,4] -> (0,3,2,1,4))."""
    n, groups = natural.shape
    tiles = natural.reshape(n // 128, 4, 32, groups // 4, 4)
    return tiles.transpose(0, 3, 2, 1, 4).reshape(-1)


def _unswizzle(plane: np.ndarray, n: int, groups: int) -> np.ndarray:
    """Inverse of `_swizzle` (the axis permutation is its own inverse)."""
    tiles = plane.reshape(n // 128, groups // 4, 32, 4, 4)
    return tiles.transpose(0, 3, 2, 1, 4).reshape(n, groups)


def _check_nvfp4_scales(scales: np.ndarray, row0: int, obj) -> None:
    bad = scales > 0x7E
    if bad.any():
        r, g = _first(bad)
        raise ArtifactError(
            "invalid_scale",
            f"E4M3FN block scale 0x{int(scales[r, g]):02X} of row {row0 + r} group {g} is "
            "negative or NaN",
            obj=obj,
        )


def _check_divisor(word: int, obj) -> None:
    if not 0 < word <= 0x7F7FFFFF:
        raise ArtifactError(
            "invalid_divisor",
            f"weight divisor word 0x{word:08X} is not finite and > 0",
            obj=obj,
        )


def _divisor_word(divisor, obj) -> int:
    arr = np.asarray(divisor)
    if arr.size != 1 or arr.dtype not in (np.uint32, np.float32):
        raise ArtifactError("plane_dtype", "divisor must be one uint32 (or float32) word", obj=obj)
    return int(arr.reshape(()).view(np.uint32))


def _pack_nvfp4(geo: BlockScaleGeometry, planes, obj) -> bytes:
    if not isinstance(planes, NvFp4Planes):
        raise ArtifactError("plane_dtype", "nvfp4 needs NvFp4Planes", obj=obj)
    codes, scales = np.asarray(planes.codes), np.asarray(planes.scales)
    if codes.shape != (geo.rows, geo.cols) or scales.shape != (geo.rows, geo.cols // 16):
        raise ArtifactError(
            "plane_shape", f"codes {codes.shape} / scales {scales.shape} do not match", obj=obj
        )
    if codes.dtype != np.uint8 or scales.dtype != np.uint8:
        raise ArtifactError("plane_dtype", "nvfp4 codes and scales must be uint8", obj=obj)
    if (codes > 15).any():
        r, c = _first(codes > 15)
        raise ArtifactError("invalid_code", f"E2M1 code {int(codes[r, c])} at ({r}, {c})", obj=obj)
    _check_nvfp4_scales(scales, 0, obj)
    word = _divisor_word(planes.divisor, obj)
    _check_divisor(word, obj)
    out = bytearray(geo.encoded_size)
    out[: geo.code_bytes] = (codes[:, 0::2] | (codes[:, 1::2] << 4)).tobytes()
    out[geo.scale_offset : geo.divisor_offset] = _swizzle(scales).tobytes()
    out[geo.divisor_offset :] = word.to_bytes(4, "little")
    return bytes(out)


def _unpack_nvfp4(geo: BlockScaleGeometry, read: ReadFn, r0: int, r1: int, obj) -> NvFp4Planes:
    """Read the code rows, the 128-row scale tiles covering them, and the divisor."""
    half, groups = geo.cols // 2, geo.cols // 16
    packed = _read(read, r0 * half, (r1 - r0) * half, obj).reshape(r1 - r0, half)
    codes = np.empty((r1 - r0, geo.cols), dtype=np.uint8)
    codes[:, 0::2] = packed & 0xF
    codes[:, 1::2] = packed >> 4
    t0, t1 = r0 // 128, -(-r1 // 128)
    tile_bytes = 128 * groups
    plane = _read(read, geo.scale_offset + t0 * tile_bytes, (t1 - t0) * tile_bytes, obj)
    scales = _unswizzle(plane, (t1 - t0) * 128, groups)[r0 - t0 * 128 : r1 - t0 * 128]
    _check_nvfp4_scales(scales, r0, obj)
    word = int(_read(read, geo.divisor_offset, 4, obj).view("<u4")[0])
    _check_divisor(word, obj)
    return NvFp4Planes(codes, np.ascontiguousarray(scales), np.array(word, dtype=np.uint32))


# --------------------------------------------------------------------------------------------
# row_scale_v1 (fp8_e4m3fn_row_bf16)
# --------------------------------------------------------------------------------------------


def _check_fp8(codes: np.ndarray, scales: np.ndarray, row0: int, obj) -> None:
    nan = (codes & 0x7F) == 0x7F
    if nan.any():
        r, c = _first(nan)
        raise ArtifactError(
            "invalid_code",
            f"E4M3FN NaN code 0x{int(codes[r, c]):02X} at row {row0 + r} column {c}",
            obj=obj,
        )
    bad = ((scales & 0x8000) != 0) | ((scales & 0x7F80) == 0x7F80)
    if bad.any():
        (r,) = _first(bad)
        raise ArtifactError(
            "invalid_scale",
            f"bf16 row scale 0x{int(scales[r]):04X} of row {row0 + r} is negative, -0, Inf or NaN",
            obj=obj,
        )
    zero_rows = scales == 0
    if zero_rows.any():
        nonzero = ((codes[zero_rows] & 0x7F) != 0).any(axis=1)
        if nonzero.any():
            r = int(np.flatnonzero(zero_rows)[np.argmax(nonzero)])
            raise ArtifactError(
                "invalid_code", f"row {row0 + r} has scale +0 but non-zero codes", obj=obj
            )


def _pack_fp8(geo: RowScaleGeometry, planes, obj) -> bytes:
    if not isinstance(planes, Fp8RowPlanes):
        raise ArtifactError("plane_dtype", "fp8_e4m3fn_row_bf16 needs Fp8RowPlanes", obj=obj)
    codes, scales = np.asarray(planes.codes), np.asarray(planes.scales)
    if codes.shape != (geo.rows, geo.cols) or scales.shape != (geo.rows,):
        raise ArtifactError(
            "plane_shape", f"codes {codes.shape} / scales {scales.shape} do not match", obj=obj
        )
    if scales.dtype == ml_dtypes.bfloat16:
        scales = scales.view(np.uint16)
    if codes.dtype != np.uint8 or scales.dtype != np.uint16:
        raise ArtifactError("plane_dtype", "fp8 codes must be uint8, scales uint16", obj=obj)
    _check_fp8(codes, scales, 0, obj)
    out = bytearray(geo.encoded_size)
    out[: geo.code_bytes] = codes.tobytes()
    out[geo.scale_offset :] = scales.astype("<u2").tobytes()
    return bytes(out)


def _unpack_fp8(geo: RowScaleGeometry, read: ReadFn, r0: int, r1: int, obj) -> Fp8RowPlanes:
    c = r1 - r0
    codes = _read(read, r0 * geo.cols, c * geo.cols, obj).reshape(c, geo.cols)
    scales = _read(read, geo.scale_offset + 2 * r0, 2 * c, obj).view("<u2").astype(np.uint16)
    _check_fp8(codes, scales, r0, obj)
    return Fp8RowPlanes(codes.copy(), scales)


# --------------------------------------------------------------------------------------------
# Public entry points
# --------------------------------------------------------------------------------------------


def pack_planes(layout: str, fmt: str, shape, planes: Planes, obj: str | None = None) -> bytes:
    """Exact encoded bytes of quantized planes, zero gaps included; invalid planes are refused."""
    geo = geometry(layout, fmt, shape, obj)
    if isinstance(geo, RowSplitGeometry):
        return _pack_row_split(geo, fmt, planes, obj)
    if isinstance(geo, BlockScaleGeometry):
        return _pack_nvfp4(geo, planes, obj)
    if isinstance(geo, RowScaleGeometry):
        return _pack_fp8(geo, planes, obj)
    raise ArtifactError("format_layout", f"{layout} stores direct words, not planes", obj=obj)


def unpack_planes(
    layout: str, fmt: str, shape, read: ReadFn, rows: Rows = None, obj: str | None = None
) -> Planes:
    """Validated planes of rows [r0, r1) (all rows if None), reading only the spans needed.

    A full unpack also checks that the gap bytes between planes are zero.
    """
    geo = geometry(layout, fmt, shape, obj)
    if geo is None:
        raise ArtifactError("format_layout", f"{layout} stores direct words, not planes", obj=obj)
    r0, r1 = _row_range(rows, geo.rows, obj)
    if isinstance(geo, RowSplitGeometry):
        planes = _unpack_row_split(geo, read, r0, r1, obj)
        if rows is None:
            _row_split_gaps(geo, read, obj)
    elif isinstance(geo, BlockScaleGeometry):
        planes = _unpack_nvfp4(geo, read, r0, r1, obj)
        if rows is None:
            _check_zero_gap(read, geo.code_bytes, geo.scale_offset, obj)
    else:
        planes = _unpack_fp8(geo, read, r0, r1, obj)
        if rows is None:
            _check_zero_gap(read, geo.code_bytes, geo.scale_offset, obj)
    return planes


def dequantize(planes: Planes) -> np.ndarray:
    """float32 values of planes by the reconstruction rules of spec 3.2-3.4.

    Plain binary32 arithmetic: a valid tensor may still overflow to Inf or underflow, so those
    IEEE results are returned without warnings.
    """
    with np.errstate(over="ignore", under="ignore"):
        if isinstance(planes, GroupedPlanes):
            info = FORMATS[planes.fmt]
            assert isinstance(info, GroupedIntFormat)
            k = planes.codes.shape[1]
            scale = np.repeat(f16_words_to_f32(planes.scales), info.group, axis=1)[:, :k]
            return planes.codes.astype(np.float32) * scale
        if isinstance(planes, NvFp4Planes):
            scale = np.repeat(E4M3FN_VALUES[planes.scales], 16, axis=1)
            divisor = np.asarray(planes.divisor, dtype=np.uint32).reshape(()).view(np.float32)
            return (E2M1_VALUES[planes.codes] * scale) / divisor
        if isinstance(planes, Fp8RowPlanes):
            return E4M3FN_VALUES[planes.codes] * bf16_words_to_f32(planes.scales)[:, None]
    raise TypeError(f"not a planes object: {type(planes).__name__}")


def decode_tensor(
    fmt: str,
    layout: str,
    shape,
    read: ReadFn,
    rows: Rows = None,
    obj: str | None = None,
    dtype: str = "float32",
) -> np.ndarray:
    """Logical values (float32, or int32 for int32; bf16 exact or bit-exact as bfloat16)."""
    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"dtype must be 'float32' or 'bfloat16', got {dtype!r}")
    if dtype == "bfloat16" and fmt != "bf16":
        raise ValueError(f"dtype 'bfloat16' is only exact for bf16 tensors, not {fmt}")
    if layout != CONTIGUOUS:
        return dequantize(unpack_planes(layout, fmt, shape, read, rows, obj))
    geometry(layout, fmt, shape, obj)
    words = decode_direct_words(fmt, shape, read, rows, obj)
    if fmt == "bf16":
        return words.view(ml_dtypes.bfloat16) if dtype == "bfloat16" else bf16_words_to_f32(words)
    if fmt == "fp32":
        return words.view(np.float32)
    return words


def encode_tensor(fmt: str, layout: str, shape, data, obj: str | None = None) -> bytes:
    """Encoded bytes of a tensor: an array for direct formats, planes for quantized ones."""
    if layout != CONTIGUOUS:
        return pack_planes(layout, fmt, shape, data, obj)
    shape = tuple(int(d) for d in shape)
    geometry(layout, fmt, shape, obj)
    arr = np.asarray(data)
    if arr.shape != shape:
        raise ArtifactError(
            "data_shape", f"data shape {arr.shape} != tensor shape {shape}", obj=obj
        )
    return encode_direct(fmt, arr)
