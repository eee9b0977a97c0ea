"""q4/q5/q6/q8 in `row_split_k128_v1`: base, high and scale planes (spec 4.3)."""

from __future__ import annotations

import numpy as np

from ..errors import ArtifactError
from ..formats import (
    RowSplitGeometry,
)
from .planes import GroupedPlanes
from .reading import ReadFn, _check_zero_gap, _first, _read


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
