"""GPU form of the causal conv1d kernel: one thread per (sequence, channel, tile of tokens).

Every channel's convolution is independent of the others, and every output token reads only
its `K` input rows, so tokens are split into tiles of `TILE` across `blockIdx.y` (a prefill
chunk of 1,024 tokens is 16 times as parallel as one thread walking all of them). Only the
first tile reads the old history, and the same thread then writes the new one (taken from the
call's last rows, or shifted when the call is shorter than the history): no other block
touches the state, so there is no race. `bound=False` gives the serial form.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from .common import SCHEDULED_ATTRS, thread_loop

THREADS = 128
TILE = 64  # tokens per thread


def causal_conv1d_gpu_func(
    channels: int, kernel: int, dtype: str, weight_dtype: str, bound: bool = True
) -> tirx.PrimFunc:
    """Kernel `(x[B,T,C], w[K,C], state[L,S,K-1,C], slot_ids[B], seq_lens[B], layer, y[B,T,C])`."""
    C, K, NT, TT = channels, kernel, THREADS, TILE
    H = kernel - 1
    loop = thread_loop(bound)

    @T.prim_func
    def causal_conv1d_gpu(
        var_x: T.handle,
        var_w: T.handle,
        var_state: T.handle,
        var_slots: T.handle,
        var_lens: T.handle,
        layer: T.int32,
        var_y: T.handle,
    ):
        T.func_attr(SCHEDULED_ATTRS)
        B = T.int64()
        N = T.int64()
        L = T.int64()
        S = T.int64()
        x = T.match_buffer(var_x, (B, N, C), dtype)
        w = T.match_buffer(var_w, (K, C), weight_dtype)
        state = T.match_buffer(var_state, (L, S, H, C), dtype)
        slots = T.match_buffer(var_slots, (B,), "int32")
        lens = T.match_buffer(var_lens, (B,), "int32")
        y = T.match_buffer(var_y, (B, N, C), dtype)
        for by in loop((N + T.int64(TT - 1)) // T.int64(TT), "blockIdx.y"):
            for bx in loop((B * T.int64(C) + T.int64(NT - 1)) // T.int64(NT), "blockIdx.x"):
                for tx in loop(T.int64(NT), "threadIdx.x"):
                    idx = bx * T.int64(NT) + tx
                    if idx < B * T.int64(C):
                        b = idx // T.int64(C)
                        c = idx % T.int64(C)
                        slot = T.Cast("int64", slots[b])
                        acc = T.alloc_buffer((1,), "float32", scope="local")
                        for tt in range(T.int64(TT)):
                            t = by * T.int64(TT) + tt
                            if t < N:
                                acc[0] = T.float32(0)
                                for j in range(T.int64(K)):
                                    src = t + j - T.int64(H)
                                    if src >= T.int64(0):
                                        acc[0] = acc[0] + T.Cast("float32", w[j, c]) * T.Cast(
                                            "float32", x[b, src, c]
                                        )
                                    elif lens[b] > 0:
                                        acc[0] = acc[0] + T.Cast("float32", w[j, c]) * T.Cast(
                                            "float32", state[layer, slot, T.int64(H) + src, c]
                                        )
                                y[b, t, c] = T.Cast(dtype, acc[0] * T.sigmoid(acc[0]))
                        # New history = rows [N, N+H) of concat(history, x), written by the
                        # first tile after its reads; ascending i only reads ahead.
                        if by == T.int64(0):
                            for i in range(T.int64(H)):
                                if N + i >= T.int64(H):
                                    state[layer, slot, i, c] = x[b, N + i - T.int64(H), c]
                                elif lens[b] > 0:
                                    state[layer, slot, i, c] = state[layer, slot, N + i, c]
                                else:
                                    state[layer, slot, i, c] = T.Cast(dtype, T.float32(0))

    return causal_conv1d_gpu
