"""Causal depthwise conv1d with a per-slot history (the GDN short convolution).

The history of a sequence is the last `K-1` pre-conv rows, kept in the runtime-owned
`conv_state [num_gdn_layers, num_slots, K-1, C]` and indexed by `slot_ids`. One kernel
serves prefill chunks (`T` tokens of one sequence) and batched decode (`T = 1`): it
reads the history for rows before the chunk, writes the SiLU'd outputs, then shifts
the new last `K-1` rows into the history in place. A sequence with `seq_lens[b] == 0` starts
from an empty (zero) history whatever its slot holds, so slots need no clearing.
"""

from __future__ import annotations

from tvm import tirx
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import op
from tvm.script import tirx as T

from . import conv1d_decode
from .common import SCHEDULED_ATTRS, dtype_tag, i32, kernel_flavor, placeholder_like
from .conv1d_gpu import causal_conv1d_gpu_func


def causal_conv1d_func(channels: int, kernel: int, dtype: str, weight_dtype: str) -> tirx.PrimFunc:
    """Kernel `(x[B,T,C], w[K,C], state[L,S,K-1,C], slot_ids[B], seq_lens[B], layer, y[B,T,C])`."""
    C, K = channels, kernel
    H = kernel - 1

    @T.prim_func
    def causal_conv1d(
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
        for b, c in T.grid(B, T.int64(C)):
            slot = T.Cast("int64", slots[b])
            for t in range(N):
                acc = T.alloc_buffer((1,), "float32", scope="local")
                acc[0] = T.float32(0)
                for j in range(T.int64(K)):
                    src = t + j - T.int64(H)
                    if src >= T.int64(0):
                        acc[0] = acc[0] + T.Cast("float32", w[j, c]) * T.Cast("float32", x[b, src, c])
                    elif lens[b] > 0:
                        acc[0] = acc[0] + T.Cast("float32", w[j, c]) * T.Cast(
                            "float32", state[layer, slot, T.int64(H) + src, c]
                        )
                y[b, t, c] = T.Cast(dtype, acc[0] * T.sigmoid(acc[0]))
            # New history = rows [N, N+H) of concat(history, x); ascending i only reads ahead.
            for i in range(T.int64(H)):
                if N + i >= T.int64(H):
                    state[layer, slot, i, c] = x[b, N + i - T.int64(H), c]
                elif lens[b] > 0:
                    state[layer, slot, i, c] = state[layer, slot, N + i, c]
                else:
                    state[layer, slot, i, c] = T.Cast(dtype, T.float32(0))

    return causal_conv1d


def causal_conv1d_with_state(
    x: nn.Tensor,
    weight: nn.Tensor,
    conv_state: nn.Tensor,
    slot_ids: nn.Tensor,
    seq_lens: nn.Tensor,
    layer: int,
) -> tuple[nn.Tensor, nn.Tensor]:
    """`silu(causal_conv(x))` over `[B, T, C]`, continuing and updating `conv_state[layer]`.

    Returns `(y [B, T, C], conv_state)`; the second is the in-place-updated state tensor.
    """
    if conv1d_decode.supported(x, weight, conv_state):  # decode on CUDA: the PDL-chained Triton kernel
        return conv1d_decode.conv1d_decode(x, weight, conv_state, slot_ids, seq_lens, layer)
    channels = int(x.shape[-1])
    kernel = int(weight.shape[0])
    flavor = kernel_flavor()
    if flavor == "cpu":
        func = causal_conv1d_func(channels, kernel, x.dtype, weight.dtype)
    else:
        func = causal_conv1d_gpu_func(channels, kernel, x.dtype, weight.dtype, bound=flavor == "gpu")
    suffix = "" if flavor == "cpu" else "_gpu"
    name = f"causal_conv1d_c{channels}_k{kernel}_{dtype_tag(x.dtype)}_{dtype_tag(weight.dtype)}{suffix}"
    y, state = op.tensor_ir_inplace_op(
        func,
        name,
        [x, weight, conv_state, slot_ids, seq_lens, i32(layer)],
        [-1, 2],
        [nn.Tensor.placeholder(x.shape, x.dtype), placeholder_like(conv_state)],
    )
    return y, state
