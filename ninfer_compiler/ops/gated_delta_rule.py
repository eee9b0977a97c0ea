"""Gated delta rule (GDN core) over slot-indexed fp32 recurrent state.

State layout (runtime-owned): `gdn_state [num_gdn_layers, num_slots, Hv, dk, dv]` fp32, the
HF layout `S[k, v]`; sequence `b` uses slot `slot_ids[b]`. Inputs are already prepared:
`q, k [B, T, Hk, dk]` L2-normalised (q also scaled by 1/sqrt(dk)), `v [B, T, Hv, dv]`,
`g, beta [B, T, Hv]` fp32 (log decay and write strength). Value head `j` reads key head
`j // (Hv / Hk)`. Per token the state evolves as

    S <- exp(g) S;  u = beta (v - S^T k);  S <- S + k u^T;  o = S^T q

Two kernels compute exactly that: the recurrent one token by token (decode, verify) and the
chunked one (prefill), which processes chunks of 64 tokens with the UT transform (spec 1.3):
within a chunk with cumulative log decay gam, A = strictly_lower(beta K K^T * exp(gam_i - gam_j)),
U = (I+A)^-1 beta V and W = (I+A)^-1 (beta exp(gam) K) by forward substitution, then
V' = U - W S, O = exp(gam) Q S + ((Q K^T) * Gamma) V', S <- exp(gam_last) S + (exp(gam_last - gam) K)^T V'.
Chunks start at the first token of each call, so chunked prefill across calls carries the
state exactly. Both update the state in place; a sequence with `seq_lens[b] == 0` starts from
a zero state whatever its slot holds, so slots need no clearing.
"""

from __future__ import annotations

from tvm import tirx
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import op
from tvm.script import tirx as T

from . import gdn_chunked_triton
from .common import (
    SCHEDULED_ATTRS,
    dtype_tag,
    i32,
    kernel_flavor,
    placeholder_like,
    tuned_cuda_kernels,
)
from .gated_delta_rule_gpu import gdn_chunked_gpu_func, gdn_recurrent_gpu_func

CHUNK = 64


def gdn_recurrent_func(
    num_k_heads: int, num_v_heads: int, dk: int, dv: int, dtype: str
) -> tirx.PrimFunc:
    """Kernel `(q, k, v, g, beta, state, slot_ids, seq_lens, layer, o[B,T,Hv,dv])`, per token."""
    HK, HV, DK, DV = num_k_heads, num_v_heads, dk, dv
    G = num_v_heads // num_k_heads

    @T.prim_func
    def gdn_recurrent(
        var_q: T.handle,
        var_k: T.handle,
        var_v: T.handle,
        var_g: T.handle,
        var_beta: T.handle,
        var_state: T.handle,
        var_slots: T.handle,
        var_lens: T.handle,
        layer: T.int32,
        var_o: T.handle,
    ):
        T.func_attr(SCHEDULED_ATTRS)
        B = T.int64()
        N = T.int64()
        L = T.int64()
        S = T.int64()
        q = T.match_buffer(var_q, (B, N, HK, DK), dtype)
        k = T.match_buffer(var_k, (B, N, HK, DK), dtype)
        v = T.match_buffer(var_v, (B, N, HV, DV), dtype)
        g = T.match_buffer(var_g, (B, N, HV), "float32")
        beta = T.match_buffer(var_beta, (B, N, HV), "float32")
        state = T.match_buffer(var_state, (L, S, HV, DK, DV), "float32")
        slots = T.match_buffer(var_slots, (B,), "int32")
        lens = T.match_buffer(var_lens, (B,), "int32")
        o = T.match_buffer(var_o, (B, N, HV, DV), dtype)
        for b, hv in T.grid(B, T.int64(HV)):
            slot = T.Cast("int64", slots[b])
            kh = hv // T.int64(G)
            if lens[b] == 0:
                for e, d in T.grid(T.int64(DK), T.int64(DV)):
                    state[layer, slot, hv, e, d] = T.float32(0)
            for t in range(N):
                decay = T.exp(g[b, t, hv])
                for e, d in T.grid(T.int64(DK), T.int64(DV)):
                    state[layer, slot, hv, e, d] = state[layer, slot, hv, e, d] * decay
                for d in range(T.int64(DV)):
                    mem = T.alloc_buffer((1,), "float32", scope="local")
                    mem[0] = T.float32(0)
                    for e in range(T.int64(DK)):
                        mem[0] = mem[0] + state[layer, slot, hv, e, d] * T.Cast("float32", k[b, t, kh, e])
                    delta = beta[b, t, hv] * (T.Cast("float32", v[b, t, hv, d]) - mem[0])
                    out = T.alloc_buffer((1,), "float32", scope="local")
                    out[0] = T.float32(0)
                    for e in range(T.int64(DK)):
                        state[layer, slot, hv, e, d] = (
                            state[layer, slot, hv, e, d] + T.Cast("float32", k[b, t, kh, e]) * delta
                        )
                        out[0] = out[0] + state[layer, slot, hv, e, d] * T.Cast("float32", q[b, t, kh, e])
                    o[b, t, hv, d] = T.Cast(dtype, out[0])

    return gdn_recurrent


def gdn_chunked_func(
    num_k_heads: int, num_v_heads: int, dk: int, dv: int, dtype: str
) -> tirx.PrimFunc:
    """Kernel with the recurrent kernel's signature, computed chunk by chunk (64 tokens)."""
    HK, HV, DK, DV, C = num_k_heads, num_v_heads, dk, dv, CHUNK
    G = num_v_heads // num_k_heads

    @T.prim_func
    def gdn_chunked(
        var_q: T.handle,
        var_k: T.handle,
        var_v: T.handle,
        var_g: T.handle,
        var_beta: T.handle,
        var_state: T.handle,
        var_slots: T.handle,
        var_lens: T.handle,
        layer: T.int32,
        var_o: T.handle,
    ):
        T.func_attr(SCHEDULED_ATTRS)
        B = T.int64()
        N = T.int64()
        L = T.int64()
        S = T.int64()
        q = T.match_buffer(var_q, (B, N, HK, DK), dtype)
        k = T.match_buffer(var_k, (B, N, HK, DK), dtype)
        v = T.match_buffer(var_v, (B, N, HV, DV), dtype)
        g = T.match_buffer(var_g, (B, N, HV), "float32")
        beta = T.match_buffer(var_beta, (B, N, HV), "float32")
        state = T.match_buffer(var_state, (L, S, HV, DK, DV), "float32")
        slots = T.match_buffer(var_slots, (B,), "int32")
        lens = T.match_buffer(var_lens, (B,), "int32")
        o = T.match_buffer(var_o, (B, N, HV, DV), dtype)
        for b, hv in T.grid(B, T.int64(HV)):
            slot = T.Cast("int64", slots[b])
            kh = hv // T.int64(G)
            if lens[b] == 0:
                for e, d in T.grid(T.int64(DK), T.int64(DV)):
                    state[layer, slot, hv, e, d] = T.float32(0)
            gam = T.alloc_buffer((C,), "float32", scope="local")
            u = T.alloc_buffer((C, DV), "float32", scope="local")  # U, then V'
            w = T.alloc_buffer((C, DK), "float32", scope="local")
            orow = T.alloc_buffer((DV,), "float32", scope="local")
            acc = T.alloc_buffer((1,), "float32", scope="local")
            for ci in range((N + T.int64(C - 1)) // T.int64(C)):
                c0 = ci * T.int64(C)
                n = T.min(T.int64(C), N - c0)
                # Cumulative log decay inside the chunk.
                acc[0] = T.float32(0)
                for i in range(n):
                    acc[0] = acc[0] + g[b, c0 + i, hv]
                    gam[i] = acc[0]
                # Forward substitution: row i of U and W from the rows before it.
                for i in range(n):
                    bi = beta[b, c0 + i, hv]
                    for d in range(T.int64(DV)):
                        u[i, d] = bi * T.Cast("float32", v[b, c0 + i, hv, d])
                    for e in range(T.int64(DK)):
                        w[i, e] = bi * T.exp(gam[i]) * T.Cast("float32", k[b, c0 + i, kh, e])
                    for j in range(i):
                        acc[0] = T.float32(0)
                        for e in range(T.int64(DK)):
                            acc[0] = acc[0] + T.Cast("float32", k[b, c0 + i, kh, e]) * T.Cast(
                                "float32", k[b, c0 + j, kh, e]
                            )
                        a = bi * acc[0] * T.exp(gam[i] - gam[j])
                        for d in range(T.int64(DV)):
                            u[i, d] = u[i, d] - a * u[j, d]
                        for e in range(T.int64(DK)):
                            w[i, e] = w[i, e] - a * w[j, e]
                # V' = U - W S (overwrites U).
                for i, d in T.grid(n, T.int64(DV)):
                    acc[0] = T.float32(0)
                    for e in range(T.int64(DK)):
                        acc[0] = acc[0] + w[i, e] * state[layer, slot, hv, e, d]
                    u[i, d] = u[i, d] - acc[0]
                # O = exp(gam) Q S + ((Q K^T) * Gamma) V', with the chunk-start state.
                for i in range(n):
                    for d in range(T.int64(DV)):
                        acc[0] = T.float32(0)
                        for e in range(T.int64(DK)):
                            acc[0] = acc[0] + T.Cast("float32", q[b, c0 + i, kh, e]) * state[
                                layer, slot, hv, e, d
                            ]
                        orow[d] = acc[0] * T.exp(gam[i])
                    for j in range(i + T.int64(1)):
                        acc[0] = T.float32(0)
                        for e in range(T.int64(DK)):
                            acc[0] = acc[0] + T.Cast("float32", q[b, c0 + i, kh, e]) * T.Cast(
                                "float32", k[b, c0 + j, kh, e]
                            )
                        a = acc[0] * T.exp(gam[i] - gam[j])
                        for d in range(T.int64(DV)):
                            orow[d] = orow[d] + a * u[j, d]
                    for d in range(T.int64(DV)):
                        o[b, c0 + i, hv, d] = T.Cast(dtype, orow[d])
                # S <- exp(gam_last) S + sum_j exp(gam_last - gam_j) k_j V'_j^T.
                for e, d in T.grid(T.int64(DK), T.int64(DV)):
                    acc[0] = state[layer, slot, hv, e, d] * T.exp(gam[n - T.int64(1)])
                    for j in range(n):
                        acc[0] = acc[0] + T.exp(gam[n - T.int64(1)] - gam[j]) * T.Cast(
                            "float32", k[b, c0 + j, kh, e]
                        ) * u[j, d]
                    state[layer, slot, hv, e, d] = acc[0]

    return gdn_chunked


def gated_delta_rule(
    q: nn.Tensor,
    k: nn.Tensor,
    v: nn.Tensor,
    g: nn.Tensor,
    beta: nn.Tensor,
    gdn_state: nn.Tensor,
    slot_ids: nn.Tensor,
    seq_lens: nn.Tensor,
    layer: int,
    chunked: bool,
) -> tuple[nn.Tensor, nn.Tensor]:
    """Run the delta rule for `[B, T]` tokens; returns `(o [B, T, Hv, dv], gdn_state)`.

    `chunked=True` selects the chunk-parallel prefill form, else the token-by-token form.
    """
    hk, dk = int(k.shape[2]), int(k.shape[3])
    hv, dv = int(v.shape[2]), int(v.shape[3])
    if hv % hk:
        raise ValueError(f"GDN value heads {hv} are not a multiple of key heads {hk}")
    kind = "chunked" if chunked else "recurrent"
    flavor = kernel_flavor()
    if (chunked and flavor == "gpu" and tuned_cuda_kernels()
            and gdn_chunked_triton.supported(q, k, v, g, beta, gdn_state)):
        # tensor-core chunked form in Triton, parallel over chunks and value columns
        return gdn_chunked_triton.gdn_chunked(q, k, v, g, beta, gdn_state, slot_ids, seq_lens, layer)
    if flavor == "cpu":
        func = (gdn_chunked_func if chunked else gdn_recurrent_func)(hk, hv, dk, dv, v.dtype)
    else:
        make = gdn_chunked_gpu_func if chunked else gdn_recurrent_gpu_func
        func = make(hk, hv, dk, dv, v.dtype, bound=flavor == "gpu")
    suffix = "" if flavor == "cpu" else "_gpu"
    name = f"gdn_{kind}_hk{hk}_hv{hv}_dk{dk}_dv{dv}_{dtype_tag(v.dtype)}{suffix}"
    o, state = op.tensor_ir_inplace_op(
        func,
        name,
        [q, k, v, g, beta, gdn_state, slot_ids, seq_lens, i32(layer)],
        [-1, 5],
        [nn.Tensor.placeholder(v.shape, v.dtype), placeholder_like(gdn_state)],
    )
    return o, state
