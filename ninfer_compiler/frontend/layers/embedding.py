"""Token embedding table `[V, H]` (dense `weight`, or grouped-int / fp8-row planes), looked up by id."""

from __future__ import annotations

from tvm.relax.frontend import nn

from ...ops.gather import embedding_lookup
from ...ops.matmul import dense_nt
from ..options import DENSE_DTYPES, WeightPlan


class Embedding(nn.Module):
    """Rows of `weight` for int32 ids, cast to the activation dtype."""

    def __init__(self, num_rows: int, dim: int, weight_dtype: str, out_dtype: str):
        self.out_dtype = out_dtype
        self.weight = nn.Parameter((num_rows, dim), weight_dtype)

    def forward(self, ids: nn.Tensor) -> nn.Tensor:
        return embedding_lookup(self.weight, ids, self.out_dtype)

    def as_head(self, x: nn.Tensor) -> nn.Tensor:
        """`x @ table^T`: the output head of a model with tied embeddings."""
        return dense_nt(x, self.weight)


def make_embedding(num_rows: int, dim: int, plan: WeightPlan, path: str, out_dtype: str) -> nn.Module:
    """The embedding module for parameter `path` under `plan` (dense, grouped-int or fp8-row)."""
    fmt = plan.format_of(path)
    if fmt in DENSE_DTYPES.values():
        return Embedding(num_rows, dim, fmt, out_dtype)
    from .quantized_linear import QuantizedEmbedding

    return QuantizedEmbedding(num_rows, dim, fmt, out_dtype)

