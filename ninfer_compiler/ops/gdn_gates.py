"""GDN per-head gates: log decay `g` and write strength `beta`, in fp32."""

from __future__ import annotations

from tvm import te, tirx
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import op

from .common import dtype_tag

SOFTPLUS_THRESHOLD = 20.0  # torch's default: softplus(x) = x above it


def gdn_gates(
    a: nn.Tensor, b: nn.Tensor, a_log: nn.Tensor, dt_bias: nn.Tensor
) -> tuple[nn.Tensor, nn.Tensor]:
    """`g = -exp(a_log) * softplus(a + dt_bias)`, `beta = sigmoid(b)` for `a, b [..., Hv]`.

    `beta` is rounded through the activation dtype first, as HF computes it there.
    """
    act_dtype = b.dtype

    def compute(a: te.Tensor, b: te.Tensor, a_log: te.Tensor, dt_bias: te.Tensor):
        def g_fn(*i):
            x = a[i].astype("float32") + dt_bias[i[-1]].astype("float32")
            soft = tirx.Select(
                x > tirx.const(SOFTPLUS_THRESHOLD, "float32"), x, tirx.log1p(tirx.exp(x))
            )
            return -tirx.exp(a_log[i[-1]].astype("float32")) * soft

        def beta_fn(*i):
            return tirx.sigmoid(b[i]).astype(act_dtype).astype("float32")

        g = te.compute(a.shape, g_fn, name="gdn_g")
        beta = te.compute(b.shape, beta_fn, name="gdn_beta")
        return [g, beta]

    g, beta = op.tensor_expr_op(compute, f"gdn_gates_{dtype_tag(act_dtype)}", [a, b, a_log, dt_bias])
    return g, beta
