"""Plane tensors of `row_split_k128_v1` grouped-int weights (artifact spec 3.2, 4.3), in numpy.

A grouped-int matrix `[N, K]` is consumed by our kernels as three parameters that are
exactly the artifact's planes, viewed per row:

* `base`   uint8   `[N, groups_per_row * 32]`: q4/q5/q6 low nibbles (even lane in the low
  nibble), q8 one two's-complement byte per lane;
* `high`   uint8   `[N, groups_per_row * H]` (q5: H = 8, bit 4 of lane `8j+t` at byte j bit t;
  q6: H = 16, lane i's two high bits at byte `i >> 2`, shift `2 (i & 3)`); absent for q4/q8;
* `scales` float16 `[N, groups_per_row]`, one multiplier per group.

`K` is padded to a multiple of 128 in the planes only. This module splits an encoded object
into these views, and holds the reference encoder/decoder that tests and the HF path use.
"""

from __future__ import annotations

import numpy as np

from ninfer_runtime.artifact.formats import FORMATS, GroupedIntFormat, RowSplitGeometry

PLANES = ("base", "high", "scales")


def grouped_format(fmt: str) -> GroupedIntFormat:
    info = FORMATS.get(fmt)
    if not isinstance(info, GroupedIntFormat):
        raise ValueError(f"{fmt!r} is not a grouped-int format (q4_g64_fp16, ..., q8_g32_fp16)")
    return info


def plane_shapes(fmt: str, rows: int, cols: int) -> dict[str, tuple[tuple[int, int], str]]:
    """`{plane: (shape, dtype)}` of the parameters of a `[rows, cols]` matrix in `fmt`."""
    geo = RowSplitGeometry(grouped_format(fmt), rows, cols)
    shapes = {"base": ((rows, geo.base_row_bytes), "uint8")}
    if geo.high_row_bytes:
        shapes["high"] = ((rows, geo.high_row_bytes), "uint8")
    shapes["scales"] = ((rows, geo.groups_per_row), "float16")
    return shapes


def planes_from_object(data: bytes | np.ndarray, fmt: str, rows: int, cols: int) -> dict[str, np.ndarray]:
    """Zero-copy plane views of one encoded object (the binder's job, spec 4.3.1)."""
    geo = RowSplitGeometry(grouped_format(fmt), rows, cols)
    buf = np.frombuffer(data, dtype=np.uint8) if isinstance(data, bytes | bytearray) else data
    if buf.size != geo.encoded_size:
        raise ValueError(f"{fmt} [{rows}, {cols}] needs {geo.encoded_size} bytes, got {buf.size}")
    out = {"base": buf[: geo.base_bytes].reshape(rows, geo.base_row_bytes)}
    if geo.high_row_bytes:
        out["high"] = buf[geo.high_offset : geo.high_offset + geo.high_bytes].reshape(
            rows, geo.high_row_bytes
        )
    scale = buf[geo.scale_offset : geo.scale_offset + geo.scale_bytes]
    out["scales"] = scale.view("<f2").reshape(rows, geo.groups_per_row)
    return out


def object_from_planes(planes: dict[str, np.ndarray], fmt: str, rows: int, cols: int) -> bytes:
    """The encoded object bytes (planes at their aligned offsets, zero gaps)."""
    geo = RowSplitGeometry(grouped_format(fmt), rows, cols)
    buf = np.zeros(geo.encoded_size, dtype=np.uint8)
    buf[: geo.base_bytes] = planes["base"].reshape(-1)
    if geo.high_row_bytes:
        buf[geo.high_offset : geo.high_offset + geo.high_bytes] = planes["high"].reshape(-1)
    buf[geo.scale_offset :] = planes["scales"].astype("<f2").view(np.uint8).reshape(-1)
    return buf.tobytes()


def quantize_codes(w: np.ndarray, fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """Reference `grouped_absmax` encoder: `(codes int32 [N, K_pad], scales f16 [N, groups])`."""
    info = grouped_format(fmt)
    rows, cols = w.shape
    geo = RowSplitGeometry(info, rows, cols)
    x = np.zeros((rows, geo.k_pad), dtype=np.float32)
    x[:, :cols] = w
    if not np.isfinite(x).all():
        raise ValueError("cannot encode non-finite weights")
    groups = x.reshape(rows, geo.groups_per_row, info.group)
    amax = np.abs(groups).max(-1)
    scale = (amax / np.float32(info.qmax)).astype(np.float32).astype(np.float16)
    scale = np.where((scale == 0) & (amax > 0), np.float16(2.0**-24), scale)
    if np.isinf(scale).any():
        raise ValueError(f"a group's max |w| overflows the {fmt} fp16 scale")
    with np.errstate(divide="ignore"):
        inv = np.where(scale > 0, np.float32(1) / scale.astype(np.float32), np.float32(0))
    codes = np.rint((groups * inv[..., None]).astype(np.float32))
    codes = np.clip(codes, info.qmin, info.qmax).astype(np.int32)
    return codes.reshape(rows, geo.k_pad), scale


def pack_planes(codes: np.ndarray, scales: np.ndarray, fmt: str) -> dict[str, np.ndarray]:
    """Pack signed codes `[N, K_pad]` and scales into the plane arrays (spec 4.3.3-4.3.5)."""
    info = grouped_format(fmt)
    rows = codes.shape[0]
    u = (codes & ((1 << info.bits) - 1)).astype(np.uint8)
    if info.bits == 8:
        base = u
    else:
        base = (u[:, 0::2] & 0xF) | ((u[:, 1::2] & 0xF) << 4)
    out = {"base": np.ascontiguousarray(base.reshape(rows, -1))}
    hi = (u >> 4).astype(np.uint8)
    if info.bits == 5:
        bits = hi.reshape(rows, -1, 8) & 1
        out["high"] = (bits << np.arange(8, dtype=np.uint8)).sum(-1).astype(np.uint8)
    elif info.bits == 6:
        pairs = hi.reshape(rows, -1, 4) & 3
        out["high"] = (pairs << (2 * np.arange(4, dtype=np.uint8))).sum(-1).astype(np.uint8)
    out["scales"] = np.ascontiguousarray(scales.astype(np.float16))
    return out


def encode_row_split(w: np.ndarray, fmt: str) -> dict[str, np.ndarray]:
    """fp32 `[N, K]` -> plane arrays, with the reference encoder."""
    codes, scales = quantize_codes(np.asarray(w, dtype=np.float32), fmt)
    return pack_planes(codes, scales, fmt)


def decode_row_split(planes: dict[str, np.ndarray], fmt: str, cols: int) -> np.ndarray:
    """Plane arrays -> fp32 `[N, K]` (`scale * code`, spec 3.2), the numpy reference."""
    info = grouped_format(fmt)
    base = planes["base"]
    rows = base.shape[0]
    if info.bits == 8:
        u = base.astype(np.int32)
    else:
        u = np.empty((rows, base.shape[1] * 2), dtype=np.int32)
        u[:, 0::2] = base & 0xF
        u[:, 1::2] = base >> 4
        if info.bits == 5:
            hi = (planes["high"][:, :, None] >> np.arange(8, dtype=np.uint8)) & 1
            u |= hi.reshape(rows, -1).astype(np.int32) << 4
        elif info.bits == 6:
            hi = (planes["high"][:, :, None] >> (2 * np.arange(4, dtype=np.uint8))) & 3
            u |= hi.reshape(rows, -1).astype(np.int32) << 4
    half = 1 << (info.bits - 1)
    q = np.where(u >= half, u - (1 << info.bits), u).astype(np.float32)
    scale = np.repeat(planes["scales"].astype(np.float32), info.group, axis=1)
    return (scale * q)[:, :cols]
