"""Dense SwiGLU feed-forward block (`Qwen3_5MLP`)."""

from __future__ import annotations

from tvm.relax.frontend import nn

from ...ops import fused_linear
from ..options import WeightPlan
from .linear import make_linear
from .norms import OffsetRMSNorm


class SwiGLU(nn.Module):
    """`down(silu(gate(x)) * up(x))`; parameters `gate`, `up` `[I, H]`, `down` `[H, I]`."""

    def __init__(self, hidden: int, intermediate: int, plan: WeightPlan, path: str):
        self.gate = make_linear(hidden, intermediate, plan, f"{path}.gate")
        self.up = make_linear(hidden, intermediate, plan, f"{path}.up")
        self.down = make_linear(intermediate, hidden, plan, f"{path}.down")

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        return self.down(fused_linear.swiglu(x, self.gate, self.up))

    def forward_add(self, x: nn.Tensor, residual: nn.Tensor) -> nn.Tensor:
        """`residual + forward(x)`, the add fused into the down projection where it can be."""
        return fused_linear.linear_add(fused_linear.swiglu(x, self.gate, self.up), self.down, residual)

    def forward_norm_add(self, norm: OffsetRMSNorm, x: nn.Tensor) -> nn.Tensor:
        """`x + forward(norm(x))` (a decoder layer's feed-forward half); at decode the norm may also
        hand the gate / up its output as int8 activations (`fused_linear.norm_swiglu`), and the SwiGLU
        the down projection its output (`fused_linear.norm_mlp_add`)."""
        y = fused_linear.norm_mlp_add(x, norm.weight, norm.eps, True, self.gate, self.up, self.down)
        if y is not None:
            return y
        h = fused_linear.norm_swiglu(x, norm.weight, norm.eps, True, self.gate, self.up)
        if h is None:
            h = fused_linear.swiglu(norm(x), self.gate, self.up)
        return fused_linear.linear_add(h, self.down, x)
