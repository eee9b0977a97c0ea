"""Triton kernel of the prefill GEMM over grouped-int `row_split_k128_v1` planes (tensor cores).

`y[m, n] = sum_k x[m, k] * W[n, k]`, x bf16 `[M, K]`, W given as its planes (`ops/row_split.py`),
fp32 accumulation, y bf16 `[M, N]`. Why a kernel of our own: dlight's SIMT `Matmul` runs the
prefill projections at ~20 TFLOP/s (docs/kernel-notes.md, "Prefill"); this one feeds wgmma/mma.

Each K step covers 64 lanes: one q4/q5/q6 group or two q8 groups. The weight tile is read as
32-bit words of the `base` plane (8 lanes of q4/q5/q6, 4 of q8) and dequantized word-wise: the
low and high nibbles of every byte are split with two masks, the q5/q6 high bits are spread into
place with one multiply per word (docs/kernels/prefill-gemm.md, "v2"), and the sign offset is a
XOR, so every byte holds `code + off` (0..255). Each byte then becomes fp32 with one byte permute
(`prmt`: the byte under the exponent of 2^15 reads as `2^15 + code + off`) and one FMA with
`-(2^15 + off) * scale`; both terms are exact in fp32, so the FMA's single rounding is none and
the result is `scale * code` exactly, rounded once to bf16 before the dot (the scale is folded
into the weight: one bf16 rounding per weight, relative <= 2^-9, as before). `ASM=False`
computes the same values with shifts and an integer subtraction (Triton's interpreter has no
inline assembly).

`N` and `K` are compile-time constants (a kernel image per projection shape: row strides are then
known multiples of 128, so loads vectorize); only the token count `M` is a runtime argument. Rows
past `M` or `N` read a clamped row (no masks in the K loop) and are not stored. The product is
the transposed one, `acc[n, m] = W_tile @ x_tile^T`: Hopper's wgmma reads its left operand from
registers, so the dequantized tile need not be stored for the tensor cores to read.

Epilogues (`EPILOGUE`): 0 stores `y`; 1 stores `residual + y` (one bf16 rounding of the fp32 sum);
2 is SwiGLU over two weights of the same shape (`base2/high2/scales2` = up, the others = gate):
the tile's rows interleave gate and up rows 8 by 8, so each thread holds `gate[f]` and `up[f]`
for the same tokens in its accumulator (the mma layout's "row + 8" register), and stores
`silu(gate) * up` rounded once; each program then covers `BLOCK_N / 2` output features.
"""

from __future__ import annotations

import triton
import triton.language as tl

EPILOGUES = {0: "", 1: "_add", 2: "_swiglu"}


@triton.jit
def _asm_byte(word, m: tl.constexpr, s, c):
    """fp32 `(2^15 + byte m of word) * s + c` (one PRMT, one FMA)."""
    # prmt takes bytes 0..3 from the 2^15 constant and 4..7 from `word`; selector 0x31x0 builds
    # [0, byte, 0, 0x47] (x = 4 + m), i.e. the float 2^15 + byte
    if m == 0:
        return tl.inline_asm_elementwise(
            "{ .reg .b32 t; mov.b32 t, 0x47000000; prmt.b32 t, t, $1, 0x3140; fma.rn.f32 $0, t, $2, $3; }",
            "=r,r,r,r", [word, s, c], dtype=tl.float32, is_pure=True, pack=1)
    elif m == 1:
        return tl.inline_asm_elementwise(
            "{ .reg .b32 t; mov.b32 t, 0x47000000; prmt.b32 t, t, $1, 0x3150; fma.rn.f32 $0, t, $2, $3; }",
            "=r,r,r,r", [word, s, c], dtype=tl.float32, is_pure=True, pack=1)
    elif m == 2:
        return tl.inline_asm_elementwise(
            "{ .reg .b32 t; mov.b32 t, 0x47000000; prmt.b32 t, t, $1, 0x3160; fma.rn.f32 $0, t, $2, $3; }",
            "=r,r,r,r", [word, s, c], dtype=tl.float32, is_pure=True, pack=1)
    else:
        return tl.inline_asm_elementwise(
            "{ .reg .b32 t; mov.b32 t, 0x47000000; prmt.b32 t, t, $1, 0x3170; fma.rn.f32 $0, t, $2, $3; }",
            "=r,r,r,r", [word, s, c], dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def _byte_value(word, m: tl.constexpr, s, OFF: tl.constexpr, ASM: tl.constexpr):
    """`s * (byte m of word - OFF)` in fp32, exact (a byte holds `code + OFF`)."""
    if ASM:
        return _asm_byte(word, m, s, s * -(32768.0 + OFF))
    else:
        return (((word >> (8 * m)) & 0xFF) - OFF).to(tl.float32) * s


@triton.jit
def _words_to_lanes(ev, od, s, OFF: tl.constexpr, ASM: tl.constexpr, BLOCK_N: tl.constexpr):
    """`[BLOCK_N, 64]` fp32 weights from 8 words a row: lane `8w + 2m` is byte m of `ev[:, w]`,
    lane `8w + 2m + 1` byte m of `od[:, w]`."""
    p0 = tl.join(_byte_value(ev, 0, s, OFF, ASM), _byte_value(od, 0, s, OFF, ASM))
    p1 = tl.join(_byte_value(ev, 1, s, OFF, ASM), _byte_value(od, 1, s, OFF, ASM))
    p2 = tl.join(_byte_value(ev, 2, s, OFF, ASM), _byte_value(od, 2, s, OFF, ASM))
    p3 = tl.join(_byte_value(ev, 3, s, OFF, ASM), _byte_value(od, 3, s, OFF, ASM))
    v = tl.join(tl.join(p0, p2), tl.join(p1, p3))  # [BN, 8, 2 (c), 2 (a), 2 (b)], m = 2a + b
    return tl.reshape(tl.permute(v, (0, 1, 3, 4, 2)), (BLOCK_N, 64))


@triton.jit
def _scales(scale_rows, step, BITS: tl.constexpr):
    """fp32 group scales of K step `step`: `[BN, 1]`, or `[BN, 2]` for q8 (two groups a step)."""
    if BITS == 8:
        return tl.load(scale_rows + (2 * step + tl.arange(0, 2))[None, :]).to(tl.float32)
    else:
        return tl.load(scale_rows + step).to(tl.float32)


@triton.jit
def _dequant_tile(base_rows, high_rows, s, step, BITS: tl.constexpr, BLOCK_N: tl.constexpr,
                  ASM: tl.constexpr):
    """bf16 `[BLOCK_N, 64]` tile of W (lanes `64 step .. 64 step + 63`), scale `s` folded in.

    `base_rows` / `high_rows` point at each row's planes (int32 words of `base`, the `high`
    plane as u8 (q5) or u16 (q6)); `s` is `_scales` of this step.
    """
    if BITS == 8:
        w16 = tl.arange(0, 16)
        b = tl.load(base_rows + (step * 16 + w16)[None, :])  # word w: lanes 4w .. 4w + 3
        s0, s1 = tl.split(s)
        s = tl.where((w16 < 8)[None, :], s0[:, None], s1[:, None])
        v = b ^ -0x7F7F7F80  # 0x80808080: code + 128 in every byte
        q = tl.join(tl.join(_byte_value(v, 0, s, 128, ASM), _byte_value(v, 2, s, 128, ASM)),
                    tl.join(_byte_value(v, 1, s, 128, ASM), _byte_value(v, 3, s, 128, ASM)))
        w = tl.reshape(q, (BLOCK_N, 64))
    else:
        w8 = tl.arange(0, 8)
        b = tl.load(base_rows + (step * 8 + w8)[None, :])  # word w: lanes 8w .. 8w + 7
        lo = b & 0x0F0F0F0F  # even lanes, one per byte
        hi = (b >> 4) & 0x0F0F0F0F  # odd lanes
        if BITS == 4:
            w = _words_to_lanes(lo ^ 0x08080808, hi ^ 0x08080808, s, 8, ASM, BLOCK_N)
        elif BITS == 5:
            # high byte w: bit t belongs to lane 8w + t; bits 0,2,4,6 -> bit 4 of bytes 0..3 (x
            # 2^4 + 2^10 + 2^16 + 2^22), bits 1,3,5,7 likewise (x 2^3 + 2^9 + 2^15 + 2^21); the
            # other products land off those bits without a carry into them. Inverted: code + 16
            h = tl.load(high_rows + (step * 8 + w8)[None, :]).to(tl.int32)
            ev = lo | (~((h & 0x55) * 0x410410) & 0x10101010)
            od = hi | (~((h & 0xAA) * 0x208208) & 0x10101010)
            w = _words_to_lanes(ev, od, s, 16, ASM, BLOCK_N)
        else:
            # 16 bits of `high` per word: bits 2t, 2t+1 belong to lane 8w + t; even lanes' pairs
            # (bits 4m, 4m+1) go to bits 4,5 of byte m, two bytes per multiply, likewise odd
            h = tl.load(high_rows + (step * 8 + w8)[None, :]).to(tl.int32)
            e_hi = (((h & 0x0303) * 0x1010) & 0x00300030) | (((h & 0x3030) * 0x10100) & 0x30003000)
            o_hi = (((h & 0x0C0C) * 0x404) & 0x00300030) | (((h & 0xC0C0) * 0x4040) & 0x30003000)
            w = _words_to_lanes((lo | e_hi) ^ 0x20202020, (hi | o_hi) ^ 0x20202020, s, 32, ASM, BLOCK_N)
    return w.to(tl.bfloat16)


def kernel_name(spec) -> str:
    """Entry symbol per specialization, so that one launcher can embed several images."""
    c = spec.constants
    asm = "" if c.get("ASM", True) else "_noasm"
    return (f"ninfer_qgemm_q{c['BITS']}_n{c['N']}_k{c['K']}_t{c['BLOCK_M']}x{c['BLOCK_N']}g{c['GROUP_M']}"
            f"{EPILOGUES[c['EPILOGUE']]}{asm}")


@triton.jit(repr=kernel_name)
def qgemm_kernel(x_ptr, base_ptr, high_ptr, scales_ptr, base2_ptr, high2_ptr, scales2_ptr, res_ptr, y_ptr, M,
                 N: tl.constexpr, K: tl.constexpr, BITS: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr, EPILOGUE: tl.constexpr, ASM: tl.constexpr):
    """One `[BLOCK_M, OUT_N]` tile of y; tiles ordered in GROUP_M-row bands for L2 reuse of W."""
    OUT_N: tl.constexpr = BLOCK_N // 2 if EPILOGUE == 2 else BLOCK_N  # output features per program
    pid = tl.program_id(0)
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n: tl.constexpr = (N + OUT_N - 1) // OUT_N
    per_band = GROUP_M * grid_n
    band = pid // per_band
    first_m = band * GROUP_M
    band_m = min(grid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_band) % band_m
    pid_n = (pid % per_band) // band_m

    # plane rows of the tile (clamped: rows past N repeat row N - 1 and are not stored)
    WN: tl.constexpr = OUT_N  # rows read from each weight
    rows = tl.minimum(pid_n * OUT_N + tl.arange(0, WN), N - 1)[:, None].to(tl.int64)
    if BITS == 8:
        words: tl.constexpr = K // 4
        groups: tl.constexpr = K // 32
    else:
        words: tl.constexpr = K // 8
        groups: tl.constexpr = K // 64
    base_rows = base_ptr.to(tl.pointer_type(tl.int32)) + rows * words
    scale_rows = scales_ptr + rows * groups
    base2_rows = base2_ptr.to(tl.pointer_type(tl.int32)) + rows * words
    scale2_rows = scales2_ptr + rows * groups
    if BITS == 6:
        high_rows = high_ptr.to(tl.pointer_type(tl.uint16)) + rows * (K // 8)
        high2_rows = high2_ptr.to(tl.pointer_type(tl.uint16)) + rows * (K // 8)
    else:
        high_rows = high_ptr + rows * (K // 8)
        high2_rows = high2_ptr + rows * (K // 8)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    lanes = tl.arange(0, 64)
    x_rows = x_ptr + tl.minimum(offs_m, M - 1)[:, None].to(tl.int64) * K
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    STEPS: tl.constexpr = K // 64
    # the scales are read one step ahead (a register prefetch: too small for the cp.async ring)
    s_next = _scales(scale_rows, 0, BITS)
    s2_next = _scales(scale2_rows, 0, BITS)
    for step in range(0, STEPS):
        s = s_next
        s2 = s2_next
        s_next = _scales(scale_rows, min(step + 1, STEPS - 1), BITS)
        if EPILOGUE == 2:
            s2_next = _scales(scale2_rows, min(step + 1, STEPS - 1), BITS)
        xt = tl.load(x_rows + (step * 64 + lanes)[None, :])
        w = _dequant_tile(base_rows, high_rows, s, step, BITS, WN, ASM)
        if EPILOGUE == 2:
            # rows 16a + i gate, 16a + 8 + i up (feature 8a + i): the same thread holds both sums
            w2 = _dequant_tile(base2_rows, high2_rows, s2, step, BITS, WN, ASM)
            w = tl.permute(tl.reshape(tl.join(w, w2), (BLOCK_N // 16, 8, 64, 2)), (0, 3, 1, 2))
            w = tl.reshape(w, (BLOCK_N, 64))
        acc = tl.dot(w, tl.trans(xt), acc)

    m_ok = (offs_m < M)[:, None]
    if EPILOGUE == 2:
        a = tl.permute(tl.reshape(acc, (BLOCK_N // 16, 2, 8, BLOCK_M)), (0, 2, 3, 1))
        g, u = tl.split(a)  # [BLOCK_N // 16, 8, BLOCK_M] each: gate and up of the same features
        h = g * tl.sigmoid(g) * u
        out = tl.trans(tl.reshape(h, (OUT_N, BLOCK_M)))
    else:
        out = tl.trans(acc)
    offs_n = pid_n * OUT_N + tl.arange(0, OUT_N)
    y_off = offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
    if N % OUT_N == 0:
        ok = m_ok
    else:
        ok = m_ok & (offs_n < N)[None, :]
    if EPILOGUE == 1:
        out = out + tl.load(res_ptr + y_off, mask=ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + y_off, out.to(tl.bfloat16), mask=ok)


def grid_size(m: int, n: int, block_m: int, block_n: int, epilogue: int = 0) -> int:
    """Programs of one launch (a 1-D grid: the band ordering is computed in the kernel)."""
    out_n = block_n // 2 if epilogue == 2 else block_n
    return triton.cdiv(m, block_m) * triton.cdiv(n, out_n)
