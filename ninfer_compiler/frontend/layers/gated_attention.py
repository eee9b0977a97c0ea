"""Gated full attention (`Qwen3_5Attention`) over the paged KV pool.

Parameters mirror the artifact bindings: `query` and `gate` `[Nq*D, H]` (already
de-interleaved per head), `key`, `value` `[Nkv*D, H]`, `query_norm`, `key_norm` `[D]`
(offset norms), `output` `[H, Nq*D]`.
"""

from __future__ import annotations

from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import op

from ...ops import attention_prologue, fused_linear
from ...ops.paged_attention import gated_paged_attention, gated_xq_supported, kv_append
from ..options import WeightPlan
from .linear import make_linear
from .norms import OffsetRMSNorm
from .rope import MRope


class GatedAttention(nn.Module):
    """q/k-normed, MRoPE'd GQA attention whose output is gated by `sigmoid(gate)`."""

    def __init__(
        self,
        hidden: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        eps: float,
        rope: MRope,
        plan: WeightPlan,
        path: str,
    ):
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.rope = rope
        q_width, kv_width = num_heads * head_dim, num_kv_heads * head_dim
        self.query = make_linear(hidden, q_width, plan, f"{path}.query")
        self.gate = make_linear(hidden, q_width, plan, f"{path}.gate")
        self.key = make_linear(hidden, kv_width, plan, f"{path}.key")
        self.value = make_linear(hidden, kv_width, plan, f"{path}.value")
        self.query_norm = OffsetRMSNorm(head_dim, eps, plan.dense_dtype_of(f"{path}.query_norm"))
        self.key_norm = OffsetRMSNorm(head_dim, eps, plan.dense_dtype_of(f"{path}.key_norm"))
        self.output = make_linear(q_width, hidden, plan, f"{path}.output")

    def decode_projections(self) -> list[nn.Module]:
        """The projections of h that decode runs in one multi launch (what `h_xq` is for)."""
        return [self.query, self.gate, self.key, self.value]

    def forward(
        self,
        h: nn.Tensor,
        positions: nn.Tensor,
        kv_pool: nn.Tensor,
        page_table: nn.Tensor,
        seq_lens: nn.Tensor,
        layer: int,
        page_size: int,
        residual: nn.Tensor,
        h_xq: nn.Tensor | None = None,
    ) -> tuple[nn.Tensor, nn.Tensor]:
        """`h [B, T, H]` -> `(residual + y [B, T, H], kv_pool)`; `layer` indexes attention layers only.
        `h_xq`: h also as the input norm's int8 activations (`decode_projections`), for the multi launch."""
        b, t = h.shape[0], h.shape[1]
        d = self.head_dim
        q, gate, k, v = fused_linear.multi_linear(
            h, [[self.query], [self.gate], [self.key], [self.value]], xq=h_xq
        )
        if (attention_prologue.supported(q, kv_pool, d, self.rope.rotary_dim)
                and self.query_norm.eps == self.key_norm.eps):
            # q/k norms, MRoPE and the K/V append in one kernel
            q, kv_pool = attention_prologue.attention_prologue(
                q, k, v, self.query_norm.weight, self.key_norm.weight, positions, kv_pool, page_table,
                seq_lens, layer, self.query_norm.eps, num_heads=self.num_heads,
                num_kv_heads=self.num_kv_heads, head_dim=d, page_size=page_size,
                rotary_dim=self.rope.rotary_dim, theta=self.rope.theta, sections=self.rope.sections,
            )
        else:
            q = op.reshape(q, [b, t, self.num_heads, d])
            k = op.reshape(k, [b, t, self.num_kv_heads, d])
            v = op.reshape(v, [b, t, self.num_kv_heads, d])
            q = self.rope(self.query_norm(q), positions)
            k = self.rope(self.key_norm(k), positions)
            kv_pool = kv_append(kv_pool, k, v, page_table, seq_lens, layer, page_size)
        # decode on CUDA: the combine also writes its output as int8 activations where the output
        # projection reads them (the gate has the output's shape and dtype)
        if gated_xq_supported(q, kv_pool, page_size) and fused_linear.add_reads_int8(
                gate, self.output, "gemv_int8_attn_out"):
            o, oq = gated_paged_attention(q, kv_pool, page_table, seq_lens, layer, page_size, gate, with_xq=True)
            return fused_linear.linear_add_i8(o, oq, self.output, residual), kv_pool
        o = gated_paged_attention(q, kv_pool, page_table, seq_lens, layer, page_size, gate)
        return fused_linear.linear_add(o, self.output, residual), kv_pool
