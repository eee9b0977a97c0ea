"""Causal GQA attention over our paged KV pool.

Pool layout (runtime-owned, one tensor for all attention layers):
`kv_pool [num_attention_layers, num_pages, 2, num_kv_heads, page_size, head_dim]`, index 0 of
the third axis holds K (after norm and RoPE), index 1 holds V. A batch is `B` sequences of `T`
new tokens each; sequence `b` already has `seq_lens[b]` tokens cached, so its new token `t`
sits at position `p = seq_lens[b] + t`, in page `page_table[b, p // page_size]` at row
`p % page_size`. Prefill is `B = 1`, decode is `T = 1`; several tokens per sequence (chunked
prefill, verify) need no other kernel.

`kv_append` writes the new K/V in place; `paged_attention` then lets token `(b, t)` attend
to positions `0..p` of its sequence (itself included) with an online softmax in fp32.
These are straightforward loop kernels for the CPU; under a CUDA target the thread-bound forms
in `paged_attention_gpu` are emitted instead (`common.kernel_flavor`).
"""

from __future__ import annotations

import math

from tvm import tirx
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import op
from tvm.script import tirx as T

from . import attention_decode, attention_prefill
from .common import (
    SCHEDULED_ATTRS,
    dtype_tag,
    i32,
    kernel_flavor,
    placeholder_like,
    tuned_cuda_kernels,
)
from .paged_attention_gpu import kv_append_gpu_func, paged_attention_gpu_func


def kv_append_func(num_kv_heads: int, head_dim: int, page_size: int, dtype: str) -> tirx.PrimFunc:
    """Kernel `(pool, k[B,T,Hkv,D], v[B,T,Hkv,D], page_table[B,P], seq_lens[B], layer)`."""
    HKV, D, PS = num_kv_heads, head_dim, page_size

    @T.prim_func
    def kv_append(
        var_pool: T.handle,
        var_k: T.handle,
        var_v: T.handle,
        var_pages: T.handle,
        var_lens: T.handle,
        layer: T.int32,
    ):
        T.func_attr(SCHEDULED_ATTRS)
        L = T.int64()
        NP = T.int64()
        B = T.int64()
        N = T.int64()
        P = T.int64()
        pool = T.match_buffer(var_pool, (L, NP, 2, HKV, PS, D), dtype)
        k = T.match_buffer(var_k, (B, N, HKV, D), dtype)
        v = T.match_buffer(var_v, (B, N, HKV, D), dtype)
        pages = T.match_buffer(var_pages, (B, P), "int32")
        lens = T.match_buffer(var_lens, (B,), "int32")
        for b, t, h, d in T.grid(B, N, T.int64(HKV), T.int64(D)):
            pos = T.Cast("int64", lens[b]) + t
            page = T.Cast("int64", pages[b, pos // T.int64(PS)])
            row = pos % T.int64(PS)
            pool[layer, page, 0, h, row, d] = k[b, t, h, d]
            pool[layer, page, 1, h, row, d] = v[b, t, h, d]

    return kv_append


def paged_attention_func(
    num_q_heads: int, num_kv_heads: int, head_dim: int, page_size: int, dtype: str, sm_scale: float
) -> tirx.PrimFunc:
    """Kernel `(q[B,T,Hq,D], pool, page_table[B,P], seq_lens[B], layer, o[B,T,Hq,D])`."""
    HQ, HKV, D, PS = num_q_heads, num_kv_heads, head_dim, page_size
    G = num_q_heads // num_kv_heads
    scale = float(sm_scale)

    @T.prim_func
    def paged_attention(
        var_q: T.handle,
        var_pool: T.handle,
        var_pages: T.handle,
        var_lens: T.handle,
        layer: T.int32,
        var_o: T.handle,
    ):
        T.func_attr(SCHEDULED_ATTRS)
        L = T.int64()
        NP = T.int64()
        B = T.int64()
        N = T.int64()
        P = T.int64()
        q = T.match_buffer(var_q, (B, N, HQ, D), dtype)
        pool = T.match_buffer(var_pool, (L, NP, 2, HKV, PS, D), dtype)
        pages = T.match_buffer(var_pages, (B, P), "int32")
        lens = T.match_buffer(var_lens, (B,), "int32")
        o = T.match_buffer(var_o, (B, N, HQ, D), dtype)
        for b, t, h in T.grid(B, N, T.int64(HQ)):
            kvh = h // T.int64(G)
            pos = T.Cast("int64", lens[b]) + t
            acc = T.alloc_buffer((D,), "float32", scope="local")
            stat = T.alloc_buffer((3,), "float32", scope="local")  # running max, sum, score
            stat[0] = T.float32(-3.0e38)
            stat[1] = T.float32(0)
            for d in range(T.int64(D)):
                acc[d] = T.float32(0)
            for j in range(pos + T.int64(1)):
                page = T.Cast("int64", pages[b, j // T.int64(PS)])
                row = j % T.int64(PS)
                stat[2] = T.float32(0)
                for d in range(T.int64(D)):
                    stat[2] = stat[2] + T.Cast("float32", q[b, t, h, d]) * T.Cast(
                        "float32", pool[layer, page, 0, kvh, row, d]
                    )
                stat[2] = stat[2] * T.float32(scale)
                new_max = T.max(stat[0], stat[2])
                decay = T.exp(stat[0] - new_max)
                weight = T.exp(stat[2] - new_max)
                stat[1] = stat[1] * decay + weight
                for d in range(T.int64(D)):
                    acc[d] = acc[d] * decay + weight * T.Cast(
                        "float32", pool[layer, page, 1, kvh, row, d]
                    )
                stat[0] = new_max
            for d in range(T.int64(D)):
                o[b, t, h, d] = T.Cast(dtype, acc[d] / stat[1])

    return paged_attention


def kv_append(
    kv_pool: nn.Tensor,
    k: nn.Tensor,
    v: nn.Tensor,
    page_table: nn.Tensor,
    seq_lens: nn.Tensor,
    layer: int,
    page_size: int,
) -> nn.Tensor:
    """Write `k`, `v` `[B, T, Hkv, D]` into `kv_pool[layer]`; returns the (in-place) pool."""
    hkv, d = int(k.shape[2]), int(k.shape[3])
    flavor = kernel_flavor()
    if flavor == "cpu":
        func = kv_append_func(hkv, d, page_size, kv_pool.dtype)
    else:
        func = kv_append_gpu_func(hkv, d, page_size, kv_pool.dtype, bound=flavor == "gpu")
    name = f"kv_append_h{hkv}_d{d}_p{page_size}_{dtype_tag(kv_pool.dtype)}{_suffix(flavor)}"
    return op.tensor_ir_inplace_op(
        func, name, [kv_pool, k, v, page_table, seq_lens, i32(layer)], [0], placeholder_like(kv_pool)
    )


def paged_attention(
    q: nn.Tensor,
    kv_pool: nn.Tensor,
    page_table: nn.Tensor,
    seq_lens: nn.Tensor,
    layer: int,
    page_size: int,
    sm_scale: float | None = None,
) -> nn.Tensor:
    """Causal attention of `q [B, T, Hq, D]` over the cached sequence; returns `[B, T, Hq, D]`."""
    hq, d = int(q.shape[2]), int(q.shape[3])
    hkv = int(kv_pool.shape[3])
    if hq % hkv:
        raise ValueError(f"query heads {hq} are not a multiple of KV heads {hkv}")
    scale = 1.0 / math.sqrt(d) if sm_scale is None else sm_scale
    flavor = kernel_flavor()
    if flavor == "gpu" and tuned_cuda_kernels():
        # tensor-core Triton kernels (ops/attention_decode.py, ops/attention_prefill.py)
        if attention_decode.supported(q, kv_pool, page_size):
            return attention_decode.paged_attention_decode(q, kv_pool, page_table, seq_lens, layer, page_size, scale)
        if attention_prefill.supported(q, kv_pool, page_size):
            return attention_prefill.paged_attention_prefill(q, kv_pool, page_table, seq_lens, layer, page_size, scale)
    if flavor == "cpu":
        func = paged_attention_func(hq, hkv, d, page_size, q.dtype, scale)
    else:
        func = paged_attention_gpu_func(hq, hkv, d, page_size, q.dtype, scale, bound=flavor == "gpu")
    name = f"paged_attention_q{hq}_kv{hkv}_d{d}_p{page_size}_{dtype_tag(q.dtype)}{_suffix(flavor)}"
    return op.tensor_ir_op(
        func,
        name,
        [q, kv_pool, page_table, seq_lens, i32(layer)],
        nn.Tensor.placeholder(q.shape, q.dtype),
    )


def gated_paged_attention(
    q: nn.Tensor,
    kv_pool: nn.Tensor,
    page_table: nn.Tensor,
    seq_lens: nn.Tensor,
    layer: int,
    page_size: int,
    gate: nn.Tensor,
    with_xq: bool = False,
) -> nn.Tensor | tuple[nn.Tensor, nn.Tensor]:
    """`paged_attention(q, ...)` as `[B, T, Hq * D]`, times `sigmoid(gate [B, T, Hq * D])`;
    `with_xq` (`gated_xq_supported`): `(that, its int8 activations for the decode GEMVs)`.

    Decode on CUDA applies the gate in the attention's last kernel (`attention_decode`'s gated
    combine: one launch fewer per layer, and no TVM kernel between the PDL-chained launches)."""
    b, t, hq, d = q.shape[0], q.shape[1], int(q.shape[2]), int(q.shape[3])
    if with_xq and not gated_xq_supported(q, kv_pool, page_size):
        raise ValueError("gated_paged_attention: int8 activations need the CUDA decode combine (gated_xq_supported)")
    if kernel_flavor() == "gpu" and tuned_cuda_kernels() and attention_decode.supported(q, kv_pool, page_size):
        return attention_decode.paged_attention_decode(q, kv_pool, page_table, seq_lens, layer, page_size, gate=gate,
                                                       with_xq=with_xq)
    o = paged_attention(q, kv_pool, page_table, seq_lens, layer, page_size)
    return op.reshape(o, [b, t, hq * d]) * op.sigmoid(gate)


def gated_xq_supported(q: nn.Tensor, kv_pool: nn.Tensor, page_size: int) -> bool:
    """Whether `gated_paged_attention(..., with_xq=True)` can run: decode through the CUDA combine,
    whose heads are whole groups of 64 of the output (`attention_decode.xq_supported`)."""
    return (kernel_flavor() == "gpu" and tuned_cuda_kernels() and attention_decode.supported(q, kv_pool, page_size)
            and attention_decode.xq_supported(int(q.shape[2]), int(q.shape[3])))


def _suffix(flavor: str) -> str:
    return "" if flavor == "cpu" else "_gpu"
