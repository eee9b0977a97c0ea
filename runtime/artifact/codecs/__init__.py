"""Byte-exact codecs for every numeric format x storage layout (artifact spec sections 3 and 4).

Quantized tensors are handled as *planes*: the raw logical words (codes, scale words, divisor
word) without any float round trip, so a decode -> encode cycle reproduces the bytes exactly.
`dequantize` turns planes into float32 values using the reconstruction rules of section 3.

All byte access goes through a `ReadFn(offset, length)` relative to the start of the object, so a
row slice reads only the spans it needs (a row_split slice is three spans, spec 4.3.7). Every
word read is validated; a violation raises `ArtifactError` naming the object.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from ..errors import ArtifactError
from ..formats import (
    CONTIGUOUS,
    FORMATS,
    BlockScaleGeometry,
    GroupedIntFormat,
    RowScaleGeometry,
    RowSplitGeometry,
    geometry,
)
from .block_scale import _pack_nvfp4, _unpack_nvfp4
from .direct import decode_direct_words, encode_direct
from .planes import Fp8RowPlanes, GroupedPlanes, NvFp4Planes, Planes
from .reading import ReadFn, Rows, _check_zero_gap, _row_range, memory_reader
from .row_scale import _pack_fp8, _unpack_fp8
from .row_split import _pack_row_split, _row_split_gaps, _unpack_row_split
from .words import (
    E2M1_VALUES,
    E4M3FN_VALUES,
    bf16_words_to_f32,
    f16_words_to_f32,
    f32_to_bf16_words,
)

__all__ = [
    "E2M1_VALUES", "E4M3FN_VALUES", "Fp8RowPlanes", "GroupedPlanes", "NvFp4Planes", "Planes", "ReadFn", "Rows",
    "bf16_words_to_f32", "decode_direct_words", "decode_tensor", "dequantize", "encode_direct", "encode_tensor",
    "f16_words_to_f32", "f32_to_bf16_words", "memory_reader", "pack_planes", "unpack_planes",
]


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
