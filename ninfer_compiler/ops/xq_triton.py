"""The decode GEMVs' int8 activations written by a Triton kernel that owns whole groups of 64 outputs.

Why: the int8 GEMV entries (ops/qgemv_cuda.cu `v4_stage_i8`) read x as int8 hi / lo bytes with one
scale per group of 64; a producer whose program writes whole groups (the fused GDN step: one value
head; the attention combine: one query head) can quantize its own output in registers, with no
cross-block step, and the projection after it runs on int8 tensor cores.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def xq_store(y, xq, xs, r, k0, N: tl.constexpr):
    """`y` = elements k0 .. k0 + N - 1 of batch row r (< 4; k0, N multiples of 64) as int8
    activations: per group of 64 s = max |y| / 127, y = s (hi + lo / 254), hi and lo int8 (lo the
    residual, so both use the one s), at their bytes of the xq layout (group G = k / 64 is 32 chunks
    of 16 bytes at G * 512; k = 64 G + 16 c + 8 j + 2 i + o at byte 8 j + 4 o + i of chunk
    G * 32 + c * 8 + 2 r (hi) and the next one (lo)); `xs`: the float scales s / (254 * 16) at
    [K / 256][row 4][G % 4]."""
    rn = tl.arange(0, N)
    ay = tl.abs(y)
    sv = tl.full([N], 1.0, tl.float32)
    for gi in tl.static_range(N // 64):
        in_g = rn // 64 == gi
        m = tl.max(tl.where(in_g, ay, 0.0), 0)
        sg = tl.where(m > 0.0, m * (1.0 / 127.0), 1.0)
        sv = tl.where(in_g, sg, sv)
        grp = k0 // 64 + gi
        tl.store(xs + (grp // 4) * 16 + r * 4 + grp % 4, sg / (254.0 * 16.0))
    inv = 1.0 / sv
    hi = tl.minimum(tl.maximum(tl.floor(y * inv + 0.5), -127.0), 127.0)
    lo = tl.minimum(tl.maximum(tl.floor((y - hi * sv) * (254.0 * inv) + 0.5), -127.0), 127.0)
    kk = k0 + rn
    w = kk % 64
    e = w % 8
    off = ((kk // 64) * 32 + (w // 16) * 8 + 2 * r) * 16 + ((w % 16) // 8) * 8 + (e % 2) * 4 + e // 2
    tl.store(xq + off, hi.to(tl.int32).to(tl.int8))
    tl.store(xq + off + 16, lo.to(tl.int32).to(tl.int8))
