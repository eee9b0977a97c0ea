"""Linear layers whose parameters are exactly the artifact's stored tensors.

`Linear` holds a dense `weight [out, in]` (fp32/bf16/fp16, consumed as stored);
`make_linear` picks the module for a parameter's format, so a model declares its
projections once and the weight plan decides the storage per parameter.
"""

from __future__ import annotations

from tvm.relax.frontend import nn

from ...ops.matmul import dense_nt
from ..options import DENSE_DTYPES, WeightPlan


class Linear(nn.Module):
    """`y = x @ W^T` without bias; fp32 accumulation, output in the activation dtype."""

    def __init__(self, in_features: int, out_features: int, weight_dtype: str = "float32"):
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter((out_features, in_features), weight_dtype)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        return dense_nt(x, self.weight)


def make_linear(in_features: int, out_features: int, plan: WeightPlan, path: str) -> nn.Module:
    """The linear module for parameter `path` under `plan` (dense or grouped-int)."""
    fmt = plan.format_of(path)
    if fmt in DENSE_DTYPES.values():
        return Linear(in_features, out_features, fmt)
    from .quantized_linear import QuantizedLinear

    return QuantizedLinear(in_features, out_features, fmt)
