"""Registry of numeric formats and storage layouts (artifact spec sections 3 and 4).

This module is the single source of truth for which format/layout pairs exist, their shape
constraints, alignment and exact encoded sizes. Codecs (`codecs.py`) build on these geometries.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from .errors import ArtifactError

U64_MAX = (1 << 64) - 1
TENSOR_ALIGNMENT = 256
MAX_RANK = 16


def align_up(x: int, a: int) -> int:
    return -(-x // a) * a


@dataclass(frozen=True)
class FormatInfo:
    name: str
    category: str  # "direct", "grouped_int", "block_fp4", "row_fp8"
    bits: int  # bits per logical code / word


@dataclass(frozen=True)
class GroupedIntFormat(FormatInfo):
    group: int
    base_bytes_per_group: int
    high_bytes_per_group: int
    qmax: int

    @property
    def qmin(self) -> int:
        # q8 excludes -128 (0x80 is illegal); the narrower formats use the full range.
        return -127 if self.bits == 8 else -(1 << (self.bits - 1))


FORMATS: dict[str, FormatInfo] = {
    "bf16": FormatInfo("bf16", "direct", 16),
    "fp32": FormatInfo("fp32", "direct", 32),
    "int32": FormatInfo("int32", "direct", 32),
    "q4_g64_fp16": GroupedIntFormat("q4_g64_fp16", "grouped_int", 4, 64, 32, 0, 7),
    "q5_g64_fp16": GroupedIntFormat("q5_g64_fp16", "grouped_int", 5, 64, 32, 8, 15),
    "q6_g64_fp16": GroupedIntFormat("q6_g64_fp16", "grouped_int", 6, 64, 32, 16, 31),
    "q8_g32_fp16": GroupedIntFormat("q8_g32_fp16", "grouped_int", 8, 32, 32, 0, 127),
    "nvfp4": FormatInfo("nvfp4", "block_fp4", 4),
    "fp8_e4m3fn_row_bf16": FormatInfo("fp8_e4m3fn_row_bf16", "row_fp8", 8),
}

DIRECT_WORD_BYTES = {"bf16": 2, "fp32": 4, "int32": 4}

CONTIGUOUS = "contiguous_le_v1"
ROW_SPLIT = "row_split_k128_v1"
BLOCK_SCALE = "block_scale_k16_m128x4_v1"
ROW_SCALE = "row_scale_v1"
RAW_BYTES = "raw_bytes_v1"

LAYOUT_FORMATS: dict[str, frozenset[str]] = {
    CONTIGUOUS: frozenset({"bf16", "fp32", "int32"}),
    ROW_SPLIT: frozenset({"q4_g64_fp16", "q5_g64_fp16", "q6_g64_fp16", "q8_g32_fp16"}),
    BLOCK_SCALE: frozenset({"nvfp4"}),
    ROW_SCALE: frozenset({"fp8_e4m3fn_row_bf16"}),
}
RESOURCE_ENCODINGS = frozenset({RAW_BYTES})


@dataclass(frozen=True)
class RowSplitGeometry:
    """Plane geometry of one `row_split_k128_v1` object (spec 4.3.1)."""

    fmt: GroupedIntFormat
    rows: int
    cols: int

    @property
    def k_pad(self) -> int:
        return align_up(self.cols, 128)

    @property
    def groups_per_row(self) -> int:
        return self.k_pad // self.fmt.group

    @property
    def base_row_bytes(self) -> int:
        return self.groups_per_row * self.fmt.base_bytes_per_group

    @property
    def high_row_bytes(self) -> int:
        return self.groups_per_row * self.fmt.high_bytes_per_group

    @property
    def scale_row_bytes(self) -> int:
        return self.groups_per_row * 2

    @property
    def base_bytes(self) -> int:
        return self.rows * self.base_row_bytes

    @property
    def high_bytes(self) -> int:
        return self.rows * self.high_row_bytes

    @property
    def scale_bytes(self) -> int:
        return self.rows * self.scale_row_bytes

    @property
    def high_offset(self) -> int:
        return align_up(self.base_bytes, 256)

    @property
    def scale_offset(self) -> int:
        return self.high_offset + align_up(self.high_bytes, 256)

    @property
    def encoded_size(self) -> int:
        return self.scale_offset + self.scale_bytes


@dataclass(frozen=True)
class BlockScaleGeometry:
    """Plane geometry of one `block_scale_k16_m128x4_v1` (nvfp4) object (spec 4.4)."""

    rows: int
    cols: int

    @property
    def code_bytes(self) -> int:
        return self.rows * self.cols // 2

    @property
    def scale_offset(self) -> int:
        return align_up(self.code_bytes, 256)

    @property
    def scale_bytes(self) -> int:
        return self.rows * self.cols // 16

    @property
    def divisor_offset(self) -> int:
        return self.scale_offset + self.scale_bytes

    @property
    def encoded_size(self) -> int:
        return self.divisor_offset + 4


@dataclass(frozen=True)
class RowScaleGeometry:
    """Plane geometry of one `row_scale_v1` (fp8 row-scaled) object (spec 4.5)."""

    rows: int
    cols: int

    @property
    def code_bytes(self) -> int:
        return self.rows * self.cols

    @property
    def scale_offset(self) -> int:
        return align_up(self.code_bytes, 256)

    @property
    def encoded_size(self) -> int:
        return self.scale_offset + 2 * self.rows


def elements(shape: tuple[int, ...] | list[int]) -> int:
    return prod(shape) if shape else 1


def _matrix(layout: str, fmt: str, shape: tuple[int, ...], obj: str | None) -> tuple[int, int]:
    if len(shape) != 2 or shape[0] < 1 or shape[1] < 1:
        raise ArtifactError(
            "layout_shape",
            f"layout {layout} with format {fmt} needs a rank-2 shape [N, K] of positive "
            f"dimensions, got {list(shape)}",
            obj=obj,
        )
    return shape[0], shape[1]


def check_pair(layout: str, fmt: str, obj: str | None = None) -> None:
    """Raise unless `fmt` is a registered format accepted by the registered `layout`."""
    if layout not in LAYOUT_FORMATS:
        raise ArtifactError("unknown_layout", f"unknown storage layout {layout!r}", obj=obj)
    if fmt not in FORMATS:
        raise ArtifactError("unknown_format", f"unknown numeric format {fmt!r}", obj=obj)
    if fmt not in LAYOUT_FORMATS[layout]:
        raise ArtifactError(
            "format_layout",
            f"format {fmt!r} is not accepted by layout {layout!r} "
            f"(accepted: {', '.join(sorted(LAYOUT_FORMATS[layout]))})",
            obj=obj,
        )


def geometry(layout: str, fmt: str, shape: tuple[int, ...] | list[int], obj: str | None = None):
    """Validated geometry of a tensor: the layout's shape rules, then its plane structure.

    Returns `None` for `contiguous_le_v1` (which has no planes), else a *Geometry object.
    """
    shape = tuple(shape)
    check_pair(layout, fmt, obj)
    if layout == CONTIGUOUS:
        if len(shape) > MAX_RANK or any(d < 1 for d in shape):
            raise ArtifactError(
                "layout_shape", f"contiguous_le_v1 needs rank <= 16 with positive dims, got {list(shape)}", obj=obj
            )
        return None
    n, k = _matrix(layout, fmt, shape, obj)
    if layout == ROW_SPLIT:
        info = FORMATS[fmt]
        assert isinstance(info, GroupedIntFormat)
        return RowSplitGeometry(info, n, k)
    if layout == BLOCK_SCALE:
        if n % 128 or k % 64:
            raise ArtifactError(
                "layout_shape",
                f"block_scale_k16_m128x4_v1 needs N % 128 == 0 and K % 64 == 0, got [{n}, {k}]",
                obj=obj,
            )
        return BlockScaleGeometry(n, k)
    return RowScaleGeometry(n, k)


def encoded_size(layout: str, fmt: str, shape: tuple[int, ...] | list[int], obj: str | None = None) -> int:
    """Exact encoded byte length of a tensor (spec 4.7)."""
    geo = geometry(layout, fmt, shape, obj)
    if geo is None:
        return elements(tuple(shape)) * DIRECT_WORD_BYTES[fmt]
    return geo.encoded_size


def alignment(layout: str) -> int:
    """Required offset alignment of an object stored with `layout` (256 for tensors, 1 raw)."""
    return 1 if layout in RESOURCE_ENCODINGS else TENSOR_ALIGNMENT
