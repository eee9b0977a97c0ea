"""Dense `x @ W^T` with fp32 accumulation, weights consumed in their stored dtype.

A bf16 (or fp16) weight is cast element by element inside the reduction, so it is never
expanded to fp32 in memory. The result has the activation dtype. One TE op with a single
reduction block: the shape GPU matmul/GEMV schedules recognise. On CUDA targets, decode-shaped
bf16 calls with a small N (the GDN gate projections) go to our GEMV (`ops/qgemv.py`) and
prefill-shaped ones to the tensor-core GEMM (`ops/dense_triton.py`) instead.
"""

from __future__ import annotations

from tvm import te
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import op

from . import dense_triton, qgemv
from .common import dtype_tag, tuned_cuda_kernels


def _decode_shaped(x: nn.Tensor) -> bool:
    return len(x.shape) == 3 and isinstance(x.shape[1], int) and x.shape[1] == 1


def dense_nt(x: nn.Tensor, weight: nn.Tensor) -> nn.Tensor:
    """`y[..., n] = sum_k x[..., k] * weight[n, k]` for `x [..., K]`, `weight [N, K]`."""
    out_dtype = x.dtype
    if tuned_cuda_kernels():
        if qgemv.dense_supported(x, weight):  # decode, small N
            return qgemv.dense_gemv(x, weight)
        if dense_triton.supported(x, weight) and not _decode_shaped(x):  # prefill
            return dense_triton.dense_nt(x, weight)

    def compute(x: te.Tensor, w: te.Tensor) -> te.Tensor:
        lead, k_dim = list(x.shape[:-1]), x.shape[-1]
        k = te.reduce_axis((0, k_dim), name="k")
        acc = te.compute(
            (*lead, w.shape[0]),
            lambda *i: te.sum(
                x[(*i[:-1], k)].astype("float32") * w[i[-1], k].astype("float32"), axis=k
            ),
            name="matmul",
        )
        if out_dtype == "float32":
            return acc
        return te.compute(acc.shape, lambda *i: acc[i].astype(out_dtype), name="cast")

    name = f"dense_nt_{dtype_tag(x.dtype)}_{dtype_tag(weight.dtype)}"
    return op.tensor_expr_op(compute, name, [x, weight])
