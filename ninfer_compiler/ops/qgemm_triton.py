"""Triton kernel of the prefill GEMM over grouped-int `row_split_k128_v1` planes (tensor cores).

`y[m, n] = sum_k x[m, k] * W[n, k]`, x bf16 `[M, K]`, W given as its planes (`ops/row_split.py`),
fp32 accumulation, y bf16 `[M, N]`. Why a kernel of our own: dlight's SIMT `Matmul` runs the
prefill projections at ~20 TFLOP/s (docs/kernel-notes.md, "Prefill"); this one feeds wgmma/mma.

Each K step covers 64 lanes: one q4/q5/q6 group or two q8 groups. The weight tile is dequantized in
registers (nibbles and high bits spliced, sign from the top bit, times the fp16 group scale in fp32)
and rounded once to bf16 before the dot: the scale is folded into the weight, so every weight
carries one bf16 rounding (relative <= 2^-9) on top of what an exact reference computes.

`N` and `K` are compile-time constants (a kernel image per projection shape: row strides are then
known multiples of 128, so loads vectorize, and the row masks vanish when BLOCK_N divides N); only
the token count `M` is a runtime argument. `TRANS` computes the transposed product
`acc[n, m] = W_tile @ x_tile^T`: Hopper's wgmma reads its left operand from registers, so the
dequantized tile need not go through shared memory.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _load_rows(ptrs, n_mask, EVEN_N: tl.constexpr):
    """A `[BLOCK_N, w]` plane tile; masked only when BLOCK_N does not divide N."""
    if EVEN_N:
        return tl.load(ptrs)
    else:
        return tl.load(ptrs, mask=n_mask[:, None], other=0)


@triton.jit
def _dequant_tile(base_ptr, high_ptr, scales_ptr, offs_n, n_mask, k0, K: tl.constexpr,
                  BITS: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr):
    """bf16 `[BLOCK_N, 64]` tile of W (rows offs_n, lanes k0..k0+63), scale folded in."""
    rows = offs_n[:, None].to(tl.int64)
    if BITS == 8:
        groups: tl.constexpr = K // 32
        lanes = tl.arange(0, 64)
        b = _load_rows(base_ptr + rows * K + (k0 + lanes)[None, :], n_mask, EVEN_N)
        code = b.to(tl.int8, bitcast=True).to(tl.float32)
        sc = _load_rows(scales_ptr + rows * groups + (k0 // 32 + lanes // 32)[None, :], n_mask, EVEN_N)
    else:
        groups: tl.constexpr = K // 64
        g = k0 // 64
        b = _load_rows(base_ptr + rows * (groups * 32) + (g * 32 + tl.arange(0, 32))[None, :], n_mask,
                       EVEN_N).to(tl.int32)
        u = tl.interleave(b & 0xF, b >> 4)  # lane 2j: low nibble of byte j, lane 2j+1: high nibble
        if BITS == 5:
            hb = _load_rows(high_ptr + rows * (groups * 8) + (g * 8 + tl.arange(0, 8))[None, :], n_mask,
                            EVEN_N).to(tl.int32)
            bit = (hb[:, :, None] >> tl.arange(0, 8)[None, None, :]) & 1  # lane 8j+t: byte j, bit t
            u = u | (tl.reshape(bit, (BLOCK_N, 64)) << 4)
        elif BITS == 6:
            hb = _load_rows(high_ptr + rows * (groups * 16) + (g * 16 + tl.arange(0, 16))[None, :], n_mask,
                            EVEN_N).to(tl.int32)
            two = (hb[:, :, None] >> (2 * tl.arange(0, 4))[None, None, :]) & 3  # lane 4j+t: byte j
            u = u | (tl.reshape(two, (BLOCK_N, 64)) << 4)
        code = (u - ((u >> (BITS - 1)) << BITS)).to(tl.float32)
        sc = _load_rows(scales_ptr + rows * groups + g, n_mask, EVEN_N)
    return (code * sc.to(tl.float32)).to(tl.bfloat16)


def kernel_name(spec) -> str:
    """Entry symbol per specialization, so that one launcher can embed several images."""
    c = spec.constants
    form = "t" if c["TRANS"] else "n"
    return f"ninfer_qgemm_q{c['BITS']}_n{c['N']}_k{c['K']}_{form}{c['BLOCK_M']}x{c['BLOCK_N']}g{c['GROUP_M']}"


@triton.jit(repr=kernel_name)
def qgemm_kernel(x_ptr, base_ptr, high_ptr, scales_ptr, y_ptr, M,
                 N: tl.constexpr, K: tl.constexpr, BITS: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr, TRANS: tl.constexpr):
    """One `[BLOCK_M, BLOCK_N]` tile of y; tiles ordered in GROUP_M-row bands for L2 reuse of W."""
    EVEN_N: tl.constexpr = N % BLOCK_N == 0
    pid = tl.program_id(0)
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n: tl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
    per_band = GROUP_M * grid_n
    band = pid // per_band
    first_m = band * GROUP_M
    band_m = min(grid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_band) % band_m
    pid_n = (pid % per_band) // band_m

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < N
    lanes = tl.arange(0, 64)
    x_rows = x_ptr + offs_m[:, None].to(tl.int64) * K
    if TRANS:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, 64):
        xt = tl.load(x_rows + (k0 + lanes)[None, :], mask=m_mask[:, None], other=0.0)
        w = _dequant_tile(base_ptr, high_ptr, scales_ptr, offs_n, n_mask, k0, K, BITS, BLOCK_N, EVEN_N)
        if TRANS:
            acc = tl.dot(w, tl.trans(xt), acc)
        else:
            acc = tl.dot(xt, tl.trans(w), acc)
    if TRANS:
        out = tl.trans(acc).to(tl.bfloat16)
    else:
        out = acc.to(tl.bfloat16)
    y = y_ptr + offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
    if EVEN_N:
        tl.store(y, out, mask=m_mask[:, None])
    else:
        tl.store(y, out, mask=m_mask[:, None] & n_mask[None, :])


def grid_size(m: int, n: int, block_m: int, block_n: int) -> int:
    """Programs of one launch (a 1-D grid: the band ordering is computed in the kernel)."""
    return triton.cdiv(m, block_m) * triton.cdiv(n, block_n)
