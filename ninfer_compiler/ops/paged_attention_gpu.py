"""GPU forms of the KV append and paged attention kernels (same signatures as the CPU ones).

`kv_append`: one thread per written element. `paged_attention`: one thread block per
(sequence, token, query head), `NT` threads; keys are visited in tiles of `NT`: each thread
scores one key of the tile against the query staged in shared memory, then each thread
rescales and accumulates its share of the `D` output features with an online softmax
(running max and sum in shared memory). fp32 scores and accumulators. Correctness first:
tensor-core kernels are later work (issue #7).

Both are written with `thread_loop` so `bound=False` gives the same kernel with serial loops,
which the CPU tests run against the references.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from .common import SCHEDULED_ATTRS, pow2_divisor, shared_scope, thread_loop

APPEND_THREADS = 256
NEG_INF = -3.0e38


def kv_append_gpu_func(
    num_kv_heads: int, head_dim: int, page_size: int, dtype: str, bound: bool = True
) -> tirx.PrimFunc:
    """Kernel `(pool, k[B,T,Hkv,D], v[B,T,Hkv,D], page_table[B,P], seq_lens[B], layer)`."""
    HKV, D, PS, NT = num_kv_heads, head_dim, page_size, APPEND_THREADS
    loop = thread_loop(bound)

    @T.prim_func
    def kv_append_gpu(
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
        for bx in loop((B * N * T.int64(HKV * D) + T.int64(NT - 1)) // T.int64(NT), "blockIdx.x"):
            for tx in loop(T.int64(NT), "threadIdx.x"):
                idx = bx * T.int64(NT) + tx
                if idx < B * N * T.int64(HKV * D):
                    d = idx % T.int64(D)
                    h = idx // T.int64(D) % T.int64(HKV)
                    t = idx // T.int64(HKV * D) % N
                    b = idx // (T.int64(HKV * D) * N)
                    pos = T.Cast("int64", lens[b]) + t
                    page = T.Cast("int64", pages[b, pos // T.int64(PS)])
                    row = pos % T.int64(PS)
                    pool[layer, page, 0, h, row, d] = k[b, t, h, d]
                    pool[layer, page, 1, h, row, d] = v[b, t, h, d]

    return kv_append_gpu


def paged_attention_gpu_func(
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    page_size: int,
    dtype: str,
    sm_scale: float,
    bound: bool = True,
) -> tirx.PrimFunc:
    """Kernel `(q[B,T,Hq,D], pool, page_table[B,P], seq_lens[B], layer, o[B,T,Hq,D])`."""
    HQ, HKV, D, PS = num_q_heads, num_kv_heads, head_dim, page_size
    G = num_q_heads // num_kv_heads
    NT = pow2_divisor(D, 64)  # threads per block = keys per tile
    R = D // NT  # output features per thread
    scale = float(sm_scale)
    loop = thread_loop(bound)
    smem = shared_scope(bound)

    @T.prim_func
    def paged_attention_gpu(
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
        for blk in loop(B * N * T.int64(HQ), "blockIdx.x"):
            qs = T.alloc_buffer((D,), "float32", scope=smem)
            acc = T.alloc_buffer((D,), "float32", scope=smem)
            score = T.alloc_buffer((NT,), "float32", scope=smem)
            stat = T.alloc_buffer((2,), "float32", scope=smem)  # running max, running sum
            h = blk % T.int64(HQ)
            t = blk // T.int64(HQ) % N
            b = blk // (T.int64(HQ) * N)
            kvh = h // T.int64(G)
            last = T.Cast("int64", lens[b]) + t  # attend to positions 0..last
            for tx in loop(T.int64(NT), "threadIdx.x"):
                for r in range(T.int64(R)):
                    qs[r * NT + tx] = T.Cast("float32", q[b, t, h, r * NT + tx]) * T.float32(scale)
                    acc[r * NT + tx] = T.float32(0)
                if tx == T.int64(0):
                    stat[0] = T.float32(NEG_INF)
                    stat[1] = T.float32(0)
            for tile in range(last // T.int64(NT) + T.int64(1)):
                # Phase 1: thread tx scores key tile*NT + tx.
                for tx in loop(T.int64(NT), "threadIdx.x"):
                    j = tile * T.int64(NT) + tx
                    dot = T.alloc_buffer((1,), "float32", scope="local")
                    dot[0] = T.float32(NEG_INF)
                    if j <= last:
                        page = T.Cast("int64", pages[b, j // T.int64(PS)])
                        row = j % T.int64(PS)
                        dot[0] = T.float32(0)
                        for d in range(T.int64(D)):
                            dot[0] = dot[0] + qs[d] * T.Cast("float32", pool[layer, page, 0, kvh, row, d])
                    score[tx] = dot[0]
                # Phase 2: rescale the accumulators and add this tile's weighted values.
                for tx in loop(T.int64(NT), "threadIdx.x"):
                    m = T.alloc_buffer((1,), "float32", scope="local")
                    m[0] = stat[0]
                    for jj in range(T.int64(NT)):
                        m[0] = T.max(m[0], score[jj])
                    corr = T.exp(stat[0] - m[0])
                    for r in range(T.int64(R)):
                        a = T.alloc_buffer((1,), "float32", scope="local")
                        a[0] = acc[r * NT + tx] * corr
                        for jj in range(T.int64(NT)):
                            j = tile * T.int64(NT) + jj
                            if j <= last:
                                page = T.Cast("int64", pages[b, j // T.int64(PS)])
                                a[0] = a[0] + T.exp(score[jj] - m[0]) * T.Cast(
                                    "float32", pool[layer, page, 1, kvh, j % T.int64(PS), r * NT + tx]
                                )
                        acc[r * NT + tx] = a[0]
                # Phase 3: the new running max and sum; one thread stores them. (TVM cannot put
                # a barrier inside a thread-dependent branch, so reads stay outside the branch.)
                for tx in loop(T.int64(NT), "threadIdx.x"):
                    m = T.alloc_buffer((1,), "float32", scope="local")
                    s = T.alloc_buffer((1,), "float32", scope="local")
                    m[0] = stat[0]
                    for jj in range(T.int64(NT)):
                        m[0] = T.max(m[0], score[jj])
                    s[0] = stat[1] * T.exp(stat[0] - m[0])
                    for jj in range(T.int64(NT)):
                        s[0] = s[0] + T.exp(score[jj] - m[0])
                    if tx == T.int64(0):
                        stat[0] = m[0]
                        stat[1] = s[0]
            for tx in loop(T.int64(NT), "threadIdx.x"):
                for r in range(T.int64(R)):
                    o[b, t, h, r * NT + tx] = T.Cast(dtype, acc[r * NT + tx] / stat[1])

    return paged_attention_gpu
