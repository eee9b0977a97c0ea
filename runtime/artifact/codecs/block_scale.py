"""nvfp4 in `block_scale_k16_m128x4_v1`: codes, swizzled E4M3 scales, divisor (spec 4.4)."""

from __future__ import annotations

import numpy as np

from ..errors import ArtifactError
from ..formats import (
    BlockScaleGeometry,
)
from .planes import NvFp4Planes
from .reading import ReadFn, _first, _read


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
