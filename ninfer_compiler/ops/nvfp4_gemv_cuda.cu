// nvfp4 decode GEMV (batch 1..8) on the tensor cores, for `ops/nvfp4.py` (`[b, 1, K]` calls).
//
// Why: the Triton GEMV ran at ~11% of HBM bandwidth (docs/kernels/nvfp4.md), latency-bound at
// ~12 instructions per weight. Here a weight costs ~2.5 integer/bf16 instructions and the code plane
// is streamed with 16-byte loads, the next step's loads issued before the current step is computed.
//
// Planes (spec 3.3, as bound by ops/nvfp4.py): codes u8 [N, K/2] (even k in the low nibble),
// block_scales u8 [N, K/16] (E4M3FN, natural row-major order), divisor f32 [1].
//
// Exact dequantization in bf16. A code nibble (s, e1, e0, m) placed with its magnitude at bf16 bits
// 6..8 and its sign at bit 15 is the bf16 e2m1 * 2^-126 (e = 0 lands on the subnormal 0.5 * 2^-126,
// which bf16 arithmetic keeps). The block scale is decoded once per 16 weights to the bf16
// scale * 2^119 (at most 448 * 2^119 < 2^128), and one `fma.rn.bf16x2` per two weights gives
// e2m1 * scale * 2^-7, exact (at most 2 + 4 significant bits, magnitudes 2^-17 .. 21). The factor
// 2^7 / divisor is applied once to the fp32 result.
//
// Nibble pairs. Nibbles i and i + 4 of a code word (k = i and i + 4 of its 8) are 16 bits apart, so
// one shift puts both magnitudes at bf16 bits 6..8 of the two halves (mask 0x01C001C0) and another
// both signs at bits 15 and 31; the signs are XORed into the scale word (one LOP3), and the FMA
// gives the signed product. ~5 instructions per two weights.
//
// Fragments of mma.m16n8k16 (g = lane / 4, c = lane % 4): a0/a2 hold row g, a1/a3 row g + 8, at
// logical k (2c, 2c + 1) and (2c + 8, 2c + 9); b0/b1 hold batch column g at the same k; D holds
// (row g, columns 2c, 2c + 1) and (row g + 8, same columns). Only the sum over k matters, so each
// thread maps its logical k to its own physical k: in a 128-k chunk, thread c reads bytes
// 16c..16c+15 of each of its two rows (k = 32c .. 32c + 31; the 4 threads of a row read 64
// contiguous bytes) and the two E4M3 scales of those 32 k. Word q of the 16 bytes (k = 8q .. 8q+7)
// feeds two MMAs: nibble pair 0 (k 0, 4) gives a0/a1 (rows g, g + 8) and pair 1 (k 1, 5) a2/a3,
// with b0 = (x0, x4), b1 = (x1, x5); pairs 2 and 3 the same with (x2, x6) and (x3, x7).
//
// Layout: a warp owns 16 rows (a tile); `ks` warps of a block split K (contiguous chunk ranges) for
// the same tile and are summed through shared memory, so no output needs zeroing and the launch is
// CUDA-graph safe. A block of ks * slots warps works on `slots` tiles at a time (a group) and loops
// over groups b, b + grid, ... (persistent when the grid is the resident block count), so the
// pipeline runs on across groups instead of restarting in every short-lived block.
#include <cuda_bf16.h>
#include <stdint.h>

#ifndef NVFP4_CH
#define NVFP4_CH 4  // 128-k chunks per pipelined step (16-byte loads per row and thread)
#endif

namespace {

constexpr int kMaxWarps = 16;
constexpr uint32_t kMagMask = 0x01C001C0u;   // bf16 bits 6..8 of both halves
constexpr uint32_t kSignMask = 0x80008000u;

__device__ __forceinline__ void mma_bf16(float* d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// a * s (bf16x2); the -0 addend keeps the product's sign for zero codes and rounds nothing.
__device__ __forceinline__ uint32_t bf16x2_scale(uint32_t a, uint32_t s) {
  uint32_t out;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(out) : "r"(a), "r"(s), "r"(0x80008000u));
  return out;
}

// Pair i (0..3) of code word w, scaled: bf16x2 (e2m1(w[i]), e2m1(w[i + 4])) * 2^-126 * s.
template <int I>
__device__ __forceinline__ uint32_t scaled_pair(uint32_t w, uint32_t s) {
  const uint32_t mag = (I <= 1 ? w << (6 - 4 * I) : w >> (4 * I - 6)) & kMagMask;
  const uint32_t sgn = w << (12 - 4 * I);
  return bf16x2_scale(mag, s ^ (sgn & kSignMask));  // one LOP3
}

// Two E4M3FN scales (low byte: the first 16 k) as bf16x2 words (scale * 2^119) broadcast to both
// halves: `lo` for the first block, `hi` for the second.
__device__ __forceinline__ void decode_scales(uint32_t s2, uint32_t& lo, uint32_t& hi) {
  uint32_t h2;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(static_cast<unsigned short>(s2)));
  const float f0 = __half2float(__ushort_as_half(static_cast<unsigned short>(h2 & 0xFFFFu))) * 0x1p119f;
  const float f1 = __half2float(__ushort_as_half(static_cast<unsigned short>(h2 >> 16))) * 0x1p119f;
  uint32_t both;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(both) : "f"(f1), "f"(f0));  // hi half = f1
  lo = __byte_perm(both, 0u, 0x1010);
  hi = __byte_perm(both, 0u, 0x3232);
}

__device__ __forceinline__ uint32_t word_of(const uint4& v, int q) {
  return q == 0 ? v.x : (q == 1 ? v.y : (q == 2 ? v.z : v.w));
}

// One code word (8 k) of rows g and g + 8 (scale words sa, sb) with its 8 activations: two MMAs.
__device__ __forceinline__ void word_mma(float* acc, uint32_t wa, uint32_t wb, uint32_t sa, uint32_t sb,
                                         const uint4& xv) {
  // xv words: x of k (0, 1), (2, 3), (4, 5), (6, 7)
  mma_bf16(acc, scaled_pair<0>(wa, sa), scaled_pair<0>(wb, sb), scaled_pair<1>(wa, sa), scaled_pair<1>(wb, sb),
           __byte_perm(xv.x, xv.z, 0x5410), __byte_perm(xv.x, xv.z, 0x7632));
  mma_bf16(acc, scaled_pair<2>(wa, sa), scaled_pair<2>(wb, sb), scaled_pair<3>(wa, sa), scaled_pair<3>(wb, sb),
           __byte_perm(xv.y, xv.w, 0x5410), __byte_perm(xv.y, xv.w, 0x7632));
}

__device__ __forceinline__ void store_y(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ void store_y(float* p, float v) { *p = v; }

template <typename TY>
__device__ __forceinline__ void gemv_body(const __nv_bfloat16* __restrict__ x, const uint8_t* __restrict__ codes,
                                          const uint8_t* __restrict__ scales, const float* __restrict__ divisor,
                                          TY* __restrict__ y, uint32_t n_rows, uint32_t k, uint32_t b_rows,
                                          uint32_t ks) {
  __shared__ float part[kMaxWarps * 128];
  const uint32_t warp = threadIdx.x >> 5, lane = threadIdx.x & 31u;
  const uint32_t g = lane >> 2, c = lane & 3u;
  const uint32_t slots = (blockDim.x >> 5) / ks;
  const uint32_t kpart = warp / slots, slot = warp % slots;
  const uint32_t tiles = n_rows >> 4, groups = (tiles + slots - 1u) / slots;
  const uint32_t chunks = k >> 7, per = (chunks + ks - 1u) / ks;
  const uint32_t cbeg = min(kpart * per, chunks), cend = min(cbeg + per, chunks);
  const uint32_t steps = (per + NVFP4_CH - 1u) / NVFP4_CH;  // the same for every warp (barriers)
  const bool has_x = g < b_rows;
  const __nv_bfloat16* xr = x + g * k + c * 32u;
  const float post = 0x1p7f / __ldg(divisor);

  uint4 ca[NVFP4_CH], cb[NVFP4_CH];
  uint32_t sa[NVFP4_CH], sb[NVFP4_CH];
  // Loads of step `s` of group `gi` (clamped to valid addresses; out-of-range data is never used).
  auto load = [&](uint32_t gi, uint32_t s) {
    const uint32_t tile = min(gi * slots + slot, tiles - 1u);
    const uint32_t ra = tile * 16u + g, rb = ra + 8u;
    const uint8_t* pa = codes + ra * (k >> 1) + c * 16u;
    const uint8_t* pb = codes + rb * (k >> 1) + c * 16u;
    const uint8_t* qa = scales + ra * (k >> 4) + c * 2u;
    const uint8_t* qb = scales + rb * (k >> 4) + c * 2u;
#pragma unroll
    for (int u = 0; u < NVFP4_CH; ++u) {
      const uint32_t ch = min(cbeg + s * NVFP4_CH + u, chunks - 1u);
      ca[u] = __ldg(reinterpret_cast<const uint4*>(pa + ch * 64u));
      cb[u] = __ldg(reinterpret_cast<const uint4*>(pb + ch * 64u));
      sa[u] = __ldg(reinterpret_cast<const unsigned short*>(qa + ch * 8u));
      sb[u] = __ldg(reinterpret_cast<const unsigned short*>(qb + ch * 8u));
    }
  };

  // Persistent: block b takes groups b, b + grid, ... (grid <= groups); each warp streams its K range
  // of each group's tile, the next step's loads (possibly of the next group) in flight meanwhile.
  uint32_t gi = blockIdx.x, s = 0;
  if (gi >= groups) return;  // uniform per block
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  load(gi, 0);
  while (true) {
    uint4 ca_c[NVFP4_CH], cb_c[NVFP4_CH];
    uint32_t sa_c[NVFP4_CH], sb_c[NVFP4_CH];
#pragma unroll
    for (int u = 0; u < NVFP4_CH; ++u) {
      ca_c[u] = ca[u]; cb_c[u] = cb[u]; sa_c[u] = sa[u]; sb_c[u] = sb[u];
    }
    uint32_t s_n = s + 1u, gi_n = gi;
    if (s_n == steps) { s_n = 0u; gi_n += gridDim.x; }
    if (gi_n < groups) load(gi_n, s_n);
    const uint32_t row0 = (gi * slots + slot) * 16u;
#pragma unroll
    for (int u = 0; u < NVFP4_CH; ++u) {
      const uint32_t ch = cbeg + s * NVFP4_CH + u;
      if (ch < cend && row0 < n_rows) {
        uint32_t sa_lo, sa_hi, sb_lo, sb_hi;
        decode_scales(sa_c[u], sa_lo, sa_hi);
        decode_scales(sb_c[u], sb_lo, sb_hi);
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          uint4 xv = make_uint4(0u, 0u, 0u, 0u);
          if (has_x) xv = __ldg(reinterpret_cast<const uint4*>(xr + ch * 128u + q * 8u));
          word_mma(acc, word_of(ca_c[u], q), word_of(cb_c[u], q), q < 2 ? sa_lo : sa_hi,
                   q < 2 ? sb_lo : sb_hi, xv);
        }
      }
    }
    if (s_n == 0u) {  // the group is done: sum the K parts, store, reset
      // D: acc[0..1] = row g, batch columns 2c, 2c + 1; acc[2..3] = row g + 8, same columns
      if (ks == 1) {
        if (row0 < n_rows) {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const uint32_t row = row0 + g + (i >> 1) * 8u, col = 2u * c + (i & 1);
            if (col < b_rows) store_y(y + col * n_rows + row, acc[i] * post);
          }
        }
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) part[warp * 128u + (g + (i >> 1) * 8u) * 8u + 2u * c + (i & 1)] = acc[i];
        __syncthreads();
        for (uint32_t t = threadIdx.x; t < slots * 128u; t += blockDim.x) {
          const uint32_t sl = t >> 7, rb = t & 127u, r = rb >> 3, col = rb & 7u;
          const uint32_t row = (gi * slots + sl) * 16u + r;
          if (row >= n_rows || col >= b_rows) continue;
          float v = 0.f;
          for (uint32_t p = 0; p < ks; ++p) v += part[(p * slots + sl) * 128u + rb];
          store_y(y + col * n_rows + row, v * post);
        }
        __syncthreads();
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[i] = 0.f;
      if (gi_n >= groups) break;
    }
    s = s_n;
    gi = gi_n;
  }
}

}  // namespace

// x bf16 [b, K], y [b, N]; N % 16 == 0, K % 128 == 0, b <= 8; blockDim.x = 32 * ks * slots <= 512,
// any gridDim.x (blocks loop over the row groups).
#define NINFER_NVFP4_GEMV(TY, TAG)                                                                      \
  extern "C" __global__ void __launch_bounds__(kMaxWarps * 32)                                          \
      ninfer_nvfp4_gemv_y##TAG(const __nv_bfloat16* x, const uint8_t* codes, const uint8_t* scales,     \
                               const float* divisor, TY* y, uint32_t n_rows, uint32_t k, uint32_t b_rows, \
                               uint32_t ks) {                                                           \
    gemv_body<TY>(x, codes, scales, divisor, y, n_rows, k, b_rows, ks);                                 \
  }

NINFER_NVFP4_GEMV(__nv_bfloat16, bf16)
NINFER_NVFP4_GEMV(float, f32)  // fp32 output: lets the GPU check see fp32-level error
