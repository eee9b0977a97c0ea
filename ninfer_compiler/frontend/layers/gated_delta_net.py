"""Gated DeltaNet linear attention (`Qwen3_5GatedDeltaNet`) with slot-indexed state.

Parameters mirror the artifact bindings: `query`, `key` `[Hk*dk, H]`, `value`, `z`
`[Hv*dv, H]`, `a_projection`, `b_projection` `[Hv, H]`, `a_log`, `dt_bias` `[Hv]` (fp32),
`convolution` `[K, C]` tap-major over the channels `[query | key | value]`, `norm` `[dv]`
(plain gated norm), `output` `[H, Hv*dv]`.
"""

from __future__ import annotations

from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import op

from ...ops import fused_linear, gdn_chunked_triton, gdn_decode_fused
from ...ops.conv1d import causal_conv1d_with_state
from ...ops.gated_delta_rule import gated_delta_rule
from ...ops.gdn_gates import gdn_gates
from ...ops.norm import l2_norm
from ..options import WeightPlan
from .linear import Linear, make_linear
from .norms import GatedRMSNorm


class GatedDeltaNet(nn.Module):
    """Short causal conv + gated delta rule + gated norm, for `[B, T]` token blocks."""

    def __init__(
        self,
        hidden: int,
        num_k_heads: int,
        num_v_heads: int,
        k_head_dim: int,
        v_head_dim: int,
        conv_kernel: int,
        eps: float,
        plan: WeightPlan,
        path: str,
    ):
        self.hk, self.hv, self.dk, self.dv = num_k_heads, num_v_heads, k_head_dim, v_head_dim
        key_width, value_width = num_k_heads * k_head_dim, num_v_heads * v_head_dim
        self.conv_channels = 2 * key_width + value_width
        self.query = make_linear(hidden, key_width, plan, f"{path}.query")
        self.key = make_linear(hidden, key_width, plan, f"{path}.key")
        self.value = make_linear(hidden, value_width, plan, f"{path}.value")
        self.z = make_linear(hidden, value_width, plan, f"{path}.z")
        self.a_projection = make_linear(hidden, num_v_heads, plan, f"{path}.a_projection")
        self.b_projection = make_linear(hidden, num_v_heads, plan, f"{path}.b_projection")
        self.a_log = nn.Parameter((num_v_heads,), "float32")
        self.dt_bias = nn.Parameter((num_v_heads,), "float32")
        self.convolution = nn.Parameter(
            (conv_kernel, self.conv_channels), plan.dense_dtype_of(f"{path}.convolution")
        )
        self.norm = GatedRMSNorm(v_head_dim, eps, plan.dense_dtype_of(f"{path}.norm"))
        self.output = make_linear(value_width, hidden, plan, f"{path}.output")

    def decode_projections(self) -> list[nn.Module]:
        """The projections of h that decode runs in one multi launch where the GDN step computes the
        gates itself (what `h_xq` is for; elsewhere it goes unused)."""
        return [self.query, self.key, self.value, self.z]

    def forward(
        self,
        h: nn.Tensor,
        gdn_state: nn.Tensor,
        conv_state: nn.Tensor,
        slot_ids: nn.Tensor,
        seq_lens: nn.Tensor,
        layer: int,
        chunked: bool,
        residual: nn.Tensor,
        h_xq: nn.Tensor | None = None,
    ) -> tuple[nn.Tensor, nn.Tensor, nn.Tensor]:
        """`h [B, T, H]` -> `(residual + y, gdn_state, conv_state)`; `layer` indexes GDN layers only.

        Sequences with `seq_lens[b] == 0` start from zero conv and recurrent state. `h_xq`: h also as
        the input norm's int8 activations (`decode_projections`), for the decode multi launch.
        """
        b, t = h.shape[0], h.shape[1]
        fused_step = gdn_decode_fused.supported(h, gdn_state, self.dk, self.dv)
        gate_weights = [m.weight if isinstance(m, Linear) else None for m in (self.a_projection, self.b_projection)]
        if fused_step and gdn_decode_fused.gates_foldable(h, *gate_weights, self.hv):
            # decode on CUDA: the step kernel also computes the two small bf16 gate projections
            mixed, z = fused_linear.multi_linear(h, [[self.query, self.key, self.value], [self.z]], xq=h_xq)
            a, beta_in, gate_input = gate_weights[0], gate_weights[1], h
        else:
            # one launch for every projection of h where the kernels allow it (decode on CUDA)
            mixed, z, a, beta_in = fused_linear.multi_linear(
                h, [[self.query, self.key, self.value], [self.z], [self.a_projection], [self.b_projection]]
            )
            gate_input = None
        # decode on CUDA: the step kernel may apply the convolution itself (one launch less per layer)
        conv = ((self.convolution, conv_state) if fused_step and gdn_decode_fused.conv_supported(
            self.convolution, conv_state, self.hk, self.hv) else None)
        if conv is None:
            mixed, conv_state = causal_conv1d_with_state(
                mixed, self.convolution, conv_state, slot_ids, seq_lens, layer
            )
        if fused_step:
            # decode on CUDA: gates, norms, the rule and the gated norm in one kernel, which also
            # writes its output as int8 activations where the output projection reads them (z has
            # the output's shape and dtype)
            step = (mixed, a, beta_in, self.a_log, self.dt_bias, z, self.norm.weight, gdn_state, slot_ids,
                    seq_lens, layer, self.norm.eps, self.hk, self.hv, self.dk, self.dv)
            if gdn_decode_fused.xq_supported(self.hv, self.dv) and fused_linear.add_reads_int8(
                    z, self.output, "gemv_int8_gdn_out"):
                o, oq, gdn_state, *conv_out = gdn_decode_fused.gdn_decode_fused(
                    *step, h=gate_input, with_xq=True, conv=conv)
                conv_state = conv_out[0] if conv_out else conv_state
                return fused_linear.linear_add_i8(o, oq, self.output, residual), gdn_state, conv_state
            o, gdn_state, *conv_out = gdn_decode_fused.gdn_decode_fused(*step, h=gate_input, conv=conv)
            conv_state = conv_out[0] if conv_out else conv_state
            return fused_linear.linear_add(o, self.output, residual), gdn_state, conv_state
        key_width = self.hk * self.dk
        q, k, v = op.split(mixed, [key_width, 2 * key_width], axis=-1)
        v = op.reshape(v, [b, t, self.hv, self.dv])
        # the chunked CUDA kernels round q, k to fp16 and read v in its own dtype: no fp32 copies
        narrow = chunked and gdn_chunked_triton.wants_16bit_inputs(self.hk, self.hv, self.dk, self.dv, v.dtype)
        qk_dtype = "float16" if narrow else "float32"
        q = l2_norm(op.reshape(q, [b, t, self.hk, self.dk]), scale=self.dk**-0.5, out_dtype=qk_dtype)
        k = l2_norm(op.reshape(k, [b, t, self.hk, self.dk]), out_dtype=qk_dtype)
        if v.dtype != "float32" and not narrow:
            v = v.astype("float32")
        g, beta = gdn_gates(a, beta_in, self.a_log, self.dt_bias)
        o, gdn_state = gated_delta_rule(
            q, k, v, g, beta, gdn_state, slot_ids, seq_lens, layer, chunked
        )
        z = op.reshape(z, [b, t, self.hv, self.dv])
        if o.dtype != z.dtype:
            o = o.astype(z.dtype)
        o = self.norm(o, z)
        o = op.reshape(o, [b, t, self.hv * self.dv])
        return fused_linear.linear_add(o, self.output, residual), gdn_state, conv_state
