"""Triton kernels for fp8_e4m3fn_row_bf16 weights (artifact spec 3.4): a prefill GEMM and a decode GEMV.

`y[m, n] = s[n] * sum_k x[m, k] * e4m3fn(c[n, k])`, x bf16 `[M, K]`, fp32 accumulation. The weights
arrive as stored (`ops/fp8_row.py`): `codes` uint8 `[N, K]` (one E4M3FN word per weight, row-major)
and `scales` bf16 `[N]` (one multiplier per row).

Exact form. An E4M3FN value has at most 4 significant bits and lies in `[2^-9, 448]`, so it is
exactly a bf16; the row scale has 8 significant bits, so `code * scale` (up to 12) is not. The
tile is therefore dequantized to the bf16 code values alone, `tl.dot` sums exact products in fp32,
and the row scale multiplies the fp32 accumulator once per output (the GEMV leaves that to the
caller, after its K-split partials are summed). Hopper's and Blackwell's tensor cores take no
mixed fp8 x bf16 operands, and the activations stay bf16 (A16: always allowed, spec 2.6).

Two exact decodes, both hardware conversions (`DEQUANT`): 0 = `fp8 -> bf16` directly (sm_120's
`cvt.rn.bf16x2.e4m3x2`; on sm_90 Triton goes through `cvt.bf16.f16`, a slow F2F per weight), 1 =
`fp8 -> f16 -> f32 -> bf16` (sm_90: `F2FP.F16.E4M3.UNPACK_B` per two weights, `HADD2.F32` per weight,
one `F2FP.BF16.F32.PACK_AB` per two; no F2F). The E4M3FN NaN words 0x7F / 0xFF are invalid in this
format and refused when the weights are loaded (`runtime/weights.py`), so the kernels never see them.

`K` is passed as `K64 = K / 64` to the GEMM (whose K loop has no masks) and `K16 = K / 16` to the
GEMV (lanes past K masked in runs of 16), so the compiler knows row strides are multiples of 16
bytes and vectorizes the code loads.
"""

from __future__ import annotations

import triton
import triton.language as tl

# prefill GEMM tiles (tokens x weight rows x K, warps, stages, TRANS): the shapes the groupwise GEMM
# measured best on the H200 (docs/kernels/prefill-gemm.md: 256 x 128 with the weight tile as the
# register operand once the grid fills the GPU) and the nvfp4 GEMM's 128 x 128 for short chunks;
# sm_120/121 (~100 KB of shared memory per block) take 128 x 128 with 3 stages only.
GEMM_BLOCK_K, GEMM_GROUP_M = 64, 8
GEMM_CONFIGS = {
    "sm_90a": {"narrow": (128, 128, 8, 3, False), "wide": (256, 128, 8, 4, True)},
    "sm_120a": {"narrow": (128, 128, 8, 3, False)},
    "sm_121a": {"narrow": (128, 128, 8, 3, False)},
}
WIDE_MIN_TILES = 128  # wide tiles needed to prefer them (H200: 132 SMs, one tile per SM)
# decode GEMV: 16 token rows (tl.dot's minimum), weight rows per program, K per step
GEMV_BLOCK_M, GEMV_BLOCK_N, GEMV_BLOCK_K = 16, 128, 256
GEMV_WARPS, GEMV_STAGES = 8, 3
TARGET_PROGRAMS = 264  # two waves of programs on a 132-SM H200: split K below that
# the decode each arch's packages use (see the module docstring)
DEQUANT = {"sm_90a": 1, "sm_120a": 0, "sm_121a": 0}


@triton.jit
def _codes_bf16(c, DEQUANT: tl.constexpr):
    """uint8 E4M3FN words -> their exact values as bf16 (valid words: not 0x7F / 0xFF)."""
    f8 = c.to(tl.float8e4nv, bitcast=True)
    if DEQUANT == 0:
        return f8.to(tl.bfloat16)
    return f8.to(tl.float16).to(tl.float32).to(tl.bfloat16)


@triton.jit
def fp8_row_gemm_kernel(x_ptr, codes_ptr, scales_ptr, y_ptr, M, N, K64,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        GROUP_M: tl.constexpr, TRANS: tl.constexpr, DEQUANT: tl.constexpr, F32_DOT: tl.constexpr):
    """One `[BLOCK_M, BLOCK_N]` tile of y (bf16 or fp32 by `y_ptr`); 1-D grid in GROUP_M bands (programs
    in a band share weight tiles in L2). K is a multiple of BLOCK_K (64 or 128; the launcher checks).

    `TRANS` computes `acc[n, m] = W_tile @ x_tile^T`, the dequantized tile as Hopper wgmma's register
    operand (no shared-memory round trip for it); otherwise the tile is the B operand through shared
    memory. Rows past M and N are clamped on load (they repeat the last row and are never stored), so
    the loads carry no masks. `F32_DOT` widens both (bf16-exact) operands before the dot: for
    Triton's CPU interpreter only.
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
    lanes = tl.arange(0, BLOCK_K)
    x_rows = x_ptr + tl.minimum(offs_m, M - 1)[:, None].to(tl.int64) * K
    rows = tl.minimum(offs_n, N - 1)
    c_rows = codes_ptr + rows[:, None].to(tl.int64) * K
    if TRANS:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        xt = tl.load(x_rows + (k0 + lanes)[None, :])
        w = _codes_bf16(tl.load(c_rows + (k0 + lanes)[None, :]), DEQUANT)
        if F32_DOT:
            xt = xt.to(tl.float32)
            w = w.to(tl.float32)
        if TRANS:
            acc = tl.dot(w, tl.trans(xt), acc)
        else:
            acc = tl.dot(xt, tl.trans(w), acc)
    s = tl.load(scales_ptr + rows).to(tl.float32)
    if TRANS:
        out = tl.trans(acc * s[:, None])
    else:
        out = acc * s[None, :]
    y = y_ptr + offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
    tl.store(y, out.to(y_ptr.dtype.element_ty), mask=(offs_m < M)[:, None] & (offs_n < N)[None, :])


@triton.jit
def fp8_row_gemv_kernel(x_ptr, codes_ptr, part_ptr, M, N, K16, STEPS,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        DEQUANT: tl.constexpr, F32_DOT: tl.constexpr):
    """Few tokens: program (n tile, K split, m tile) writes fp32 `part[split, m, n]` without the row
    scale. Each split covers `STEPS` steps of BLOCK_K; the caller sums the partials and applies
    the scale once per output."""
    K = K16 * 16
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    pid_m = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < N
    lanes = tl.arange(0, BLOCK_K)
    x_rows = x_ptr + offs_m[:, None].to(tl.int64) * K
    c_rows = codes_ptr + offs_n[:, None].to(tl.int64) * K
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    k_begin = split * STEPS * BLOCK_K
    k_end = min(k_begin + STEPS * BLOCK_K, K)
    for k0 in range(k_begin, k_end, BLOCK_K):
        kk = k0 + lanes
        k_mask = (kk < K)[None, :]
        xt = tl.load(x_rows + kk[None, :], mask=m_mask[:, None] & k_mask, other=0.0)
        c = tl.load(c_rows + kk[None, :], mask=n_mask[:, None] & k_mask, other=0)
        w = _codes_bf16(c, DEQUANT)
        if F32_DOT:
            xt = xt.to(tl.float32)
            w = w.to(tl.float32)
        acc = tl.dot(w, tl.trans(xt), acc)
    p = part_ptr + split.to(tl.int64) * M * N + offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
    tl.store(p, tl.trans(acc), mask=m_mask[:, None] & n_mask[None, :])


def gemm_grid(m: int, n: int, block_m: int, block_n: int) -> int:
    """Programs of one GEMM launch (1-D: the band order is computed in the kernel)."""
    return triton.cdiv(m, block_m) * triton.cdiv(n, block_n)


def gemm_config(arch: str, m: int, n: int) -> tuple[str, tuple[int, int, int, int, bool]]:
    """`(name, (BLOCK_M, BLOCK_N, warps, stages, TRANS))` the launcher picks for `m` tokens: the wide
    tile once its grid fills the GPU, else the narrow one (the C++ launcher mirrors this)."""
    configs = GEMM_CONFIGS.get(arch, GEMM_CONFIGS["sm_120a"])
    wide = configs.get("wide")
    if wide is not None and gemm_grid(m, n, wide[0], wide[1]) >= WIDE_MIN_TILES:
        return "wide", wide
    return "narrow", configs["narrow"]


def gemv_split(n: int, k: int) -> tuple[int, int]:
    """`(splits, steps per split)` of K for a GEMV over `[n, k]`: enough programs to fill the GPU,
    every split non-empty."""
    tiles = triton.cdiv(n, GEMV_BLOCK_N)
    steps = triton.cdiv(k, GEMV_BLOCK_K)
    want = max(1, min(steps, triton.cdiv(TARGET_PROGRAMS, tiles)))
    per = triton.cdiv(steps, want)
    return triton.cdiv(steps, per), per
