"""Direct formats in `contiguous_le_v1` (bf16, fp32, int32), words preserved bit for bit."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from ..errors import ArtifactError
from ..formats import (
    CONTIGUOUS,
    DIRECT_WORD_BYTES,
    elements,
    geometry,
)
from .reading import ReadFn, Rows, _read, _row_range
from .words import f32_to_bf16_words

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
