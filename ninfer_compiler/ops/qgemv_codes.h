// Grouped-int code pairs for the decode GEMVs' tensor-core fragments (qgemv_cuda.cu v3/v4 and
// qgemv5_cuda.cu v5 share them): a thread holds 8 nibbles of a row_split_k128_v1 base word (lane j
// at bits 4j) and, in MMA m (0..3), feeds lanes (m, m + 4) as one bf16x2 A register.
//
// A bf16 half with the 0x43 exponent and an unsigned code u at mantissa bit p is 128 + u * 2^p, so
// one `fma.rn.bf16x2(v, 2^-p, -(128 * 2^-p + 2^(bits-1)))` leaves the signed code exactly (the
// code's top bit enters flipped: u ^ 2^(bits-1) = code + 2^(bits-1)). Choosing p per pair lets the
// q5/q6 high bits be used where one spread of the high byte puts them: per pair SHF (m > 0) +
// 2 LOP3 + HFMA2 (q4: 1 LOP3), about half the ALU work of shifting them into place.
#pragma once
#include <stdint.h>

namespace ninfer_codes {

__device__ __forceinline__ void mma_bf16(float* d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// The same with C = 0: the first MMA of a group starts its fresh fragment without zeroing registers.
__device__ __forceinline__ void mma_bf16_zero(float* d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                              uint32_t b1) {
  const float z = 0.f;
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%10,%10,%10};"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(z));
}

// bf16x2 `v * scale + c` (exact for the small integers here).
__device__ __forceinline__ uint32_t bf16x2_fma(uint32_t v, uint32_t scale, uint32_t c) {
  uint32_t out;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(out) : "r"(v), "r"(scale), "r"(c));
  return out;
}

// (a & M) ^ C and (a & M) | h as one LOP3 each (left to itself the compiler splits them).
template <uint32_t M, uint32_t C>
__device__ __forceinline__ uint32_t and_xor(uint32_t a) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0x6A;" : "=r"(d) : "r"(a), "n"(M), "n"(C));
  return d;
}

template <uint32_t M>
__device__ __forceinline__ uint32_t and_or(uint32_t a, uint32_t h) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "n"(M), "r"(h));
  return d;
}

// The high-plane bits of one 8-lane word, spread for `code_pair`: q5 x = h8 * 0x10010 (lane j's
// bit at 4 + j and 16 + j), x3 = h8 * 0x8008 (at 3 + j and 15 + j), IMADs on the FMA pipe with no
// carries from an 8-bit h8; q6 x = F with lane j's two bits at 2j and lane j + 4's at 16 + 2j.
struct HighBits {
  uint32_t x, x3;
};

__device__ __forceinline__ HighBits q5_high(uint32_t h8) { return {h8 * 0x10010u, h8 * 0x8008u}; }

// bf16x2 signed codes of lanes (M, M + 4) of word w. q5: p = 0, 1, 2, 2 (m = 3 takes x3); q6: p =
// 0, 1, 0, 1 from F << 4, F << 3 (IMAD), F, F >> 1.
template <int BITS, int M>
__device__ __forceinline__ uint32_t code_pair(uint32_t w, HighBits hb) {
  if (BITS == 4) {
    const uint32_t t = M == 0 ? w : (w >> (4 * M));
    return bf16x2_fma(and_xor<0x000F000Fu, 0x43084308u>(t), 0x3F803F80u, 0xC308C308u);  // 128 + (u ^ 8) - 136
  }
  if (BITS == 5) {
    if (M == 0) return bf16x2_fma(and_or<0x000F000Fu>(w, and_xor<0x00100010u, 0x43104310u>(hb.x)), 0x3F803F80u,
                                  0xC310C310u);  // 1, -144
    if (M == 1) return bf16x2_fma(and_or<0x001E001Eu>(w >> 3, and_xor<0x00200020u, 0x43204320u>(hb.x)), 0x3F003F00u,
                                  0xC2A0C2A0u);  // 0.5, -80
    return bf16x2_fma(and_or<0x003C003Cu>(w >> (M == 2 ? 6 : 10), and_xor<0x00400040u, 0x43404340u>(M == 2 ? hb.x : hb.x3)),
                      0x3E803E80u, 0xC240C240u);  // 0.25, -48
  }
  if (M == 0) return bf16x2_fma(and_or<0x000F000Fu>(w, and_xor<0x00300030u, 0x43204320u>(hb.x * 16u)), 0x3F803F80u,
                                0xC320C320u);  // 1, -160
  if (M == 1) return bf16x2_fma(and_or<0x001E001Eu>(w >> 3, and_xor<0x00600060u, 0x43404340u>(hb.x * 8u)), 0x3F003F00u,
                                0xC2C0C2C0u);  // 0.5, -96
  if (M == 2) return bf16x2_fma(and_or<0x000F000Fu>(w >> 8, and_xor<0x00300030u, 0x43204320u>(hb.x)), 0x3F803F80u,
                                0xC320C320u);
  return bf16x2_fma(and_or<0x001E001Eu>(w >> 11, and_xor<0x00600060u, 0x43404340u>(hb.x >> 1)), 0x3F003F00u,
                    0xC2C0C2C0u);
}

}  // namespace ninfer_codes
