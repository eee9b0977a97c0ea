"""Linear layer over grouped-int (q4/q5/q6/q8), nvfp4 or fp8-row weights stored as the artifact's planes.

Grouped-int parameters `base`, `high` (q5/q6 only) and `scales` are the row views of a
`row_split_k128_v1` object (`ops.row_split`), bound 1:1 without repacking. nvfp4 parameters
`codes`, `block_scales` and `divisor` are the planes of a `block_scale_k16_m128x4_v1` object
(`ops.nvfp4`; the scales un-swizzled at load time). fp8_e4m3fn_row_bf16 parameters `codes`
(uint8 `[N, K]`) and `row_scales` (bf16 `[N]`) are the two planes of a `row_scale_v1` object
(`ops.fp8_row`), bound as stored.
"""

from __future__ import annotations

from tvm.relax.frontend import nn

from ...ops import fp8_row, nvfp4
from ...ops.dequant_matmul import dequant_embedding, dequant_matmul
from ...ops.row_split import plane_shapes


class QuantizedLinear(nn.Module):
    """`y = x @ W^T` with `W [out, in]` dequantised inside the matmul kernel."""

    def __init__(self, in_features: int, out_features: int, fmt: str):
        self.in_features, self.out_features, self.fmt = in_features, out_features, fmt
        if fmt == "nvfp4":
            planes = nvfp4.plane_shapes(out_features, in_features)
            self.codes = nn.Parameter(*planes["codes"])
            self.block_scales = nn.Parameter(*planes["block_scales"])
            self.divisor = nn.Parameter(*planes["divisor"])
            return
        if fmt == fp8_row.FORMAT:
            planes = fp8_row.plane_shapes(out_features, in_features)
            self.codes = nn.Parameter(*planes["codes"])
            self.row_scales = nn.Parameter(*planes["row_scales"])
            return
        shapes = plane_shapes(fmt, out_features, in_features)
        self.base = nn.Parameter(*shapes["base"])
        self.high = nn.Parameter(*shapes["high"]) if "high" in shapes else None
        self.scales = nn.Parameter(*shapes["scales"])

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        if self.fmt == "nvfp4":
            return nvfp4.nvfp4_matmul(x, self.codes, self.block_scales, self.divisor, self.in_features)
        if self.fmt == fp8_row.FORMAT:
            return fp8_row.fp8_row_matmul(x, self.codes, self.row_scales, self.in_features)
        return dequant_matmul(x, self.base, self.high, self.scales, self.fmt, self.in_features)


class QuantizedEmbedding(nn.Module):
    """Token embedding whose table `[V, H]` is stored grouped-int or fp8-row."""

    def __init__(self, num_rows: int, dim: int, fmt: str, out_dtype: str):
        self.dim, self.fmt, self.out_dtype = dim, fmt, out_dtype
        if fmt == fp8_row.FORMAT:
            planes = fp8_row.plane_shapes(num_rows, dim)
            self.codes = nn.Parameter(*planes["codes"])
            self.row_scales = nn.Parameter(*planes["row_scales"])
            return
        shapes = plane_shapes(fmt, num_rows, dim)
        self.base = nn.Parameter(*shapes["base"])
        self.high = nn.Parameter(*shapes["high"]) if "high" in shapes else None
        self.scales = nn.Parameter(*shapes["scales"])

    def forward(self, ids: nn.Tensor) -> nn.Tensor:
        if self.fmt == fp8_row.FORMAT:
            return fp8_row.fp8_row_embedding(ids, self.codes, self.row_scales, self.dim, self.out_dtype)
        return dequant_embedding(
            ids, self.base, self.high, self.scales, self.fmt, self.dim, self.out_dtype
        )

    def as_head(self, x: nn.Tensor) -> nn.Tensor:
        """`x @ table^T`: the output head of a model with tied embeddings."""
        if self.fmt == fp8_row.FORMAT:
            return fp8_row.fp8_row_matmul(x, self.codes, self.row_scales, self.dim)
        return dequant_matmul(x, self.base, self.high, self.scales, self.fmt, self.dim)
