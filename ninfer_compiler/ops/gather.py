"""Row gathers: token embedding lookup and the last token of each sequence."""

from __future__ import annotations

from tvm import te
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import op

from .common import dtype_tag


def embedding_lookup(table: nn.Tensor, ids: nn.Tensor, out_dtype: str) -> nn.Tensor:
    """`table[ids]` for int32 `ids` of any shape, cast to the activation dtype."""

    def compute(table: te.Tensor, ids: te.Tensor) -> te.Tensor:
        return te.compute(
            (*ids.shape, table.shape[1]),
            lambda *i: table[ids[i[:-1]], i[-1]].astype(out_dtype),
            name="embedding",
        )

    return op.tensor_expr_op(compute, f"embedding_{dtype_tag(table.dtype)}", [table, ids])


def last_token(x: nn.Tensor) -> nn.Tensor:
    """`x[:, -1, :]` of `[B, T, H]` (prefill needs only the last token's logits)."""

    def compute(x: te.Tensor) -> te.Tensor:
        return te.compute((x.shape[0], x.shape[2]), lambda b, h: x[b, x.shape[1] - 1, h], name="last")

    return op.tensor_expr_op(compute, "last_token", [x])
