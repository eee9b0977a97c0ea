"""fp8_e4m3fn_row_bf16 in `row_scale_v1`: E4M3 codes and bf16 row scales (spec 4.5)."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from ..errors import ArtifactError
from ..formats import (
    RowScaleGeometry,
)
from .planes import Fp8RowPlanes
from .reading import ReadFn, _first, _read


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
