"""RMS-style norms over the last axis, reduced in fp32 (as HF does for every dtype)."""

from __future__ import annotations

from tvm import te, tirx
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import op

from .common import dtype_tag


def _sum_squares(x: te.Tensor) -> te.Tensor:
    lead, dim = list(x.shape[:-1]), x.shape[-1]
    k = te.reduce_axis((0, dim), name="k")
    return te.compute(
        lead,
        lambda *i: te.sum(x[(*i, k)].astype("float32") * x[(*i, k)].astype("float32"), axis=k),
        name="sum_squares",
    )


def rms_norm(x: nn.Tensor, weight: nn.Tensor, eps: float, offset: bool) -> nn.Tensor:
    """`rms(x) * (1 + w)` (offset, Qwen's zero-centred weights) or `rms(x) * w` (plain).

    Decode-shaped calls on CUDA run the PDL-chained kernel of the decode GEMVs when it is on
    (`qgemv.norm_supported`), so the next projection's weight stream starts during the norm."""
    from . import qgemv  # the GEMV extern owns the kernel (one launcher per package)

    if qgemv.norm_supported(x, weight):
        return qgemv.rms_norm_pdl(x, weight, eps, offset)
    dim = int(x.shape[-1])

    def compute(x: te.Tensor, w: te.Tensor) -> te.Tensor:
        ss = _sum_squares(x)

        def f(*i):
            inv = tirx.rsqrt(ss[i[:-1]] / tirx.const(dim, "float32") + tirx.const(eps, "float32"))
            scale = w[i[-1]].astype("float32")
            if offset:
                scale = scale + tirx.const(1.0, "float32")
            return (x[i].astype("float32") * inv * scale).astype(x.dtype)

        return te.compute(x.shape, f, name="rms_norm")

    kind = "offset_rms_norm" if offset else "rms_norm"
    return op.tensor_expr_op(compute, f"{kind}_{dtype_tag(x.dtype)}_{dtype_tag(weight.dtype)}", [x, weight])


def gated_rms_norm(x: nn.Tensor, weight: nn.Tensor, gate: nn.Tensor, eps: float) -> nn.Tensor:
    """`(rms(x) * w) * silu(gate)`, rounding like HF's `Qwen3_5RMSNormGated`.

    The normalised value is cast to the activation dtype before the weight multiply; the
    gate's SiLU is taken in fp32.
    """
    dim = int(x.shape[-1])
    out_dtype = gate.dtype

    def compute(x: te.Tensor, w: te.Tensor, z: te.Tensor) -> te.Tensor:
        ss = _sum_squares(x)

        def f(*i):
            inv = tirx.rsqrt(ss[i[:-1]] / tirx.const(dim, "float32") + tirx.const(eps, "float32"))
            normed = (x[i].astype("float32") * inv).astype(out_dtype).astype("float32")
            zf = z[i].astype("float32")
            return (normed * w[i[-1]].astype("float32") * zf * tirx.sigmoid(zf)).astype(out_dtype)

        return te.compute(x.shape, f, name="gated_rms_norm")

    return op.tensor_expr_op(compute, f"gated_rms_norm_{dtype_tag(out_dtype)}", [x, weight, gate])


def l2_norm(x: nn.Tensor, eps: float = 1e-6, scale: float = 1.0, out_dtype: str = "float32") -> nn.Tensor:
    """`x / sqrt(sum(x^2) + eps) * scale` computed in fp32, returned as `out_dtype` (fp32 for the
    GDN core by default; fp16 where its kernels round q and k to fp16 anyway)."""

    def compute(x: te.Tensor) -> te.Tensor:
        ss = _sum_squares(x)

        def f(*i):
            y = (x[i].astype("float32") * tirx.rsqrt(ss[i[:-1]] + tirx.const(eps, "float32"))
                 * tirx.const(scale, "float32"))
            return y if out_dtype == "float32" else y.astype(out_dtype)

        return te.compute(x.shape, f, name="l2_norm")

    suffix = "" if out_dtype == "float32" else f"_{dtype_tag(out_dtype)}"
    return op.tensor_expr_op(compute, f"l2_norm_{dtype_tag(x.dtype)}{suffix}", [x])
