"""GPU forms of the gated delta rule kernels (signatures and state layout as the CPU ones).

Both kernels run one thread block per (sequence, value head) and give each thread whole
columns `d` of the fp32 state `S[:, d]`: every step of the recurrence is independent across
value columns, so a column never needs another thread's data.

* recurrent (decode, one or a few tokens): the column is kept in a local array over the
  tokens, so the state is read and written once per call;
* chunked (prefill, 64-token chunks, the UT-transform algebra of the CPU kernel): the block
  first fills two chunk matrices in shared memory that all columns share,
  `A[i, j] = beta_i (k_i . k_j) exp(gam_i - gam_j)` (j < i) and
  `QK[i, j] = (q_i . k_j) exp(gam_i - gam_j)` (j <= i); then each thread, for its columns,
  forms `r_i = beta_i (v_i - exp(gam_i) k_i . S[:, d])`, solves `(I + A) v' = r` by forward
  substitution (this is `U - W S` of the CPU kernel, column by column), writes
  `o_i = exp(gam_i) q_i . S[:, d] + sum_j QK[i, j] v'_j` and updates the column.

fp32 throughout, as the CPU kernels; `bound=False` gives the serial form for CPU tests.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from .common import SCHEDULED_ATTRS, pow2_divisor, shared_scope, thread_loop

CHUNK = 64


def gdn_recurrent_gpu_func(
    num_k_heads: int, num_v_heads: int, dk: int, dv: int, dtype: str, bound: bool = True
) -> tirx.PrimFunc:
    """Kernel `(q, k, v, g, beta, state, slot_ids, seq_lens, layer, o[B,T,Hv,dv])`, per token."""
    HK, HV, DK, DV = num_k_heads, num_v_heads, dk, dv
    G = num_v_heads // num_k_heads
    NT = pow2_divisor(DV, 128)
    R = DV // NT
    loop = thread_loop(bound)

    @T.prim_func
    def gdn_recurrent_gpu(
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
        for blk in loop(B * T.int64(HV), "blockIdx.x"):
            b = blk // T.int64(HV)
            hv = blk % T.int64(HV)
            kh = hv // T.int64(G)
            slot = T.Cast("int64", slots[b])
            for tx in loop(T.int64(NT), "threadIdx.x"):
                col = T.alloc_buffer((DK,), "float32", scope="local")
                acc = T.alloc_buffer((2,), "float32", scope="local")  # k . S, then q . S
                for r in range(T.int64(R)):
                    d = r * T.int64(NT) + tx
                    for e in range(T.int64(DK)):
                        col[e] = T.if_then_else(lens[b] == 0, T.float32(0), state[layer, slot, hv, e, d])
                    for t in range(N):
                        decay = T.exp(g[b, t, hv])
                        acc[0] = T.float32(0)
                        for e in range(T.int64(DK)):
                            col[e] = col[e] * decay
                            acc[0] = acc[0] + col[e] * T.Cast("float32", k[b, t, kh, e])
                        delta = beta[b, t, hv] * (T.Cast("float32", v[b, t, hv, d]) - acc[0])
                        acc[1] = T.float32(0)
                        for e in range(T.int64(DK)):
                            col[e] = col[e] + T.Cast("float32", k[b, t, kh, e]) * delta
                            acc[1] = acc[1] + col[e] * T.Cast("float32", q[b, t, kh, e])
                        o[b, t, hv, d] = T.Cast(dtype, acc[1])
                    for e in range(T.int64(DK)):
                        state[layer, slot, hv, e, d] = col[e]

    return gdn_recurrent_gpu


def gdn_chunked_gpu_func(
    num_k_heads: int, num_v_heads: int, dk: int, dv: int, dtype: str, bound: bool = True
) -> tirx.PrimFunc:
    """Kernel with the recurrent kernel's signature, computed chunk by chunk (64 tokens)."""
    HK, HV, DK, DV, C = num_k_heads, num_v_heads, dk, dv, CHUNK
    G = num_v_heads // num_k_heads
    NT = pow2_divisor(DV, 128)
    R = DV // NT
    PAIRS = (C * C + NT - 1) // NT  # (i, j) pairs per thread when filling A and QK
    ROWS = (C + NT - 1) // NT  # chunk rows per thread when filling gam
    loop = thread_loop(bound)
    smem = shared_scope(bound)

    @T.prim_func
    def gdn_chunked_gpu(
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
        for blk in loop(B * T.int64(HV), "blockIdx.x"):
            gam = T.alloc_buffer((C,), "float32", scope=smem)
            amat = T.alloc_buffer((C * C,), "float32", scope=smem)
            qkmat = T.alloc_buffer((C * C,), "float32", scope=smem)
            b = blk // T.int64(HV)
            hv = blk % T.int64(HV)
            kh = hv // T.int64(G)
            slot = T.Cast("int64", slots[b])
            for tx in loop(T.int64(NT), "threadIdx.x"):
                if lens[b] == 0:
                    for r, e in T.grid(T.int64(R), T.int64(DK)):
                        state[layer, slot, hv, e, r * T.int64(NT) + tx] = T.float32(0)
            for ci in range((N + T.int64(C - 1)) // T.int64(C)):
                c0 = ci * T.int64(C)
                n = T.min(T.int64(C), N - c0)
                # Phase 1: cumulative log decay of each row of the chunk.
                for tx in loop(T.int64(NT), "threadIdx.x"):
                    for ri in range(T.int64(ROWS)):
                        i = ri * T.int64(NT) + tx
                        if i < n:
                            s = T.alloc_buffer((1,), "float32", scope="local")
                            s[0] = T.float32(0)
                            for j in range(i + T.int64(1)):
                                s[0] = s[0] + g[b, c0 + j, hv]
                            gam[i] = s[0]
                # Phase 2: the chunk matrices A (strictly lower) and QK (lower, with diagonal).
                for tx in loop(T.int64(NT), "threadIdx.x"):
                    for pi in range(T.int64(PAIRS)):
                        p = pi * T.int64(NT) + tx
                        i = p // T.int64(C)
                        j = p % T.int64(C)
                        if i < n and j <= i and p < T.int64(C * C):
                            kk = T.alloc_buffer((2,), "float32", scope="local")
                            kk[0] = T.float32(0)
                            kk[1] = T.float32(0)
                            for e in range(T.int64(DK)):
                                kj = T.Cast("float32", k[b, c0 + j, kh, e])
                                kk[0] = kk[0] + T.Cast("float32", k[b, c0 + i, kh, e]) * kj
                                kk[1] = kk[1] + T.Cast("float32", q[b, c0 + i, kh, e]) * kj
                            gate = T.exp(gam[i] - gam[j])
                            amat[p] = T.if_then_else(
                                j < i, beta[b, c0 + i, hv] * kk[0] * gate, T.float32(0)
                            )
                            qkmat[p] = kk[1] * gate
                # Phase 3: each thread finishes its own state columns.
                for tx in loop(T.int64(NT), "threadIdx.x"):
                    vp = T.alloc_buffer((C,), "float32", scope="local")
                    col = T.alloc_buffer((DK,), "float32", scope="local")
                    acc = T.alloc_buffer((2,), "float32", scope="local")
                    for r in range(T.int64(R)):
                        d = r * T.int64(NT) + tx
                        for e in range(T.int64(DK)):
                            col[e] = state[layer, slot, hv, e, d]
                        for i in range(n):
                            # r_i with the chunk-start state, then forward substitution.
                            acc[0] = T.float32(0)
                            acc[1] = T.float32(0)
                            for e in range(T.int64(DK)):
                                acc[0] = acc[0] + T.Cast("float32", k[b, c0 + i, kh, e]) * col[e]
                                acc[1] = acc[1] + T.Cast("float32", q[b, c0 + i, kh, e]) * col[e]
                            bi = beta[b, c0 + i, hv]
                            eg = T.exp(gam[i])
                            x = T.alloc_buffer((1,), "float32", scope="local")
                            x[0] = bi * (T.Cast("float32", v[b, c0 + i, hv, d]) - eg * acc[0])
                            for j in range(i):
                                x[0] = x[0] - amat[i * T.int64(C) + j] * vp[j]
                            vp[i] = x[0]
                            # o_i = exp(gam_i) q_i . S + sum_{j <= i} QK[i, j] v'_j
                            y = T.alloc_buffer((1,), "float32", scope="local")
                            y[0] = eg * acc[1]
                            for j in range(i + T.int64(1)):
                                y[0] = y[0] + qkmat[i * T.int64(C) + j] * vp[j]
                            o[b, c0 + i, hv, d] = T.Cast(dtype, y[0])
                        # S[:, d] <- exp(gam_last) S[:, d] + sum_j exp(gam_last - gam_j) k_j v'_j
                        glast = gam[n - T.int64(1)]
                        for e in range(T.int64(DK)):
                            acc[0] = col[e] * T.exp(glast)
                            for j in range(n):
                                acc[0] = acc[0] + T.exp(glast - gam[j]) * T.Cast(
                                    "float32", k[b, c0 + j, kh, e]
                                ) * vp[j]
                            state[layer, slot, hv, e, d] = acc[0]

    return gdn_chunked_gpu
