"""Dequantize-fused matmul and embedding gather over grouped-int planes (see `row_split`).

`dequant_matmul` is one TE op with two blocks, a dequantize block `w[n, k] = scale * code`
over the logical `[N, K]` and an fp32 reduction `y = x @ w^T`: the two-block shape that GPU
GEMV/low-batch schedules fuse without materialising the weight (tvm-0.27 notes 6.2). The
weights stay in their stored planes; nothing is expanded offline.
"""

from __future__ import annotations

from collections.abc import Callable

from tvm import te, tirx
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import op

from . import qgemm, qgemv
from .common import dtype_tag, tuned_cuda_kernels
from .row_split import grouped_format


def _i32(x: tirx.PrimExpr) -> tirx.PrimExpr:
    return x.astype("int32")


def dequant_element(
    fmt: str, base: te.Tensor, high: te.Tensor | None, scales: te.Tensor
) -> Callable[[tirx.PrimExpr, tirx.PrimExpr], tirx.PrimExpr]:
    """`(row, col) -> fp32 weight` reading the planes (spec 4.3.3-4.3.5)."""
    info = grouped_format(fmt)
    bits, group = info.bits, info.group

    def element(n: tirx.PrimExpr, k: tirx.PrimExpr) -> tirx.PrimExpr:
        g = k // group
        lane = k % group
        if bits == 8:
            u = _i32(base[n, g * 32 + lane])
        else:
            byte = _i32(base[n, g * 32 + lane // 2])
            u = (byte >> (_i32(lane % 2) * 4)) & 0xF
            if bits == 5:
                hb = (_i32(high[n, g * 8 + lane // 8]) >> _i32(lane % 8)) & 1
                u = u | (hb << 4)
            elif bits == 6:
                hb = (_i32(high[n, g * 16 + lane // 4]) >> (_i32(lane % 4) * 2)) & 3
                u = u | (hb << 4)
        code = u - tirx.Select(u >= (1 << (bits - 1)), 1 << bits, 0)
        return scales[n, g].astype("float32") * code.astype("float32")

    return element


def _planes(base: nn.Tensor, high: nn.Tensor | None, scales: nn.Tensor) -> list[nn.Tensor]:
    return [base, scales] if high is None else [base, high, scales]


def dequant_matmul(
    x: nn.Tensor,
    base: nn.Tensor,
    high: nn.Tensor | None,
    scales: nn.Tensor,
    fmt: str,
    in_features: int,
) -> nn.Tensor:
    """`y[..., n] = sum_k x[..., k] * W[n, k]` with `W` the dequantised planes (fp32 acc).

    On CUDA targets decode-shaped calls (`[b, 1, K]`) go to our GEMV (`ops/qgemv.py`) and
    prefill-shaped ones to our tensor-core GEMM (`ops/qgemm.py`); CPU and the reference
    kernels (`ops.common.reference_kernels`) keep this TE op.
    """
    out_dtype = x.dtype
    rows = int(base.shape[0])
    if tuned_cuda_kernels():
        if qgemv.supported(x, rows, in_features):
            return qgemv.qgemv(x, base, high, scales, fmt)
        if qgemm.supported(x, rows, in_features):
            return qgemm.qgemm(x, base, high, scales, fmt)

    def compute(x: te.Tensor, *planes: te.Tensor) -> te.Tensor:
        b, s = planes[0], planes[-1]
        h = planes[1] if len(planes) == 3 else None
        element = dequant_element(fmt, b, h, s)
        w = te.compute((rows, in_features), element, name="dequantize")
        k = te.reduce_axis((0, in_features), name="k")
        acc = te.compute(
            (*x.shape[:-1], rows),
            lambda *i: te.sum(x[(*i[:-1], k)].astype("float32") * w[i[-1], k], axis=k),
            name="matmul",
        )
        if out_dtype == "float32":
            return acc
        return te.compute(acc.shape, lambda *i: acc[i].astype(out_dtype), name="cast")

    name = f"dequant_matmul_{fmt.split('_')[0]}_{dtype_tag(out_dtype)}"
    return op.tensor_expr_op(compute, name, [x, *_planes(base, high, scales)])


def dequant_embedding(
    ids: nn.Tensor,
    base: nn.Tensor,
    high: nn.Tensor | None,
    scales: nn.Tensor,
    fmt: str,
    dim: int,
    out_dtype: str,
) -> nn.Tensor:
    """Rows `ids` of a grouped-int table `[V, dim]`, dequantised to `out_dtype`."""

    def compute(ids: te.Tensor, *planes: te.Tensor) -> te.Tensor:
        b, s = planes[0], planes[-1]
        h = planes[1] if len(planes) == 3 else None
        element = dequant_element(fmt, b, h, s)
        return te.compute(
            (*ids.shape, dim),
            lambda *i: element(ids[i[:-1]], i[-1]).astype(out_dtype),
            name="embedding",
        )

    name = f"dequant_embedding_{fmt.split('_')[0]}_{dtype_tag(out_dtype)}"
    return op.tensor_expr_op(compute, name, [ids, *_planes(base, high, scales)])
