"""Triton kernels for nvfp4 weights (artifact spec 3.3): a prefill GEMM and a decode GEMV.

`y[m, n] = sum_k x[m, k] * W[n, k]` with `W[n, k] = e2m1(c[n, k]) * e4m3(s[n, k / 16]) / d`,
x bf16 `[M, K]`, fp32 accumulation. The weights arrive as the kernels read them:

* `codes`  uint8 `[N, K/2]`: the artifact's code plane, row-major, even k in the low nibble;
* `scales` uint8 `[N, K/16]`: E4M3FN block scales in natural order (un-swizzled at load time,
  `runtime/weights.py`, so a binding may start at any row of its parent);
* `divisor` fp32 `[1]`: the matrix divisor, applied once to the fp32 accumulator.

Hopper has no FP4 tensor cores, so a tile is dequantized in registers to bf16 and fed to
`tl.dot`. Decoding a code: its three magnitude bits shifted into an fp16 word's exponent and
mantissa (`(c & 7) << 9`, sign `(c & 8) << 12`) give exactly `e2m1(c) * 2^-14` (the two smallest
codes become the fp16 subnormals 0 and 2^-15); the block scale is decoded once per 16 weights
with the `2^14` folded in. `e2m1 x e4m3` has at most 2 x 4 significant bits and lies in
`[2^-10, 2688]`, so the bf16 weight is exact: only the fp32 summation order differs from an
exact reference.

`K` is passed as `K64 = K / 64` (the layout guarantees `K % 64 == 0`) so the compiler knows row
strides are multiples of 32 bytes and vectorizes the plane loads. The tile constants below are the
best of the configs measured on the H200 (docs/kernels/nvfp4.md).
"""

from __future__ import annotations

import triton
import triton.language as tl

# prefill GEMM tile (tokens x weight rows x K) and launch shape
GEMM_BLOCK_M, GEMM_BLOCK_N, GEMM_BLOCK_K, GEMM_GROUP_M = 128, 128, 64, 8
GEMM_WARPS, GEMM_STAGES = 8, 3
# decode GEMV: 16 token rows (tl.dot's minimum), weight rows per program, K per step
GEMV_BLOCK_M, GEMV_BLOCK_N, GEMV_BLOCK_K = 16, 128, 256
GEMV_WARPS, GEMV_STAGES = 8, 3
TARGET_PROGRAMS = 264  # two waves of programs on a 132-SM H200: split K below that


@triton.jit
def _e4m3_times_2p14(s):
    """fp32 `e4m3fn(s) * 2^14` of valid scale words (sign 0, not NaN)."""
    s = s.to(tl.int32)
    e = s >> 3
    m = s & 7
    normal = (((e + 134) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    return tl.where(e == 0, m.to(tl.float32) * 32.0, normal)


@triton.jit
def _dequant_tile(codes_ptr, scales_ptr, rows, n_mask, k0, K, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr):
    """bf16 `[BLOCK_N, BLOCK_K]` tile of `W * d` (rows `rows`, lanes k0..k0+BLOCK_K-1; lanes
    past K read as 0). The K masks are uniform over 32-lane runs, so loads stay vectorized."""
    r = rows[:, None].to(tl.int64)
    jb = k0 // 2 + tl.arange(0, BLOCK_K // 2)
    b = tl.load(codes_ptr + r * (K // 2) + jb[None, :], mask=n_mask[:, None] & (jb < K // 2)[None, :],
                other=0).to(tl.uint16)
    c = tl.interleave(b & 0xF, b >> 4)  # lane 2j: low nibble of byte j, lane 2j+1: high nibble
    half = ((c & 7) << 9) | ((c & 8) << 12)
    w = half.to(tl.float16, bitcast=True).to(tl.float32)  # e2m1(c) * 2^-14, exact
    js = k0 // 16 + tl.arange(0, BLOCK_K // 16)
    s = tl.load(scales_ptr + r * (K // 16) + js[None, :], mask=n_mask[:, None] & (js < K // 16)[None, :],
                other=0)
    w = tl.reshape(w, (BLOCK_N, BLOCK_K // 16, 16)) * _e4m3_times_2p14(s)[:, :, None]
    return tl.reshape(w, (BLOCK_N, BLOCK_K)).to(tl.bfloat16)


@triton.jit
def nvfp4_gemm_kernel(x_ptr, codes_ptr, scales_ptr, divisor_ptr, y_ptr, M, N, K64,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      GROUP_M: tl.constexpr, TRANS: tl.constexpr, F32_DOT: tl.constexpr):
    """One `[BLOCK_M, BLOCK_N]` tile of y (bf16 or fp32 by `y_ptr`); 1-D grid in GROUP_M bands.

    `TRANS` computes `acc[n, m] = W_tile @ x_tile^T` so Hopper's wgmma takes the dequantized
    tile from registers (measured 35-40% slower than through shared memory: off in packages). `F32_DOT` widens both (bf16-exact) operands before the dot: for Triton's
    CPU interpreter only.
    """
    K = K64 * 64
    pid = tl.program_id(0)
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
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
    lanes = tl.arange(0, BLOCK_K)
    x_rows = x_ptr + offs_m[:, None].to(tl.int64) * K
    if TRANS:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        xt = tl.load(x_rows + (k0 + lanes)[None, :], mask=m_mask[:, None], other=0.0)
        w = _dequant_tile(codes_ptr, scales_ptr, offs_n, n_mask, k0, K, BLOCK_N, BLOCK_K)
        if F32_DOT:
            xt = xt.to(tl.float32)
            w = w.to(tl.float32)
        if TRANS:
            acc = tl.dot(w, tl.trans(xt), acc)
        else:
            acc = tl.dot(xt, tl.trans(w), acc)
    inv = 1.0 / tl.load(divisor_ptr)
    if TRANS:
        out = tl.trans(acc * inv)
    else:
        out = acc * inv
    y = y_ptr + offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
    tl.store(y, out.to(y_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


@triton.jit
def nvfp4_gemv_kernel(x_ptr, codes_ptr, scales_ptr, divisor_ptr, part_ptr, M, N, K64, STEPS,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      F32_DOT: tl.constexpr):
    """Few tokens: program (n tile, K split, m tile) writes fp32 `part[split, m, n]` (W / d).

    Each split covers `STEPS` steps of BLOCK_K; the partial sums are added by the caller (a
    tiny reduction; with one split it is the cast to the activation dtype).
    """
    K = K64 * 64
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    pid_m = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < N
    lanes = tl.arange(0, BLOCK_K)
    x_rows = x_ptr + offs_m[:, None].to(tl.int64) * K
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    k_begin = split * STEPS * BLOCK_K
    k_end = min(k_begin + STEPS * BLOCK_K, K)
    for k0 in range(k_begin, k_end, BLOCK_K):
        kk = k0 + lanes
        xt = tl.load(x_rows + kk[None, :], mask=m_mask[:, None] & (kk < K)[None, :], other=0.0)
        w = _dequant_tile(codes_ptr, scales_ptr, offs_n, n_mask, k0, K, BLOCK_N, BLOCK_K)
        if F32_DOT:
            xt = xt.to(tl.float32)
            w = w.to(tl.float32)
        acc = tl.dot(w, tl.trans(xt), acc)
    out = tl.trans(acc / tl.load(divisor_ptr))
    p = part_ptr + split.to(tl.int64) * M * N + offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
    tl.store(p, out, mask=m_mask[:, None] & n_mask[None, :])


def gemm_grid(m: int, n: int) -> int:
    """Programs of one GEMM launch (1-D: the band order is computed in the kernel)."""
    return triton.cdiv(m, GEMM_BLOCK_M) * triton.cdiv(n, GEMM_BLOCK_N)


def gemv_split(n: int, k: int) -> tuple[int, int]:
    """`(splits, steps per split)` of K for a GEMV over `[n, k]`: enough programs to fill the GPU."""
    tiles = triton.cdiv(n, GEMV_BLOCK_N)
    steps = triton.cdiv(k, GEMV_BLOCK_K)
    want = max(1, min(steps, triton.cdiv(TARGET_PROGRAMS, tiles)))
    per = triton.cdiv(steps, want)
    return triton.cdiv(steps, per), per
