"""GDN per-head gates: log decay `g` and write strength `beta`, in fp32."""

from __future__ import annotations

from tvm import te, tirx
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import op

from .common import dtype_tag, kernel_flavor

SOFTPLUS_THRESHOLD = 20.0  # torch's default: softplus(x) = x above it


def gdn_gates(
    a: nn.Tensor, b: nn.Tensor, a_log: nn.Tensor, dt_bias: nn.Tensor
) -> tuple[nn.Tensor, nn.Tensor]:
    """`g = -exp(a_log) * softplus(a + dt_bias)`, `beta = sigmoid(b)` for `a, b [..., Hv]`.

    `beta` is rounded through the activation dtype first, as HF computes it there.
    """
    act_dtype = b.dtype

    def g_of(a: te.Tensor, a_log: te.Tensor, dt_bias: te.Tensor, i: tuple) -> tirx.PrimExpr:
        x = a[i].astype("float32") + dt_bias[i[-1]].astype("float32")
        soft = tirx.Select(x > tirx.const(SOFTPLUS_THRESHOLD, "float32"), x, tirx.log1p(tirx.exp(x)))
        return -tirx.exp(a_log[i[-1]].astype("float32")) * soft

    def beta_of(b: te.Tensor, i: tuple) -> tirx.PrimExpr:
        return tirx.sigmoid(b[i]).astype(act_dtype).astype("float32")

    def decay(a: te.Tensor, a_log: te.Tensor, dt_bias: te.Tensor) -> te.Tensor:
        return te.compute(a.shape, lambda *i: g_of(a, a_log, dt_bias, i), name="gdn_g")

    def strength(b: te.Tensor) -> te.Tensor:
        return te.compute(b.shape, lambda *i: beta_of(b, i), name="gdn_beta")

    tag = dtype_tag(act_dtype)
    if kernel_flavor() == "cpu":
        g, beta = op.tensor_expr_op(
            lambda a, b, a_log, dt_bias: [decay(a, a_log, dt_bias), strength(b)],
            f"gdn_gates_{tag}", [a, b, a_log, dt_bias],
        )
        return g, beta
    # GPU: one output per kernel, so each gate fuses into its projection's matmul as an
    # epilogue (the dlight schedules handle single-output epilogues only).
    g = op.tensor_expr_op(decay, f"gdn_decay_{tag}", [a, a_log, dt_bias])
    beta = op.tensor_expr_op(strength, f"gdn_beta_{tag}", [b])
    return g, beta
