// Decode GEMVs (batch 1..8) for ninfer's externs (`ops/qgemv.py`).
//
// * v3 (`ninfer_qgemv3_q{4,5,6}_y{bf16,f32}`): grouped-int planes x bf16 activations on the tensor
//   cores. v2 below was issue-bound (one FADD + B FMAs per weight); here a warp owns 16 output rows
//   and runs `mma.sync m16n8k16` (A = 16 rows x 16 k of integer codes, exact in bf16; B = 16 k x 8
//   batch rows), so the batch costs nothing extra and a weight costs ~1.4 (q4) to ~2.4 (q5/q6)
//   integer ops. Details at `v3_body`.
// * v4 (`ninfer_qgemv4_q{4,5,6}_y{bf16,f32}`): v3's math with the weight planes streamed through a
//   per-warp shared-memory ring by cp.async (bytes in flight no longer cost registers). Details at
//   `v4_body`; the launcher uses it from 16 Mi weights up.
// * v2 (`ninfer_qgemv_q*_b*_{bf16,f32}`): SIMT, kept for q8 and fp32 activations.
// * dense (`ninfer_dense_bf16_b*`): bf16 weights [N, K] for small-N decode projections (the GDN
//   gates, N = 48), one block per row so that N = 48 still spreads over 48 SMs. Built alone (with
//   NINFER_GEMV_DENSE_ONLY) into its own extern, so bf16 packages do not carry the int kernels.
//
// v2 comment follows.
// Dequantize-fused GEMV for decode (batch 1..8) over row_split_k128_v1 planes (ninfer's own).
//
// Why this exists: dlight's GEMV over uint8 planes loads one byte per 4-bit weight and is
// instruction-bound (docs/kernel-notes.md). Here every thread reads 16 bytes of `base` at a
// time (32 lanes of a 64-lane group for q4/q5/q6, a whole 32-lane group for q8), the matching
// bits of `high`, and one fp16 scale per 32 lanes; the integer codes are turned into floats
// with the 2^23 exponent trick (no I2F), accumulated per 32 lanes in fp32 and scaled once.
// All batch rows are computed from one weight read. Index math is 32-bit.
//
// Layout: a block of 256 threads = 8 warps. `ks` warps split K for the same rows (reduced
// through shared memory), the other 8/ks warp slots own different rows; each warp owns ROWS
// consecutive output rows and its lanes stride over 32-lane chunks of K.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "qgemv_codes.h"

// Programmatic Dependent Launch (sm_90 and later; the launcher sets the launch attribute unless
// NINFER_PDL=0): a kernel may start while the previous kernel of the stream still runs. Everything
// it reads before `pdl_wait` must be constant for the whole step (weights, scales); activations,
// residuals and outputs are touched only after it. `pdl_trigger` then lets the next launch's blocks
// become resident as this launch's blocks finish, so its weight copies fill this launch's tail.
// Both are no-ops without the attribute. Data written by the previous kernel is read with
// `ld_dep16` (a coherent load, never the read-only data path whose contract is "constant for the
// kernel's lifetime", which now begins before that data is written).
namespace {
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Every kernel here enters the dependent part of its work through `pdl_enter`: the wait, and the
// trigger that lets the next launch start. By default the trigger follows the wait, so at most the
// next launch runs ahead; NINFER_PDL_EARLY=1 (kernel feature `pdl_early`) triggers first, so the next
// launch can start (and issue its own weight copies) while this one still waits for its predecessor.
// Either order is safe: the next launch's own wait still waits for this whole launch.
#ifndef NINFER_PDL_EARLY
#define NINFER_PDL_EARLY 0
#endif
__device__ __forceinline__ void pdl_enter() {
  if (NINFER_PDL_EARLY) {
    pdl_trigger();
    pdl_wait();
  } else {
    pdl_wait();
    pdl_trigger();
  }
}

__device__ __forceinline__ uint4 ld_dep16(const void* p) {
  uint4 v;
  asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// The int8 form of 8 elements of a group of 64 (x = s (hi + lo / 254), s = max |x| / 127): hw / lw
// the hi / lo bytes ([odd]: elements 2 i + odd), sh the group's s. Every lane of the warp calls it
// (the shuffles); lanes 8 j .. 8 j + 7 hold one group; false (nothing computed) unless `valid`.
__device__ __forceinline__ void xq8_round(const float (&f)[8], float m, uint32_t (&hw)[2], uint32_t (&lw)[2],
                                          float& sh);

__device__ __forceinline__ void xq8_floats(const uint32_t (&o)[4], float (&f)[8]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(o[i] << 16);
    f[2 * i + 1] = __uint_as_float(o[i] & 0xFFFF0000u);
  }
}

__device__ __forceinline__ bool xq8_bytes(const uint32_t (&o)[4], uint32_t (&hw)[2], uint32_t (&lw)[2], float& sh,
                                          bool valid) {
  float f[8], m = 0.f;
  xq8_floats(o, f);
#pragma unroll
  for (int i = 0; i < 8; ++i) m = fmaxf(m, fabsf(f[i]));
#pragma unroll
  for (int d = 1; d < 8; d <<= 1) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, d));  // the group's 8 lanes
  if (!valid) return false;
  xq8_round(f, m, hw, lw, sh);
  return true;
}

// The bytes and scale of 8 elements `f` of a group whose max |x| is `m` (fmaxf's: NaN ignored).
__device__ __forceinline__ void xq8_round(const float (&f)[8], float m, uint32_t (&hw)[2], uint32_t (&lw)[2],
                                          float& sh) {
  // any s works as long as hi and lo use the same one (lo keeps the residual): fast reciprocal
  sh = m > 0.f ? m * (1.f / 127.f) : 1.f;
  const float inv = __frcp_rn(sh);
  // rounding to integers by adding 1.5 x 2^23 (full-rate FP ops, no conversions): the low byte of
  // the sum's bits is the rounded value's two's-complement byte; |hi| <= 127 and |lo| <= 127 by
  // construction (|x| <= max, |x - s hi| <= s / 2), so nothing saturates
  constexpr float MAGIC = 12582912.f;
  uint32_t hb[8], lb[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const float yh = f[e] * inv + MAGIC, hi = yh - MAGIC;
    const float yl = (f[e] - hi * sh) * (254.f * inv) + MAGIC;
    hb[e] = __float_as_uint(yh);
    lb[e] = __float_as_uint(yl);
  }
  const auto pack = [](const uint32_t* b, int o) {  // low bytes of b[o], b[o + 2], b[o + 4], b[o + 6]
    return __byte_perm(__byte_perm(b[o], b[o + 2], 0x0040u), __byte_perm(b[o + 4], b[o + 6], 0x0040u), 0x5410u);
  };
  hw[0] = pack(hb, 0), hw[1] = pack(hb, 1), lw[0] = pack(lb, 0), lw[1] = pack(lb, 1);
}

// Vector v's bytes of batch row r (< 4) at their places of the xq layout (`v4_stage_i8`, K % 64 == 0);
// the group's first vector also writes its scale.
__device__ __forceinline__ void xq8_put(const uint32_t (&hw)[2], const uint32_t (&lw)[2], float sh, uint32_t v,
                                        uint32_t r, uint32_t k, uint8_t* xq) {
  const uint32_t grp = v >> 3, m8 = v & 7u;  // lane-in-quad m8 / 2, word m8 % 2 of its chunk
  uint8_t* chunk = xq + (grp * 32u + (m8 >> 1) * 8u + 2u * r) * 16u + (m8 & 1u) * 8u;
  *reinterpret_cast<uint2*>(chunk) = make_uint2(hw[0], hw[1]);
  *reinterpret_cast<uint2*>(chunk + 16u) = make_uint2(lw[0], lw[1]);
  if (m8 == 0u) reinterpret_cast<float*>(xq + 8u * k)[(grp >> 2) * 16u + r * 4u + (grp & 3u)] = sh / (254.f * 16.f);
}

// The int8 activations of one 8-element vector v of batch row r (< 4) into `xq` (the layout of
// `v4_stage_i8`, K % 64 == 0); every lane of the warp calls this (`valid`: whether v is a vector of the row).
__device__ __forceinline__ void norm_xq8(const uint32_t (&o)[4], uint32_t v, uint32_t r, uint32_t k, bool valid,
                                         uint8_t* xq) {
  uint32_t hw[2], lw[2];
  float sh;
  if (!xq8_bytes(o, hw, lw, sh, valid)) return;
  xq8_put(hw, lw, sh, v, r, k, xq);
}
}  // namespace

#define ROWS 4
#define THREADS 256

#ifndef NINFER_GEMV_DENSE_ONLY
namespace {

// 8 consecutive activations as fp32 (one 16-byte load for bf16, two for fp32).
__device__ __forceinline__ void load_x8(const __nv_bfloat16* p, float* out) {
  const uint4 q = ld_dep16(p);
  const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    out[2 * j] = __uint_as_float(w[j] << 16);
    out[2 * j + 1] = __uint_as_float(w[j] & 0xFFFF0000u);
  }
}

__device__ __forceinline__ void load_x8(const float* p, float* out) {
  const uint4 a = ld_dep16(p), b = ld_dep16(p + 4);
  out[0] = __uint_as_float(a.x); out[1] = __uint_as_float(a.y); out[2] = __uint_as_float(a.z); out[3] = __uint_as_float(a.w);
  out[4] = __uint_as_float(b.x); out[5] = __uint_as_float(b.y); out[6] = __uint_as_float(b.z); out[7] = __uint_as_float(b.w);
}

__device__ __forceinline__ uint32_t word(const uint4 v, int i) {
  return i == 0 ? v.x : (i == 1 ? v.y : (i == 2 ? v.z : v.w));
}

__device__ __forceinline__ void store_y(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ void store_y(float* p, float v) { *p = v; }

// Lane i (0..31) of a chunk as the bit pattern of the float 2^23 + code + 2^(bits-1); that
// float minus (2^23 + 2^(bits-1)) is the signed code, exactly (no int-to-float conversion).
template <int BITS>
__device__ __forceinline__ uint32_t code_bits(const uint4 b0, const uint4 b1, uint32_t h0,
                                              uint32_t h1, int i) {
  if (BITS == 8) {
    const uint32_t w = i < 16 ? word(b0, i >> 2) : word(b1, (i >> 2) - 4);
    return (((w >> (8 * (i & 3))) & 0xFFu) ^ 0x80u) | 0x4B000000u;
  }
  uint32_t v = (word(b0, i >> 3) >> (4 * (i & 7))) & 0xFu;
  if (BITS == 5) v |= ((h0 >> i) & 1u) << 4;
  if (BITS == 6) v |= (((i < 16 ? h0 : h1) >> (2 * (i & 15))) & 3u) << 4;
  return (v ^ (1u << (BITS - 1))) | 0x4B000000u;
}

template <int BITS, int B, typename T>
__device__ __forceinline__ void gemv_body(const T* __restrict__ x, const uint8_t* __restrict__ base,
                                          const uint8_t* __restrict__ high,
                                          const __half* __restrict__ scales, T* __restrict__ y,
                                          uint32_t n_rows, uint32_t k, uint32_t b_rows, uint32_t ks,
                                          uint32_t y_stride) {
  constexpr uint32_t GROUP = BITS == 8 ? 32u : 64u;
  constexpr uint32_t HBYTES = BITS == 5 ? 8u : (BITS == 6 ? 16u : 0u);
  constexpr float OFFSET = 8388608.0f + float(1u << (BITS - 1));
  __shared__ float partial[8][ROWS * B];

  const uint32_t warp = threadIdx.x >> 5, lane = threadIdx.x & 31u;
  const uint32_t slots = 8u / ks;  // row sets per block
  const uint32_t kpart = warp / slots, slot = warp % slots;
  const uint32_t row0 = (blockIdx.x * slots + slot) * ROWS;
  const uint32_t groups = k / GROUP;
  const uint32_t base_stride = groups * 32u;  // bytes per row of `base`
  const uint32_t high_stride = groups * HBYTES;
  const uint32_t chunks = k / 32u;

  float acc[ROWS][B];
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
#pragma unroll
    for (int b = 0; b < B; ++b) acc[r][b] = 0.f;

  pdl_enter();
  if (row0 < n_rows) {
    for (uint32_t c = kpart * 32u + lane; c < chunks; c += 32u * ks) {
      // weights of the ROWS rows for chunk c: 16 B (q4/5/6) or 32 B (q8) of base each
      uint4 wb0[ROWS], wb1[ROWS];
      uint32_t wh0[ROWS], wh1[ROWS];
      float sc[ROWS];
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        const uint32_t row = row0 + r;
        if (BITS == 8) {
          const uint4* p = reinterpret_cast<const uint4*>(base + row * base_stride + c * 32u);
          wb0[r] = __ldg(p);
          wb1[r] = __ldg(p + 1);
        } else {
          wb0[r] = __ldg(reinterpret_cast<const uint4*>(base + row * base_stride + c * 16u));
          wb1[r] = wb0[r];
        }
        wh0[r] = 0u;
        wh1[r] = 0u;
        if (BITS == 5) wh0[r] = __ldg(reinterpret_cast<const uint32_t*>(high + row * high_stride + c * 4u));
        if (BITS == 6) {
          uint2 h = __ldg(reinterpret_cast<const uint2*>(high + row * high_stride + c * 8u));
          wh0[r] = h.x;
          wh1[r] = h.y;
        }
        sc[r] = __half2float(scales[row * groups + (BITS == 8 ? c : (c >> 1))]);
      }
      float part[ROWS][B];
#pragma unroll
      for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int b = 0; b < B; ++b) part[r][b] = 0.f;
#pragma unroll
      for (int q = 0; q < 4; ++q) {  // 8 lanes of the chunk at a time
        float xs[B][8];
#pragma unroll
        for (int b = 0; b < B; ++b) {
          const uint32_t bb = b < (int)b_rows ? b : 0u;  // padded batch rows read row 0, never stored
          load_x8(x + bb * k + c * 32u + q * 8u, xs[b]);
        }
#pragma unroll
        for (int r = 0; r < ROWS; ++r)
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            const float w = __uint_as_float(code_bits<BITS>(wb0[r], wb1[r], wh0[r], wh1[r], q * 8 + j)) - OFFSET;
#pragma unroll
            for (int b = 0; b < B; ++b) part[r][b] = fmaf(w, xs[b][j], part[r][b]);
          }
      }
#pragma unroll
      for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int b = 0; b < B; ++b) acc[r][b] = fmaf(sc[r], part[r][b], acc[r][b]);
    }
  }
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
#pragma unroll
    for (int b = 0; b < B; ++b) {
      float v = acc[r][b];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
      acc[r][b] = v;
    }
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
      for (int b = 0; b < B; ++b) partial[warp][r * B + b] = acc[r][b];
  }
  __syncthreads();
  // one thread per (slot, row, batch row): sum the ks K-parts and store
  const uint32_t t = threadIdx.x;
  if (t < slots * ROWS * B) {
    const uint32_t s = t / (ROWS * B), rb = t % (ROWS * B);
    const uint32_t r = rb / B, b = rb % B;
    float v = 0.f;
    for (uint32_t p = 0; p < ks; ++p) v += partial[p * slots + s][rb];
    const uint32_t row = (blockIdx.x * slots + s) * ROWS + r;
    if (row < n_rows && b < b_rows) store_y(y + b * y_stride + row, v);
  }
}

}  // namespace

#define NINFER_QGEMV(BITS, B, T, TAG)                                                              \
  extern "C" __global__ void __launch_bounds__(THREADS)                                             \
      ninfer_qgemv_q##BITS##_b##B##_##TAG(const T* x, const uint8_t* base, const uint8_t* high,     \
                                          const __half* scales, T* y, uint32_t n_rows, uint32_t k,  \
                                          uint32_t b_rows, uint32_t ks, uint32_t y_stride) {        \
    gemv_body<BITS, B, T>(x, base, high, scales, y, n_rows, k, b_rows, ks, y_stride);              \
  }

#define NINFER_QGEMV_BATCHES(BITS, T, TAG) \
  NINFER_QGEMV(BITS, 1, T, TAG)            \
  NINFER_QGEMV(BITS, 2, T, TAG)            \
  NINFER_QGEMV(BITS, 4, T, TAG)            \
  NINFER_QGEMV(BITS, 8, T, TAG)

#ifndef NINFER_GEMV_SKIP_V2  // (the CPU tests compile v3 and dense alone, to stay fast)
NINFER_QGEMV_BATCHES(4, __nv_bfloat16, bf16)
NINFER_QGEMV_BATCHES(5, __nv_bfloat16, bf16)
NINFER_QGEMV_BATCHES(6, __nv_bfloat16, bf16)
NINFER_QGEMV_BATCHES(8, __nv_bfloat16, bf16)
NINFER_QGEMV_BATCHES(4, float, f32)
NINFER_QGEMV_BATCHES(5, float, f32)
NINFER_QGEMV_BATCHES(6, float, f32)
NINFER_QGEMV_BATCHES(8, float, f32)
#endif  // NINFER_GEMV_SKIP_V2

// ------------------------------------------------------------------------------------------------
// v3: tensor-core GEMV over row_split_k128_v1 planes (bf16 activations, q4/q5/q6).
//
// Fragments of mma.m16n8k16 (g = lane / 4, c = lane % 4): A regs a0/a2 hold row g, a1/a3 row g + 8,
// each a bf16 pair at logical k (2c, 2c + 1) for a0/a1 and (2c + 8, 2c + 9) for a2/a3; B regs b0/b1
// hold batch column g at the same k; D holds (row g, cols 2c, 2c + 1) and (row g + 8, same cols).
// Only the sum over k matters, so logical k may map to any physical lane as long as A and B agree.
// Thread c reads bytes 8c..8c+7 of its rows' 32-byte group of `base`, i.e. lanes 16c..16c+15, as
// words w0 (lanes +0..7) and w1 (lanes +8..15). In MMA m (0..3) of the group the pair of a0/a1 is
// lanes (16c + m, 16c + m + 4) = nibbles m and m + 4 of w0, pulled out by one shift and the mask
// 0x000F000F; a2/a3 take the same from w1 (lanes 16c + 8 + m, 16c + 12 + m). The activations of
// those lanes are paired with one PRMT each. Codes: the bf16 pattern 0x4300 | v is 128 + v exactly;
// with the code's sign bit flipped into v, one bf16x2 FMA subtracting 128 + 2^(bits-1) leaves the
// signed code, exact. The 4 MMAs of a group accumulate into a fresh fragment that is scaled once
// (fp32 FFMA) into the accumulator, so weights are never rounded and each group is scaled once.
//
// Layout: a warp owns 16 rows; `ks` warps of a block split K (in 128-lane chunks, contiguous
// ranges) for the same rows and are summed through shared memory; blocks have max(8, ks) warps.
// ------------------------------------------------------------------------------------------------
namespace {

constexpr int V3_MAX_WARPS = 16;
constexpr int V3_UC = 2;  // 128-lane chunks per loop step (4 groups: 128 bytes of each base row)

using ninfer_codes::code_pair;
using ninfer_codes::HighBits;
using ninfer_codes::mma_bf16;

// The spread high bits of one 8-lane word (`half` of the thread's 16 lanes in `h`; qgemv_codes.h).
template <int BITS>
__device__ __forceinline__ HighBits high_word(uint32_t h, int half) {
  if (BITS == 5) return ninfer_codes::q5_high(half ? (h >> 8) : (h & 0xFFu));  // h: 16 lanes' bits
  if (BITS == 6) return {__byte_perm(h, 0u, half ? 0x4342 : 0x4140), 0u};
  return {0u, 0u};
}

// `code_pair` for an unrolled loop index m (0..3): the selection folds away.
template <int BITS>
__device__ __forceinline__ uint32_t v3_pair(uint32_t w, HighBits hb, int m) {
  return m == 0 ? code_pair<BITS, 0>(w, hb)
                : m == 1 ? code_pair<BITS, 1>(w, hb) : m == 2 ? code_pair<BITS, 2>(w, hb) : code_pair<BITS, 3>(w, hb);
}

__device__ __forceinline__ void store_v3(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ void store_v3(float* p, float v) { *p = v; }

template <int BITS, typename TY>
__device__ __forceinline__ void v3_body(const __nv_bfloat16* __restrict__ x, const uint8_t* __restrict__ base,
                                        const uint8_t* __restrict__ high, const __half* __restrict__ scales,
                                        TY* __restrict__ y, uint32_t n_rows, uint32_t k, uint32_t b_rows,
                                        uint32_t ks, uint32_t y_stride) {
  constexpr uint32_t HB = BITS == 5 ? 8u : (BITS == 6 ? 16u : 0u);  // high bytes per group
  __shared__ float part[V3_MAX_WARPS * 128];

  const uint32_t warp = threadIdx.x >> 5, lane = threadIdx.x & 31u;
  const uint32_t g = lane >> 2, c = lane & 3u;
  const uint32_t slots = (blockDim.x >> 5) / ks;
  const uint32_t kpart = warp / slots, slot = warp % slots;
  const uint32_t row0 = (blockIdx.x * slots + slot) * 16u;
  const uint32_t groups = k >> 6, chunks = k >> 7;
  const uint32_t cbeg = kpart * chunks / ks, cend = (kpart + 1u) * chunks / ks;

  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  pdl_enter();
  if (row0 < n_rows) {
    const uint32_t ra = row0 + g, rb = ra + 8u;
    const uint8_t* pa = base + ra * (groups * 32u) + c * 8u;
    const uint8_t* pb = base + rb * (groups * 32u) + c * 8u;
    const uint8_t* ha = high + ra * (groups * HB) + c * (HB / 4u);
    const uint8_t* hb = high + rb * (groups * HB) + c * (HB / 4u);
    const __half* sa = scales + ra * groups;
    const __half* sb = scales + rb * groups;
    const bool has_x = g < b_rows;
    const __nv_bfloat16* xr = x + g * k + c * 16u;
    for (uint32_t ci = cbeg; ci < cend; ci += V3_UC) {
      uint2 wa[2 * V3_UC], wb[2 * V3_UC];
      uint32_t hva[2 * V3_UC], hvb[2 * V3_UC];
      __half2 sca[V3_UC], scb[V3_UC];
      uint4 xv[2 * V3_UC][2];
#pragma unroll
      for (int u = 0; u < V3_UC; ++u) {
        if (ci + u < cend) {
          const uint32_t ch = ci + u;
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            const uint32_t gi = 2u * ch + j;
            wa[2 * u + j] = __ldg(reinterpret_cast<const uint2*>(pa + gi * 32u));
            wb[2 * u + j] = __ldg(reinterpret_cast<const uint2*>(pb + gi * 32u));
            hva[2 * u + j] = hvb[2 * u + j] = 0u;
            if (BITS == 5) {
              hva[2 * u + j] = __ldg(reinterpret_cast<const unsigned short*>(ha + gi * HB));
              hvb[2 * u + j] = __ldg(reinterpret_cast<const unsigned short*>(hb + gi * HB));
            }
            if (BITS == 6) {
              hva[2 * u + j] = __ldg(reinterpret_cast<const uint32_t*>(ha + gi * HB));
              hvb[2 * u + j] = __ldg(reinterpret_cast<const uint32_t*>(hb + gi * HB));
            }
            if (has_x) {
              const uint4* xp = reinterpret_cast<const uint4*>(xr + gi * 64u);
              xv[2 * u + j][0] = ld_dep16(xp);
              xv[2 * u + j][1] = ld_dep16(xp + 1);
            } else {
              xv[2 * u + j][0] = xv[2 * u + j][1] = make_uint4(0u, 0u, 0u, 0u);
            }
          }
          sca[u] = __ldg(reinterpret_cast<const __half2*>(sa + 2u * ch));
          scb[u] = __ldg(reinterpret_cast<const __half2*>(sb + 2u * ch));
        }
      }
#pragma unroll
      for (int u = 0; u < V3_UC; ++u) {
        if (ci + u < cend) {
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            const int q = 2 * u + j;
            const HighBits fa0 = high_word<BITS>(hva[q], 0), fa1 = high_word<BITS>(hva[q], 1);
            const HighBits fb0 = high_word<BITS>(hvb[q], 0), fb1 = high_word<BITS>(hvb[q], 1);
            const uint4 x0 = xv[q][0], x1 = xv[q][1];
            float t[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int m = 0; m < 4; ++m) {
              const uint32_t sel = (m & 1) ? 0x7632u : 0x5410u;
              const uint32_t b0 = __byte_perm(m < 2 ? x0.x : x0.y, m < 2 ? x0.z : x0.w, sel);
              const uint32_t b1 = __byte_perm(m < 2 ? x1.x : x1.y, m < 2 ? x1.z : x1.w, sel);
              mma_bf16(t, v3_pair<BITS>(wa[q].x, fa0, m), v3_pair<BITS>(wb[q].x, fb0, m),
                       v3_pair<BITS>(wa[q].y, fa1, m), v3_pair<BITS>(wb[q].y, fb1, m), b0, b1);
            }
            const float s_a = __low2float(j == 0 ? sca[u] : __lowhigh2highlow(sca[u]));
            const float s_b = __low2float(j == 0 ? scb[u] : __lowhigh2highlow(scb[u]));
            acc[0] = fmaf(t[0], s_a, acc[0]);
            acc[1] = fmaf(t[1], s_a, acc[1]);
            acc[2] = fmaf(t[2], s_b, acc[2]);
            acc[3] = fmaf(t[3], s_b, acc[3]);
          }
        }
      }
    }
  }
  // D: acc[0..1] = row g, batch cols 2c, 2c + 1; acc[2..3] = row g + 8, same cols
  if (ks == 1) {
    if (row0 < n_rows) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t row = row0 + g + (i >> 1) * 8u, col = 2u * c + (i & 1);
        if (col < b_rows) store_v3(y + col * y_stride + row, acc[i]);
      }
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) part[warp * 128u + (g + (i >> 1) * 8u) * 8u + 2u * c + (i & 1)] = acc[i];
  __syncthreads();
  for (uint32_t t = threadIdx.x; t < slots * 128u; t += blockDim.x) {
    const uint32_t s = t >> 7, rb = t & 127u, r = rb >> 3, col = rb & 7u;
    const uint32_t row = (blockIdx.x * slots + s) * 16u + r;
    if (row >= n_rows || col >= b_rows) continue;
    float v = 0.f;
    for (uint32_t p = 0; p < ks; ++p) v += part[(p * slots + s) * 128u + rb];
    store_v3(y + col * y_stride + row, v);
  }
}

}  // namespace

#define NINFER_QGEMV3(BITS, TY, TAG)                                                                 \
  extern "C" __global__ void __launch_bounds__(V3_MAX_WARPS * 32)                                     \
      ninfer_qgemv3_q##BITS##_y##TAG(const __nv_bfloat16* x, const uint8_t* base, const uint8_t* high, \
                                     const __half* scales, TY* y, uint32_t n_rows, uint32_t k,        \
                                     uint32_t b_rows, uint32_t ks, uint32_t y_stride) {               \
    v3_body<BITS, TY>(x, base, high, scales, y, n_rows, k, b_rows, ks, y_stride);                     \
  }

NINFER_QGEMV3(4, __nv_bfloat16, bf16)
NINFER_QGEMV3(5, __nv_bfloat16, bf16)
NINFER_QGEMV3(6, __nv_bfloat16, bf16)
NINFER_QGEMV3(4, float, f32)  // fp32 output: lets the GPU check see fp32-level error
NINFER_QGEMV3(5, float, f32)
NINFER_QGEMV3(6, float, f32)

// ------------------------------------------------------------------------------------------------
// v4: v3's tensor-core math with the weight planes streamed through shared memory by cp.async.
//
// Why: v3 at batch 1 reached 21-64% of the H200's bandwidth because only a few 8-byte loads per
// thread were in flight (~20 KB per SM at 80-95 registers); prefetching into registers cost
// occupancy. Here each warp owns a ring of STAGES stages in shared memory; a stage is 4 groups
// (256 k) of its 16 rows: 16 x 128 B of `base`, 16 x 4 x HB of `high` and 16 x 8 B of scales,
// copied with 16-byte `cp.async.cg` (4-byte `cp.async.ca` for the scales). STAGES - 1 stages are
// in flight while one is computed, so bytes in flight no longer depend on registers (q4: 2,176 B
// per stage). The default depth is 2 (double buffering): on the H200 deeper rings lost more to
// occupancy (shared memory) than they gained (docs/kernels/decode-gemv-v4.md). Warps sync only
// with `__syncwarp` (each warp has its own ring). Fragments and math are v3's (`v3_pair`,
// `high_word`, `mma_bf16`); the bytes a thread reads are the same, only fetched from shared memory,
// with an XOR swizzle of the 16-byte pieces so that the 8 rows of a fragment load hit distinct
// banks (tests/compiler/ops/test_qgemv_v4.py replays both index maps). Activations are read through
// L1 as in v3. K is split in stage units (needs K % 256 == 0) over `ks` warps of a block (summed
// through the ring's memory at the end); blocks have max(4, ks) warps, dynamic shared memory
// warps x STAGES x stage bytes (up to 51 KB at depth 2: opted in with cuFuncSetAttribute by the
// launcher). The loop computes no addresses (`V4Lane`: per-lane sources advanced by constants,
// fixed slot offsets, running slot indices), so it is the math plus 6-7 copies per stage.
// NINFER_V4_DIAG builds are for measurements only (wrong results).
// ------------------------------------------------------------------------------------------------
#ifndef NINFER_V4_STAGES_Q4
#define NINFER_V4_STAGES_Q4 2
#endif
#ifndef NINFER_V4_STAGES_Q5
#define NINFER_V4_STAGES_Q5 2
#endif
#ifndef NINFER_V4_STAGES_Q6
#define NINFER_V4_STAGES_Q6 2
#endif
// measurement builds only: 1 = loads without the math (bf16 and int8 stages), 2 = math without activation loads, 3 = no
// work at all (the launch and its PDL wait), 4 = the weight stream alone (1 without activation loads)
#ifndef NINFER_V4_DIAG
#define NINFER_V4_DIAG 0
#endif
// Registers per thread of every v4 entry: 80 keeps 3 blocks of 8 warps per SM (the q5 ring's shared
// memory allows no more). Left to launch bounds, ptxas took 104-118 for the address-free loop (2
// blocks per SM) or, for some entries, 64 with spills; under the cap it keeps a few loop-invariant
// values in local memory, stored before the loop and reloaded (L1 hits) at most twice per stage by
// the q4 entries (tests/compiler/ops/test_qgemv_v4.py). Measured caps: docs/kernels/decode-gemv-v4.md.
#ifndef NINFER_V4_MAXREG
#define NINFER_V4_MAXREG 80
#endif
#define NINFER_V4_BOUNDS __maxnreg__(NINFER_V4_MAXREG)
// The same for the entries on int8 activations (their loop needs fewer registers: at 72 they keep
// three blocks per SM with room for a block of the next launch, at 64 four fit without a spill in
// the loop). A measurement knob until a run decides (`bench_27b.py prepare --variant
// NAME=NINFER_V4_MAXREG_I8=72`).
#ifndef NINFER_V4_MAXREG_I8
#define NINFER_V4_MAXREG_I8 NINFER_V4_MAXREG
#endif
#define NINFER_V4_BOUNDS_I8 __maxnreg__(NINFER_V4_MAXREG_I8)
// Where a warp issues the copies of stage i + STAGES - 1: 0 = after waiting for stage i (at most
// STAGES - 1 stages in flight while it waits), 1 = before (STAGES in flight while it waits: the slot
// it fills is stage i - 1's, already computed), 2 = as 1, with the whole ring (STAGES stages, not
// STAGES - 1) copied before the PDL wait, i.e. while the previous launch still runs. The same
// shared memory in every order.
#ifndef NINFER_V4_ISSUE_AHEAD
#define NINFER_V4_ISSUE_AHEAD 0
#endif
// Measurement switch: the stage loop order of the XQN entries (the norm in the prologue): 0 as the
// default entries; 2 = the whole ring copied before the PDL wait, so that each warp has STAGES
// stages in flight while its block computes the norm
#ifndef NINFER_V4_XQN_ORDER
#define NINFER_V4_XQN_ORDER 0
#endif
#ifndef NINFER_V4_CP_HINT  // e.g. ".L2::256B" (an L2 prefetch size for the 16-byte copies)
#define NINFER_V4_CP_HINT ""
#endif
namespace {

template <int BITS>
struct V4 {
  static constexpr uint32_t HB = BITS == 5 ? 8u : (BITS == 6 ? 16u : 0u);  // high bytes per group
  static constexpr uint32_t BASE = 16u * 128u;                             // 16 rows x 4 groups x 32 B
  static constexpr uint32_t HIGH = 16u * 4u * HB;
  static constexpr uint32_t STAGE = BASE + HIGH + 16u * 8u;                // + 16 rows x 4 fp16 scales
  static constexpr uint32_t STAGES = BITS == 4 ? NINFER_V4_STAGES_Q4 : (BITS == 5 ? NINFER_V4_STAGES_Q5 : NINFER_V4_STAGES_Q6);
};

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global" NINFER_V4_CP_HINT " [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}

__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src) : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// The wait before stage i in the issue-ahead order (NINFER_V4_ISSUE_AHEAD), after stage i + S - 1's
// group is committed. Groups in commit order: the prologue's weights of stages 0 .. S - 2 (one
// each), with staged activations (`xst`) one group for all of their activations, then one per loop
// stage. Stage i has landed once at most the newest S - 1 groups are pending, unless the
// activation group is among those: before stage S - 2 (it is then the (i + 2)-th newest), where
// at most i + 1 may be (tests/compiler/ops/test_qgemv_v4.py replays this schedule).
template <uint32_t S>
__device__ __forceinline__ void v4_wait_ahead(bool xst, uint32_t i) {
  if constexpr (S <= 2u) {
    cp_async_wait<S - 1>();  // (S = 2: at most stage i + 1's group, the newest, is left pending)
  } else if (!xst || i >= S - 2u) {
    cp_async_wait<S - 1>();
  } else if (i == 0u) {
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();  // (S >= 4 only; also correct, waits longer)
  }
}

// A lane's share of every stage copy (`v4_copy`): its source pointers at the warp's current unit
// and its destinations inside a ring slot. Piece p (16 B) of base row r of a stage lands at piece
// p ^ 2(r % 4) of the slot's row r; high pieces are swizzled the same way for their row length (see
// v4_stage), scales are not. Lane l copies base pieces (row 4j + l / 8, piece l % 8) for j = 0..3,
// q5 high (row l / 2, piece l % 2), q6 high (row 8j + l / 4, piece l % 4) for j = 0, 1, and the 4
// scale bytes of row l / 2 at l % 2. Every swizzle depends on the lane only (r % 4 = l / 8 for the
// base, r / 4 % 2 = l / 8 % 2 for q5, r / 2 % 4 = l / 8 for q6), so a slot's destinations are fixed
// offsets and a unit advances every source by a constant: the loop computes no addresses.
struct V4Lane {
  const uint8_t* base;    // base piece j at + j * rows4
  const uint8_t* high;    // high piece (q6: piece j at + j * hrows8)
  const uint8_t* scales;  // 4 bytes
  uint32_t rows4, hrows8;
  uint32_t dbase, dhigh, dscale;  // slot offsets (base piece j at dbase + 512 j; q6 high j at dhigh + 512 j)
};

template <int BITS>
__device__ __forceinline__ V4Lane v4_lane(const uint8_t* __restrict__ base, const uint8_t* __restrict__ high,
                                          const __half* __restrict__ scales, uint32_t row0, uint32_t groups,
                                          uint32_t u, uint32_t lane) {
  constexpr uint32_t HB = V4<BITS>::HB;
  const uint32_t rb = lane >> 3, pb = lane & 7u;
  V4Lane l;
  l.base = base + (row0 + rb) * (groups * 32u) + u * 128u + pb * 16u;
  l.rows4 = 4u * groups * 32u;
  l.dbase = rb * 128u + ((pb ^ (rb << 1)) << 4);
  l.high = nullptr;
  l.hrows8 = 0u;
  l.dhigh = V4<BITS>::BASE;
  if (BITS == 5) {
    const uint32_t r = lane >> 1, p = lane & 1u;
    l.high = high + (row0 + r) * (groups * HB) + u * 32u + p * 16u;
    l.dhigh = V4<5>::BASE + r * 32u + ((p ^ ((r >> 2) & 1u)) << 4);
  }
  if (BITS == 6) {
    const uint32_t r = lane >> 2, p = lane & 3u;
    l.high = high + (row0 + r) * (groups * HB) + u * 64u + p * 16u;
    l.hrows8 = 8u * groups * HB;
    l.dhigh = V4<6>::BASE + r * 64u + ((p ^ (lane >> 3)) << 4);
  }
  l.scales = reinterpret_cast<const uint8_t*>(scales + (row0 + (lane >> 1)) * groups + 2u * (lane & 1u)) + u * 8u;
  l.dscale = V4<BITS>::BASE + V4<BITS>::HIGH + lane * 4u;
  return l;
}

// Copies the lane's pieces of its current unit into the slot at shared address `slot`, then moves
// its sources to the next unit (4 groups: 128 B of each base row, 4 x HB of high, 8 B of scales).
template <int BITS>
__device__ __forceinline__ void v4_copy(uint32_t slot, V4Lane& l) {
#pragma unroll
  for (uint32_t j = 0; j < 4; ++j) cp_async16(slot + l.dbase + j * 512u, l.base + j * l.rows4);
  if (BITS == 5) cp_async16(slot + l.dhigh, l.high);
  if (BITS == 6) {
    cp_async16(slot + l.dhigh, l.high);
    cp_async16(slot + l.dhigh + 512u, l.high + l.hrows8);
  }
  cp_async4(slot + l.dscale, l.scales);
  l.base += 128u;
  l.high += 4u * V4<BITS>::HB;
  l.scales += 8u;
}

// A slot's fp16 group scales of rows g (a) and g + 8 (b), two groups per half2, and group q's as fp32.
struct V4Scales {
  __half2 a01, a23, b01, b23;
};

__device__ __forceinline__ V4Scales v4_scales(const uint8_t* scales, uint32_t g) {
  const __half2* sc = reinterpret_cast<const __half2*>(scales);
  return {sc[2u * g], sc[2u * g + 1u], sc[2u * g + 16u], sc[2u * g + 17u]};
}

__device__ __forceinline__ float v4_scale(__half2 s01, __half2 s23, int q) {
  const __half2 h = q < 2 ? s01 : s23;
  return (q & 1) ? __high2float(h) : __low2float(h);
}

// This thread's 8 base bytes of group q in rows g (wa) and g + 8 (wb) of the slot at `s`; the rows
// share the swizzle (it depends on r % 4, r / 2 % 4 and r / 4 % 2 only).
__device__ __forceinline__ void v4_base_words(const uint8_t* s, uint32_t g, uint32_t c, int q, uint2& wa, uint2& wb) {
  const uint32_t boff = ((((2u * q) + (c >> 1)) ^ ((g & 3u) << 1)) << 4) + (c & 1u) * 8u;
  wa = *reinterpret_cast<const uint2*>(s + g * 128u + boff);
  wb = *reinterpret_cast<const uint2*>(s + (g + 8u) * 128u + boff);
}

// The 4 groups of one stage (at `s`, generic pointer to shared memory) into acc, as v3 does per group.
// `xs`: this thread's activations of the stage (batch row g, or row 0 for the padding columns g >=
// b_rows: their products land in output columns that are never stored).
template <int BITS, bool PDL>
__device__ __forceinline__ void v4_stage(const uint8_t* s, const __nv_bfloat16* xs, uint32_t g, uint32_t c,
                                         float* acc) {
  constexpr uint32_t BASE = V4<BITS>::BASE, HIGH = V4<BITS>::HIGH;
  uint4 xv[4][2];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    if (NINFER_V4_DIAG == 2 || NINFER_V4_DIAG == 4) {
      xv[q][0] = xv[q][1] = make_uint4(0x3F803F80u, 0x3F803F80u, 0x3F803F80u, 0x3F803F80u);
    } else {
      const uint4* xp = reinterpret_cast<const uint4*>(xs + q * 64);
      xv[q][0] = PDL ? ld_dep16(xp) : __ldg(xp);
      xv[q][1] = PDL ? ld_dep16(xp + 1) : __ldg(xp + 1);
    }
  }
  const V4Scales sc = v4_scales(s + BASE + HIGH, g);
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    uint2 wa, wb;
    v4_base_words(s, g, c, q, wa, wb);
    HighBits fa0{0u, 0u}, fa1{0u, 0u}, fb0{0u, 0u}, fb1{0u, 0u};
    uint32_t hva = 0u, hvb = 0u;  // (measurement builds)
    if (BITS == 5) {  // one byte per 8-lane word: byte loads, no masking
      const uint32_t hoff = BASE + ((((q >> 1)) ^ ((g >> 2) & 1u)) << 4) + (q & 1) * 8u + c * 2u;
      const uint8_t* ha = s + hoff + g * 32u;
      const uint8_t* hb = s + hoff + (g + 8u) * 32u;
      fa0 = ninfer_codes::q5_high(ha[0]);
      fa1 = ninfer_codes::q5_high(ha[1]);
      fb0 = ninfer_codes::q5_high(hb[0]);
      fb1 = ninfer_codes::q5_high(hb[1]);
      hva = ha[0];
      hvb = hb[0];
    }
    if (BITS == 6) {
      const uint32_t hoff = BASE + ((q ^ ((g >> 1) & 3u)) << 4) + c * 4u;
      hva = *reinterpret_cast<const uint32_t*>(s + hoff + g * 64u);
      hvb = *reinterpret_cast<const uint32_t*>(s + hoff + (g + 8u) * 64u);
      fa0 = high_word<6>(hva, 0);
      fa1 = high_word<6>(hva, 1);
      fb0 = high_word<6>(hvb, 0);
      fb1 = high_word<6>(hvb, 1);
    }
    const uint4 x0 = xv[q][0], x1 = xv[q][1];
    if (NINFER_V4_DIAG == 1 || NINFER_V4_DIAG == 4) {  // every loaded word feeds the result, no conversion, no MMA
      acc[q] += __uint_as_float((wa.x ^ wb.y ^ hva ^ x0.x ^ x1.w) & 0x3FFFFFFFu) +
                __uint_as_float((wa.y ^ wb.x ^ hvb ^ x0.z ^ x1.y) & 0x3FFFFFFFu) * __low2float(q < 2 ? sc.a01 : sc.b23);
      continue;
    }
    float t[4];
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const uint32_t sel = (m & 1) ? 0x7632u : 0x5410u;
      const uint32_t b0 = __byte_perm(m < 2 ? x0.x : x0.y, m < 2 ? x0.z : x0.w, sel);
      const uint32_t b1 = __byte_perm(m < 2 ? x1.x : x1.y, m < 2 ? x1.z : x1.w, sel);
      const uint32_t a0 = v3_pair<BITS>(wa.x, fa0, m), a1 = v3_pair<BITS>(wb.x, fb0, m);
      const uint32_t a2 = v3_pair<BITS>(wa.y, fa1, m), a3 = v3_pair<BITS>(wb.y, fb1, m);
      if (m == 0)
        ninfer_codes::mma_bf16_zero(t, a0, a1, a2, a3, b0, b1);  // a fresh fragment per group
      else
        mma_bf16(t, a0, a1, a2, a3, b0, b1);
    }
    const float s_a = v4_scale(sc.a01, sc.a23, q), s_b = v4_scale(sc.b01, sc.b23, q);
    acc[0] = fmaf(t[0], s_a, acc[0]);
    acc[1] = fmaf(t[1], s_a, acc[1]);
    acc[2] = fmaf(t[2], s_b, acc[2]);
    acc[3] = fmaf(t[3], s_b, acc[3]);
  }
}

// ------------------------------------------------------------------------------------------------
// int8 q4 stage (`I8` entries, docs/kernels/decode-gemv-v4.md "eighth pass"): the q4 codes as int8 A
// fragments of `mma.m16n8k32.s8` (each nibble in the top half of a byte: (w << 4) & 0xF0F0F0F0 and
// w & 0xF0F0F0F0 are 16 x code, 3 ALU ops per 8 codes, no bf16 code construction) against
// activations prepared by the decode norm (`rms_norm_body`, "xq" layout below): batch row j is MMA
// columns 2j (hi) and 2j + 1 (lo), x = s (hi + lo / 254) with s = max |x| / 127 per group of 64 k
// (hi, lo int8), so the products keep ~15 bits of each group's range and b <= 4.
//
// xq layout (bytes, K % 256 == 0): group G (64 k) is 32 chunks of 16 bytes at G * 512; chunk
// (c, n) = lane-in-quad c (0..3) and MMA column n (0..7) at (G * 32 + c * 8 + n) * 16 holds k =
// 64 G + 16 c + 8 j + 2 i + o at byte 8 j + 4 o + i (j, o in 0..1, i in 0..3): the B fragments of
// the two MMAs of a group (b0 = even k, b1 = odd k), in the k order the A fragments of a thread's
// two words imply (word j: low nibbles = even k, high nibbles = odd k). Scales after the chunks, at
// K * 8 bytes: float [K / 256][row 4][group-in-stage 4], each s / (254 x 16).
__device__ __forceinline__ void imma_s8(int* d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                        uint32_t b1, bool zero) {
  if (zero)
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(0));
  else
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// q5 codes as int8 A fragments: 8 x code in a byte (the 5-bit two's-complement code in bits 3..7).
// Byte i of the even register is lane 2i of the 8-lane word w (its nibble at bits 8i..8i+3, its high
// bit at bit 2i of h8), of the odd register lane 2i + 1. The high bits are spread by one multiply each:
// (h8 & 0x55) x 0x02082080 puts bit 2i at 8i + 7 and (h8 & 0xAA) x 0x01041040 bit 2i + 1 there; the
// other products land on bits 3..6, 9, 11, 13-14, 17, ... which carry no further than the next bit
// (no two products meet below a target bit) and are masked off. 5 ALU ops per 4 codes.
__device__ __forceinline__ uint32_t q5_s8_even(uint32_t w, uint32_t h8) {
  return ((w << 3) & 0x78787878u) | (((h8 & 0x55u) * 0x02082080u) & 0x80808080u);
}

__device__ __forceinline__ uint32_t q5_s8_odd(uint32_t w, uint32_t h8) {
  return ((w >> 1) & 0x78787878u) | (((h8 & 0xAAu) * 0x01041040u) & 0x80808080u);
}

// One stage at `s` into acc[0] (row g) and acc[2] (row g + 8) of batch c; `xq`, `xsc`: the stage's
// 2,048 bytes of activations and 16 scales; `xslot`: the stage's columns 0 and 1 staged in the slot
// (one row), else nullptr. q4: A bytes are 16 x code, q5: 8 x code (the scales are s / (254 x 16)).
// XSM: `xsc` is row 0's 4 scales in shared memory (one row; batches c > 0 read them too, unused).
template <int BITS, bool XSM = false>
__device__ __forceinline__ void v4_stage_i8(const uint8_t* s, const uint8_t* xq, const float* xsc, uint32_t g,
                                            uint32_t c, float* acc, const uint8_t* xslot) {
  constexpr uint32_t BASE = V4<BITS>::BASE, HIGH = V4<BITS>::HIGH;
  constexpr float CODE = BITS == 5 ? 2.f : 1.f;  // 16 / (bytes per code unit)
  uint4 xv[4];
#pragma unroll
  for (int q = 0; q < 4; ++q)
    xv[q] = xslot != nullptr ? *reinterpret_cast<const uint4*>(xslot + (q * 8u + c * 2u + (g & 1u)) * 16u)
                             : ld_dep16(xq + q * 512 + (c * 8u + g) * 16u);  // columns >= 2 b: never stored
  // this thread's batch c (rows >= b are never stored)
  const uint4 sxv = XSM ? *reinterpret_cast<const uint4*>(xsc) : ld_dep16(xsc + c * 4u);
  const V4Scales sc = v4_scales(s + BASE + HIGH, g);
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    uint2 wa, wb;
    v4_base_words(s, g, c, q, wa, wb);
    if (NINFER_V4_DIAG == 1) {  // every loaded word feeds the result, no code construction, no MMA
      const uint32_t hx = BITS == 5 ? s[BASE + c * 2u + g * 32u] : 0u;
      acc[0] += __uint_as_float((wa.x ^ wb.y ^ hx ^ xv[q].x ^ xv[q].w ^ sxv.x) & 0x3FFFFFFFu);
      acc[2] += __uint_as_float((wa.y ^ wb.x ^ xv[q].y ^ xv[q].z) & 0x3FFFFFFFu) * __low2float(sc.a01);
      continue;
    }
    uint32_t a[2][4];  // [word][a0 .. a3]
    if (BITS == 4) {
      // each nibble in the top half of its byte: the signed byte is 16 x code (two's complement)
      a[0][0] = (wa.x << 4) & 0xF0F0F0F0u, a[0][1] = (wb.x << 4) & 0xF0F0F0F0u, a[0][2] = wa.x & 0xF0F0F0F0u,
      a[0][3] = wb.x & 0xF0F0F0F0u;
      a[1][0] = (wa.y << 4) & 0xF0F0F0F0u, a[1][1] = (wb.y << 4) & 0xF0F0F0F0u, a[1][2] = wa.y & 0xF0F0F0F0u,
      a[1][3] = wb.y & 0xF0F0F0F0u;
    } else {  // the high bytes of words x (lanes 16c..16c+7) and y of rows g and g + 8, as v4_stage reads them
      const uint32_t hoff = BASE + ((((q >> 1)) ^ ((g >> 2) & 1u)) << 4) + (q & 1) * 8u + c * 2u;
      const uint8_t* ha = s + hoff + g * 32u;
      const uint8_t* hb = s + hoff + (g + 8u) * 32u;
      a[0][0] = q5_s8_even(wa.x, ha[0]), a[0][1] = q5_s8_even(wb.x, hb[0]), a[0][2] = q5_s8_odd(wa.x, ha[0]),
      a[0][3] = q5_s8_odd(wb.x, hb[0]);
      a[1][0] = q5_s8_even(wa.y, ha[1]), a[1][1] = q5_s8_even(wb.y, hb[1]), a[1][2] = q5_s8_odd(wa.y, ha[1]),
      a[1][3] = q5_s8_odd(wb.y, hb[1]);
    }
    int t[4];
    imma_s8(t, a[0][0], a[0][1], a[0][2], a[0][3], xv[q].x, xv[q].y, true);
    imma_s8(t, a[1][0], a[1][1], a[1][2], a[1][3], xv[q].z, xv[q].w, false);
    // t[0], t[1]: row g, columns 2c (hi), 2c + 1 (lo); t[2], t[3]: row g + 8
    const float sx = CODE * __uint_as_float(q == 0 ? sxv.x : q == 1 ? sxv.y : q == 2 ? sxv.z : sxv.w);
    const float s_a = v4_scale(sc.a01, sc.a23, q), s_b = v4_scale(sc.b01, sc.b23, q);
    // sum_k code x = sx / (254 x 16) * sum 16 code (254 hi + lo); exact in int32 (|.| < 2^29)
    const float va = static_cast<float>(t[0] * 254 + t[1]), vb = static_cast<float>(t[2] * 254 + t[3]);
    acc[0] = fmaf(va, s_a * sx, acc[0]);
    acc[2] = fmaf(vb, s_b * sx, acc[2]);
  }
}

// What a v4 launch computes besides the plain product (`ninfer_qgemv4e_*`; the original entries
// are the plain mode without PDL). Each output element is rounded once, after the epilogue in fp32.
enum V4Mode : uint32_t {
  V4_PLAIN = 0,   // y[col * y_stride + row] = acc
  V4_ADD = 1,     // ... = acc + residual[col * n_rows + row] (bf16)
  V4_SWIGLU = 2,  // ... = silu(acc of base) * (acc of up), two weights of n_rows rows each
  V4_MULTI = 3,   // plain, over up to V4_SEGS weights of one format and K (segment table below)
};

constexpr uint32_t V4_SEGS = 4;

struct V4Epi {
  const uint8_t* up_base;  // V4_SWIGLU: the up projection's planes (the gate's are base/high/scales)
  const uint8_t* up_high;
  const __half* up_scales;
  const __nv_bfloat16* residual;  // V4_ADD
  uint32_t y_stride;              // output elements per batch row (> n_rows inside a concatenation)
  // V4_MULTI: weight s has rows seg_end[s - 1] * 16 .. seg_end[s] * 16 - 1 of the launch's tiles
  // (seg_end[-1] = 0, unused segments end at the last one's end) and writes y of its own stride
  uint32_t seg_end[V4_SEGS];
  uint32_t seg_stride[V4_SEGS];
  const uint8_t* seg_base[V4_SEGS];
  const uint8_t* seg_high[V4_SEGS];
  const __half* seg_scales[V4_SEGS];
  __nv_bfloat16* seg_y[V4_SEGS];
  const float* x_scales;  // I8 entries: the activation scales of the xq layout (x is the xq bytes)
  uint8_t* xq_out;        // I8 SwiGLU: also write y (rows 0..3) as int8 activations there, or nullptr
  // V4_ADD: also y's RMS norm, y * rsqrt(mean(y^2) + eps) * (w + offset), into norm_y (and rows 0..3
  // as int8 activations into norm_xq unless nullptr) when norm_y is set (`v4_add_norm`)
  const void* norm_w;     // fp32, or bf16 when norm_wbf16
  void* norm_y;
  uint8_t* norm_xq;
  float norm_eps;
  float norm_offset;
  uint32_t norm_wbf16;
};

// XQN entries (the decode norm in the GEMV's prologue, one activation row): each unit of 256 k of
// the normalized row as the int8 slot layout of `v4_xq_slot`, 512 bytes + 4 scales, in the block's
// shared memory past its rings; before the PDL wait a bf16 norm weight is copied there (lane l of
// the unit's owner: its 16 bytes at l * 16), read back by the same lane (`v4_norm_in`).
constexpr uint32_t V4_XQN_UNIT = 528;

// (defined with the RMS norm kernels below)
__device__ __noinline__ void v4_norm_in(const __nv_bfloat16* x, const void* w, uint32_t wbf16, float eps, float offset,
                                        uint32_t k, uint8_t* region, __nv_bfloat16* yn);
__device__ __noinline__ void v4_add_norm(const __nv_bfloat16* y, const void* w, void* yn, uint8_t* xq, float eps,
                                         float offset, uint32_t wbf16, uint32_t k, uint32_t b_rows);

// Arrivals per group of 64 outputs of the I8 SwiGLU's xq output (`v4_xq_out`): the last of a group's
// blocks writes its int8 activations and resets the count, so the counts are 0 between launches
// (zero at module load; a launch touches them only after its PDL wait, when the previous one is done).
constexpr uint32_t V4_XQ_GROUPS = 8192;  // outputs <= 524,288 (the launcher checks)
// Measurement switch (qgemv_host.cc): the K split of a SwiGLU writing its int8 output; at 1 each block
// owns whole 64-groups (`v4_xq_out` with one block a group: no fence)
#ifndef NINFER_V4_SWIGLU_XQ_KS
#define NINFER_V4_SWIGLU_XQ_KS 0
#endif
// Measurement switch: 0 = every thread fences its stores before the block's barrier; 1 = the
// counting thread alone fences after it (cumulative through the barrier, as a grid sync does)
#ifndef NINFER_V4_XQ_FENCE
#define NINFER_V4_XQ_FENCE 0
#endif
// Measurement switch: 1 = a K-split residual add reads its thread's residual element right after
// the PDL wait (one register over the loop) instead of after the partial sums (an L2 round trip
// at the end of every block)
#ifndef NINFER_V4_RES_EARLY
#define NINFER_V4_RES_EARLY 0
#endif
__device__ uint32_t v4_xq_arrivals[V4_XQ_GROUPS];
// Measurement switch: the I8 SwiGLU's handover inside thread block clusters (the launcher launches
// the 2-4 blocks of each 64-group as one cluster): 1 = `v4_xq_out_cluster`; 2 = clusters launched,
// the count-in handover kept (what the cluster launch alone costs). Off: both measured within the
// spread of the count-in form in the 27B graph (docs/kernels/decode-gemv-v4.md, "twentieth pass")
#ifndef NINFER_V4_XQ_CLUSTER
#define NINFER_V4_XQ_CLUSTER 0
#endif
// `v4_xq_out_cluster`'s buffer: the group's bf16 outputs ([row 4][64]), in the cluster leader's
// dynamic shared memory past its ring (the launcher adds these bytes), so that the other blocks can
// write it while the leader still streams
constexpr uint32_t V4_XQC_BYTES = 4u * 64u * 2u;

// Special registers of sm_90 and later: the blocks of this block's cluster (1 when launched without
// clusters), this block's rank in it, the launch's dynamic shared memory bytes (all 0 before sm_90).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define NINFER_SREG(fn, reg)                            \
  __device__ __forceinline__ uint32_t fn() {            \
    uint32_t v;                                         \
    asm volatile("mov.u32 %0, %%" reg ";" : "=r"(v));   \
    return v;                                           \
  }
#else
#define NINFER_SREG(fn, reg) \
  __device__ __forceinline__ uint32_t fn() { return 0u; }
#endif
NINFER_SREG(cluster_blocks, "cluster_nctarank")
NINFER_SREG(cluster_rank, "cluster_ctarank")
NINFER_SREG(dynamic_smem_bytes, "dynamic_smem_size")
#undef NINFER_SREG

__device__ __forceinline__ void cluster_arrive() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
#endif
}

__device__ __forceinline__ void cluster_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}

// Store `v` at `p` (an address of this block's shared memory) in the shared memory of cluster block 0.
__device__ __forceinline__ void cluster_store_leader(const void* p, __nv_bfloat16 v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, 0;" : "=r"(remote) : "r"(a));
  asm volatile("st.shared::cluster.b16 [%0], %1;" ::"r"(remote), "h"(__bfloat16_as_ushort(v)) : "memory");
#endif
}

// a[s] by selects (an indexed parameter array would be copied to local memory)
template <typename T>
__device__ __forceinline__ T v4_pick(const T (&a)[V4_SEGS], uint32_t s) {
  T v = a[0];
#pragma unroll
  for (uint32_t i = 1; i < V4_SEGS; ++i) v = s == i ? a[i] : v;
  return v;
}

// The segment of launch tile `t` (V4_MULTI).
__device__ __forceinline__ uint32_t v4_segment(const V4Epi& e, uint32_t t) {
  uint32_t s = 0;
#pragma unroll
  for (uint32_t i = 0; i + 1u < V4_SEGS; ++i) s += t >= e.seg_end[i] ? 1u : 0u;
  return s;
}

template <uint32_t MODE>
__device__ __forceinline__ float v4_finish(float v, float up, const V4Epi& e, uint32_t col, uint32_t row,
                                           uint32_t n_rows) {
  if (MODE == V4_ADD) {
    const unsigned short r = *reinterpret_cast<const volatile unsigned short*>(e.residual + col * n_rows + row);
    return v + __uint_as_float(static_cast<uint32_t>(r) << 16);
  }
  if (MODE == V4_SWIGLU) return v / (1.f + __expf(-v)) * up;
  return v;
}

// The I8 SwiGLU's outputs y[0 .. b_rows)[n_rows] also as int8 activations for the next projection
// (the xq layout, `norm_xq8`): a 64-group's scale needs all of its outputs, which 1-4 blocks write
// (`outs` outputs from `out0` each), so every block counts itself in after its stores are visible
// and the last one of a group quantizes the group from y (the classic threadfence reduction).
__device__ __forceinline__ void v4_xq_out(const __nv_bfloat16* y, const V4Epi& e, uint32_t n_rows, uint32_t b_rows,
                                          uint32_t out0, uint32_t outs) {
  extern __shared__ __align__(16) uint8_t v4_smem[];
  volatile uint32_t* last = reinterpret_cast<volatile uint32_t*>(v4_smem);
  const uint32_t per = outs >= 64u ? 1u : 64u / outs, grp0 = out0 >> 6;  // blocks per group
  // (a block that owns whole groups reads only its own stores, which the barrier orders: no fence;
  // only builds that launch such blocks test for it, NINFER_V4_SWIGLU_XQ_KS)
  const bool fence = NINFER_V4_SWIGLU_XQ_KS == 0 || per > 1u;
  if (NINFER_V4_XQ_FENCE == 0 && fence) __threadfence();  // this thread's stores of y, before the count
  __syncthreads();  // (every thread has read the partial sums: the shared memory is free)
  if (threadIdx.x == 0) {
    uint32_t done = 1u;
    if (per > 1u) {
      if (NINFER_V4_XQ_FENCE == 1) __threadfence();  // the block's stores (ordered by the barrier)
      done = atomicAdd(&v4_xq_arrivals[grp0], 1u) == per - 1u ? 1u : 0u;
      if (done) v4_xq_arrivals[grp0] = 0u;
    }
    *last = done;
  }
  __syncthreads();
  if (*last == 0u) return;
  if (fence) __threadfence();
  const uint32_t groups = per > 1u ? 1u : outs >> 6, warp = threadIdx.x >> 5, lane = threadIdx.x & 31u;
  for (uint32_t gi = warp; gi < groups; gi += blockDim.x >> 5) {
    // lane: batch row lane / 8 (< 4), vector lane % 8 of the group (8 outputs each)
    const uint32_t r = lane >> 3, v = (grp0 + gi) * 8u + (lane & 7u);
    const bool valid = r < b_rows;
    uint4 q = make_uint4(0u, 0u, 0u, 0u);
    // L2: other blocks' stores; a block that owns its groups reads its own, which the barrier made
    // visible to its threads (through L1, which an L2 read would bypass)
    if (valid) {
      const uint4* src = reinterpret_cast<const uint4*>(y + r * n_rows) + v;
      q = fence ? __ldcg(src) : *src;
    }
    const uint32_t o[4] = {q.x, q.y, q.z, q.w};
    norm_xq8(o, v, r, n_rows, valid, e.xq_out);
  }
}

// `v4_xq_out` within a cluster: the cluster is the 2 or 4 blocks that write one 64-group's outputs
// (blocks of `outs` < 4 output tiles). Every block has stored its rounded outputs into the buffer of
// the cluster's first block (in the epilogue) and arrives; the others exit at once, the first waits
// for them and quantizes the group as `v4_xq_out`'s last block does (`norm_xq8`), with no fence,
// atomic or reload of y from L2.
__device__ __forceinline__ void v4_xq_out_cluster(const V4Epi& e, uint32_t n_rows, uint32_t b_rows, uint32_t out0) {
  extern __shared__ __align__(16) uint8_t v4_smem[];
  cluster_arrive();  // (release: this block's outputs in the leader's buffer)
  if (cluster_rank() != 0u) return;
  cluster_wait();
  const __nv_bfloat16* xq_y = reinterpret_cast<const __nv_bfloat16*>(v4_smem + dynamic_smem_bytes() - V4_XQC_BYTES);
  if (threadIdx.x < 32u) {
    const uint32_t r = threadIdx.x >> 3, j = threadIdx.x & 7u;  // lane: vector j of the group, batch row r
    const bool valid = r < b_rows;
    uint4 q = make_uint4(0u, 0u, 0u, 0u);
    if (valid) q = *reinterpret_cast<const uint4*>(xq_y + r * 64u + j * 8u);
    const uint32_t o[4] = {q.x, q.y, q.z, q.w};
    norm_xq8(o, (out0 >> 3) + j, r, n_rows, valid, e.xq_out);
  }
}

// Block layout: `slots` row tiles x `ks` K-parts, one warp each (warp = kpart * slots + slot). In
// V4_SWIGLU, tile t of the launch is the gate (t even) or the up (t odd) tile of output tile t / 2,
// so both halves of an output tile sit in one block and meet in shared memory.
// `blk`, `tile0`: this block's index among the blocks of its format and the launch tile its tiles
// start from (blockIdx.x and 0, except in the mixed-format multi entry).
// One row of bf16 activations quantized by the warp itself into a slot (`XQS` entries): the 8
// elements `o` of lane l (k = 8 l .. 8 l + 7 of the stage) as the int8 chunks a staged slot holds
// (lane-in-quad c, column 0 = hi / 1 = lo of group l / 8, as the copies of `v4_body` place them)
// and the 4 groups' scales after the 512 bytes.
__device__ __forceinline__ void v4_xq_slot(const uint4& x8, uint8_t* slot, uint32_t lane) {
  const uint32_t o[4] = {x8.x, x8.y, x8.z, x8.w};
  uint32_t hw[2], lw[2];
  float sh;
  xq8_bytes(o, hw, lw, sh, true);
  const uint32_t q = lane >> 3, m8 = lane & 7u;
  uint8_t* chunk = slot + (q * 8u + (m8 >> 1) * 2u) * 16u + (m8 & 1u) * 8u;
  *reinterpret_cast<uint2*>(chunk) = make_uint2(hw[0], hw[1]);
  *reinterpret_cast<uint2*>(chunk + 16u) = make_uint2(lw[0], lw[1]);
  if (m8 == 0u) reinterpret_cast<float*>(slot + 512u)[q] = sh / (254.f * 16.f);
}

// XQS (with I8, one activation row): x is bf16 and each warp quantizes its own K range a stage
// ahead into its ring slots (`v4_xq_slot`; loaded one stage before that), so a projection whose
// producer cannot write int8 activations (a 64-group would span its blocks) still runs the int8 stages.
template <int BITS, typename TY, bool PDL, uint32_t MODE, bool I8 = false, bool XQS = false, bool XQN = false>
__device__ __forceinline__ void v4_body(const __nv_bfloat16* __restrict__ x, const uint8_t* __restrict__ base,
                                        const uint8_t* __restrict__ high, const __half* __restrict__ scales,
                                        TY* __restrict__ y, uint32_t n_rows, uint32_t k, uint32_t b_rows,
                                        uint32_t ks, const V4Epi& e, uint32_t blk, uint32_t tile0) {
  constexpr uint32_t STAGE = V4<BITS>::STAGE, STAGES = V4<BITS>::STAGES;
  extern __shared__ __align__(16) uint8_t v4_smem[];
  if (NINFER_V4_DIAG == 3) {
    if (PDL) {
      pdl_enter();
    }
    return;
  }

  const uint32_t warp = threadIdx.x >> 5, lane = threadIdx.x & 31u;
  const uint32_t g = lane >> 2, c = lane & 3u;
  const uint32_t slots = (blockDim.x >> 5) / ks;
  const uint32_t kpart = warp / slots, slot = warp % slots;
  constexpr bool swiglu = MODE == V4_SWIGLU, multi = MODE == V4_MULTI;
  const uint32_t tile = tile0 + blk * slots + slot;
  uint32_t row0 = (swiglu ? tile >> 1 : tile) * 16u;
  if (swiglu && (tile & 1u)) {
    base = e.up_base;
    high = e.up_high;
    scales = e.up_scales;
  }
  uint32_t y_stride = e.y_stride;
  if (multi) {  // this warp's weight: its planes, rows, output and stride
    const uint32_t sg = v4_segment(e, tile);
    const uint32_t t0 = sg == 0 ? 0u : v4_pick(e.seg_end, sg - 1u);
    row0 = (tile - t0) * 16u;
    n_rows = tile < e.seg_end[V4_SEGS - 1u] ? (v4_pick(e.seg_end, sg) - t0) * 16u : 0u;
    base = v4_pick(e.seg_base, sg);
    high = v4_pick(e.seg_high, sg);
    scales = v4_pick(e.seg_scales, sg);
    y = reinterpret_cast<TY*>(v4_pick(e.seg_y, sg));
    y_stride = v4_pick(e.seg_stride, sg);
  }
  const uint32_t groups = k >> 6, units = k >> 8;
  const uint32_t ubeg = kpart * units / ks, uend = (kpart + 1u) * units / ks, n_units = uend - ubeg;
  static_assert(!I8 || ((BITS == 4 || BITS == 5) && PDL), "int8 stages: q4 / q5 launcher entries only");
  // I8 at one row: each slot also holds the stage's activations (512 B: columns 0 and 1 of its 4
  // groups), copied a stage ahead with the weights, so no stage waits for them
  static_assert(!XQS || I8, "self-quantized activations feed the int8 stages");
  // XQN (one row): x is the decode norm's input; the block normalizes and quantizes all of it
  // before its stages (`v4_norm_in`), which read their activations from that copy, not the slots
  static_assert(!XQN || (I8 && !XQS), "the norm in the prologue feeds the int8 stages");
  const bool xst = I8 && !XQN && (XQS || b_rows == 1);  // (XQS, XQN: the launcher runs them at one row only)
  const uint32_t slot_bytes = STAGE + (xst ? 512u : 0u) + (XQS ? 16u : 0u);
  uint8_t* ring = v4_smem + warp * (STAGES * slot_bytes);
  const uint32_t ring_s = static_cast<uint32_t>(__cvta_generic_to_shared(ring));
  // ring slots as running offsets: `fill` is where the next copy goes, `use` what the next stage reads
  uint32_t fill = 0u, use = 0u;
  const auto next_slot = [slot_bytes](uint32_t o) { return o + slot_bytes == STAGES * slot_bytes ? 0u : o + slot_bytes; };

  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  const bool active = row0 < n_rows;
  V4Lane lp = v4_lane<BITS>(base, high, scales, row0, groups, ubeg, lane);
  // the loop's order (NINFER_V4_ISSUE_AHEAD; the self-quantizing entry keeps the first); the
  // prologue copies STAGES - 1 stages before the PDL wait, or (order 2) the whole ring
  constexpr uint32_t ORDER = XQS ? 0u : XQN ? NINFER_V4_XQN_ORDER : NINFER_V4_ISSUE_AHEAD, EXTRA = ORDER == 2u ? 1u : 0u;
  // XQN: the normalized activations past every warp's ring; a bf16 norm weight copied there first
  uint8_t* const xqn = v4_smem + (blockDim.x >> 5) * (STAGES * slot_bytes);
  if (XQN && e.norm_wbf16) {
    const uint32_t warps = blockDim.x >> 5, xqn_s = static_cast<uint32_t>(__cvta_generic_to_shared(xqn));
    for (uint32_t u = warp; u < units; u += warps)  // unit u's owner in `v4_norm_in` (warps divides 8)
      cp_async16(xqn_s + u * V4_XQN_UNIT + lane * 16u, reinterpret_cast<const uint4*>(e.norm_w) + u * 32u + lane);
    cp_async_commit();
  }
  if (active) {
#pragma unroll
    for (uint32_t i = 0; i + 1u < STAGES + EXTRA; ++i) {
      if (i < n_units) v4_copy<BITS>(ring_s + fill, lp);
      fill = next_slot(fill);
      cp_async_commit();
    }
  }
  if (PDL) {  // the weight copies above do not depend on the previous kernel; nothing else before here does
    pdl_enter();
  }
  // NINFER_V4_RES_EARLY: the residual element this thread adds in the K-split epilogue below (its
  // first output there: blockDim.x >= the block's outputs x 128 in V4_ADD), read now
  float res_pre = 0.f;
  const uint32_t add_outs = slots;
  const bool res_early = NINFER_V4_RES_EARLY && MODE == V4_ADD && ks > 1u && blockDim.x >= add_outs * 128u;
  if (res_early && threadIdx.x < add_outs * 128u) {
    const uint32_t rb = threadIdx.x & 127u, col = rb & 7u;
    const uint32_t row = (tile0 + blk * add_outs + (threadIdx.x >> 7)) * 16u + (rb >> 3);
    if (row < n_rows && col < b_rows) {
      const unsigned short r = *reinterpret_cast<const volatile unsigned short*>(e.residual + col * n_rows + row);
      res_pre = __uint_as_float(static_cast<uint32_t>(r) << 16);
    }
  }
  if (XQN) {  // (every warp: the norm's reduction spans the block)
    if (e.norm_wbf16) {  // this lane's weight copies, committed before the ring's STAGES - 1 (+ EXTRA) groups
      if (active)
        cp_async_wait<STAGES - 1 + EXTRA>();
      else
        cp_async_wait<0>();
    }
    v4_norm_in(x, e.norm_w, e.norm_wbf16, e.norm_eps, e.norm_offset, k, xqn,
               blockIdx.x == 0u ? static_cast<__nv_bfloat16*>(e.norm_y) : nullptr);
  }
  if (active) {
    const __nv_bfloat16* xs = x + (g < b_rows ? g : 0u) * k + c * 16u + ubeg * 256u;
    // I8: lane l copies chunk (group l / 8, c = (l / 2) % 4, column l % 2) of each staged stage
    const uint8_t* xsrc = reinterpret_cast<const uint8_t*>(x) + ubeg * 2048u + (lane >> 3) * 512u +
                          (((lane >> 1) & 3u) * 8u + (lane & 1u)) * 16u;
    // XQS: lane l's 8 activations of each stage (row 0), and those of the next stage to quantize
    const uint4* x8 = reinterpret_cast<const uint4*>(x + ubeg * 256u) + lane;
    uint4 xnext = make_uint4(0u, 0u, 0u, 0u);
    if (XQS) {  // the prologue stages' activations (all loads first: one latency)
      uint4 xp[STAGES - 1u];
#pragma unroll
      for (uint32_t j = 0; j + 1u < STAGES; ++j) xp[j] = j < n_units ? ld_dep16(x8 + j * 32u) : xnext;
      if (STAGES - 1u < n_units) xnext = ld_dep16(x8 + (STAGES - 1u) * 32u);
      uint32_t f = 0u;
#pragma unroll
      for (uint32_t j = 0; j + 1u < STAGES; ++j) {  // (warp-uniform conditions: v4_xq_slot shuffles)
        if (j < n_units) v4_xq_slot(xp[j], ring + f + STAGE, lane);
        f = next_slot(f);
      }
    } else if (xst) {
      uint32_t f = 0u;
      for (uint32_t j = 0; j + 1u < STAGES + EXTRA; ++j) {
        if (j < n_units) cp_async16(ring_s + f + STAGE + lane * 16u, xsrc);
        xsrc += 2048u;
        f = next_slot(f);
      }
      cp_async_commit();  // the prologue stages' activations: after their weights, after the PDL wait
    }
#pragma unroll 1
    for (uint32_t i = 0; i < n_units; ++i) {
      if (ORDER == 2u) {  // wait for stage i; stage i + STAGES is issued after it is computed
        if (xst && i + 1u < STAGES)
          cp_async_wait<0>();  // the prologue's activation group is among the newest STAGES - 1
        else
          cp_async_wait<STAGES - 1>();  // this thread's copies of stage i have landed
        __syncwarp();                   // ... and every lane's
      } else if (ORDER == 1u) {  // issue stage i + STAGES - 1, then wait for stage i
        __syncwarp();  // every lane is done with stage i - 1's slot, where stage i + STAGES - 1 goes
        if (i + STAGES - 1u < n_units) {
          v4_copy<BITS>(ring_s + fill, lp);
          if (xst) cp_async16(ring_s + fill + STAGE + lane * 16u, xsrc);
        }
        xsrc += 2048u;
        fill = next_slot(fill);
        cp_async_commit();
        v4_wait_ahead<STAGES>(xst, i);  // this thread's copies of stage i have landed
        __syncwarp();                   // ... and every lane's
      } else {  // wait for stage i, then issue stage i + STAGES - 1
        if (xst && !XQS && (STAGES <= 3u ? i == 0u : i < STAGES - 2u))
          cp_async_wait<0>();  // ... so the first stages wait for the prologue's activation group
        else
          cp_async_wait<STAGES - 2>();  // this thread's copies of stage i have landed
        __syncwarp();                 // ... and every lane's; also: stage i - 1 is no longer read
        if (i + STAGES - 1u < n_units) {
          v4_copy<BITS>(ring_s + fill, lp);
          if (XQS)  // stage i + STAGES - 1's activations, loaded during stage i - 1; read after a __syncwarp
            v4_xq_slot(xnext, ring + fill + STAGE, lane);
          else if (xst)
            cp_async16(ring_s + fill + STAGE + lane * 16u, xsrc);
        }
        if (XQS && i + STAGES < n_units) xnext = ld_dep16(x8 + (i + STAGES) * 32u);
        xsrc += 2048u;
        fill = next_slot(fill);
        cp_async_commit();
      }
      if (XQS)
        v4_stage_i8<BITS, true>(ring + use, nullptr, reinterpret_cast<const float*>(ring + use + STAGE + 512u), g, c,
                                acc, ring + use + STAGE);
      else if (XQN)
        v4_stage_i8<BITS, true>(ring + use, nullptr, reinterpret_cast<const float*>(xqn + (ubeg + i) * V4_XQN_UNIT + 512u),
                                g, c, acc, xqn + (ubeg + i) * V4_XQN_UNIT);
      else if (I8)
        v4_stage_i8<BITS>(ring + use, reinterpret_cast<const uint8_t*>(x) + (ubeg + i) * 2048u, e.x_scales + (ubeg + i) * 16u,
                    g, c, acc, xst ? ring + use + STAGE : nullptr);
      else
        v4_stage<BITS, PDL>(ring + use, xs, g, c, acc);
      if (ORDER == 2u) {
        __syncwarp();  // every lane is done with stage i's slot: stage i + STAGES goes there
        if (i + STAGES < n_units) {
          v4_copy<BITS>(ring_s + use, lp);
          if (xst) cp_async16(ring_s + use + STAGE + lane * 16u, xsrc);
        }
        xsrc += 2048u;
        cp_async_commit();
      }
      use = next_slot(use);
      xs += 256;
    }
    cp_async_wait<0>();
  }
  if (I8) {  // acc[0], acc[2]: rows g, g + 8 of batch c -> the layout below
    const uint32_t l0 = g * 4u + ((2u * c) & 3u), l1 = g * 4u + ((2u * c + 1u) & 3u);
    const float r0 = __shfl_sync(0xFFFFFFFFu, acc[0], l0), r1 = __shfl_sync(0xFFFFFFFFu, acc[0], l1);
    const float r2 = __shfl_sync(0xFFFFFFFFu, acc[2], l0), r3 = __shfl_sync(0xFFFFFFFFu, acc[2], l1);
    acc[0] = r0;
    acc[1] = r1;
    acc[2] = r2;
    acc[3] = r3;
  }
  // D: acc[0..1] = row g, batch cols 2c, 2c + 1; acc[2..3] = row g + 8, same cols
  if (ks == 1 && !swiglu) {
    if (active) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t row = row0 + g + (i >> 1) * 8u, col = 2u * c + (i & 1);
        if (col < b_rows) store_v3(y + col * y_stride + row, v4_finish<MODE>(acc[i], 0.f, e, col, row, n_rows));
      }
    }
    return;
  }
  __syncthreads();  // every warp is done with its ring: reuse it for the K-split partial sums
  float* part = reinterpret_cast<float*>(v4_smem);
#pragma unroll
  for (int i = 0; i < 4; ++i) part[warp * 128u + (g + (i >> 1) * 8u) * 8u + 2u * c + (i & 1)] = acc[i];
  __syncthreads();
  const uint32_t outs = swiglu ? slots >> 1 : slots;  // output tiles of this block
  // the I8 SwiGLU's handover within a cluster (`v4_xq_out_cluster`): this block's outputs go to
  // the cluster leader's buffer, at the block's place in the group
  const bool xq_cluster = NINFER_V4_XQ_CLUSTER == 1 && I8 && !XQN && swiglu && e.xq_out != nullptr && outs * 16u < 64u &&
                          cluster_blocks() == 64u / (outs * 16u);
  __nv_bfloat16* xq_y = nullptr;
  if (xq_cluster)
    xq_y = reinterpret_cast<__nv_bfloat16*>(v4_smem + dynamic_smem_bytes() - V4_XQC_BYTES) + cluster_rank() * outs * 16u;
  for (uint32_t t = threadIdx.x; t < outs * 128u; t += blockDim.x) {
    const uint32_t s = t >> 7, rb = t & 127u, r = rb >> 3, col = rb & 7u;
    uint32_t row = (tile0 + blk * outs + s) * 16u + r;
    TY* yo = y;
    uint32_t rows = n_rows, stride = y_stride;
    if (multi) {  // the output tile's weight (this thread's warp may hold another one)
      const uint32_t ot = tile0 + blk * outs + s, sg = v4_segment(e, ot);
      const uint32_t t0 = sg == 0 ? 0u : v4_pick(e.seg_end, sg - 1u);
      row = (ot - t0) * 16u + r;
      rows = ot < e.seg_end[V4_SEGS - 1u] ? (v4_pick(e.seg_end, sg) - t0) * 16u : 0u;
      yo = reinterpret_cast<TY*>(v4_pick(e.seg_y, sg));
      stride = v4_pick(e.seg_stride, sg);
    }
    if (row >= rows || col >= b_rows) continue;
    const uint32_t sv = swiglu ? 2u * s : s;  // the slot holding this output's (gate) tile
    float v = 0.f, up = 0.f;
    for (uint32_t p = 0; p < ks; ++p) v += part[(p * slots + sv) * 128u + rb];
    if (swiglu)
      for (uint32_t p = 0; p < ks; ++p) up += part[(p * slots + sv + 1u) * 128u + rb];
    if (xq_cluster) {  // (SwiGLU) the output as stored, also into the leader's buffer
      const float out = v4_finish<MODE>(v, up, e, col, row, n_rows);
      store_v3(yo + col * stride + row, out);
      cluster_store_leader(xq_y + col * 64u + s * 16u + r, __float2bfloat16_rn(out));
      continue;
    }
    store_v3(yo + col * stride + row,
             res_early && t == threadIdx.x ? v + res_pre : v4_finish<MODE>(v, up, e, col, row, n_rows));
  }
  if (I8 && swiglu && e.xq_out != nullptr && !xq_cluster)
    v4_xq_out(reinterpret_cast<const __nv_bfloat16*>(y), e, n_rows, b_rows, (tile0 + blk * outs) * 16u, outs * 16u);
  if (xq_cluster) v4_xq_out_cluster(e, n_rows, b_rows, (tile0 + blk * outs - cluster_rank() * outs) * 16u);
}

}  // namespace

#define NINFER_QGEMV4(BITS, TY, TAG)                                                                 \
  extern "C" __global__ void NINFER_V4_BOUNDS                                                         \
      ninfer_qgemv4_q##BITS##_y##TAG(const __nv_bfloat16* x, const uint8_t* base, const uint8_t* high, \
                                     const __half* scales, TY* y, uint32_t n_rows, uint32_t k,        \
                                     uint32_t b_rows, uint32_t ks) {                                  \
    const V4Epi e{nullptr, nullptr, nullptr, nullptr, n_rows, {}, {}, {}, {}, {}, {}, nullptr, nullptr, \
                  nullptr, nullptr, nullptr, 0.f, 0.f, 0u};                                             \
    v4_body<BITS, TY, false, V4_PLAIN>(x, base, high, scales, y, n_rows, k, b_rows, ks, e, blockIdx.x, 0u); \
  }

// The launcher's entries: PDL and an epilogue (blocks of up to 8 warps; SwiGLU: gate/up tile pairs).
#define NINFER_QGEMV4E(BITS, MODE, TAG)                                                              \
  extern "C" __global__ void NINFER_V4_BOUNDS                                                         \
      ninfer_qgemv4e_q##BITS##_##TAG(const __nv_bfloat16* x, const uint8_t* base, const uint8_t* high, \
                                     const __half* scales, __nv_bfloat16* y, uint32_t n_rows,         \
                                     uint32_t k, uint32_t b_rows, uint32_t ks, const V4Epi e) {       \
    v4_body<BITS, __nv_bfloat16, true, MODE>(x, base, high, scales, y, n_rows, k, b_rows, ks, e, blockIdx.x, 0u); \
    if (MODE == V4_ADD && e.norm_y != nullptr)                                                        \
      v4_add_norm(y, e.norm_w, e.norm_y, e.norm_xq, e.norm_eps, e.norm_offset, e.norm_wbf16, n_rows, b_rows); \
  }
#define NINFER_QGEMV4E_MODES(BITS)                          \
  NINFER_QGEMV4E(BITS, V4_PLAIN, plain)                     \
  NINFER_QGEMV4E(BITS, V4_ADD, add)                         \
  NINFER_QGEMV4E(BITS, V4_SWIGLU, swiglu)                   \
  NINFER_QGEMV4E(BITS, V4_MULTI, multi)

NINFER_QGEMV4(4, __nv_bfloat16, bf16)
NINFER_QGEMV4(5, __nv_bfloat16, bf16)
NINFER_QGEMV4(6, __nv_bfloat16, bf16)
NINFER_QGEMV4(4, float, f32)  // fp32 output: lets the GPU check see fp32-level error
NINFER_QGEMV4(5, float, f32)
NINFER_QGEMV4(6, float, f32)
NINFER_QGEMV4E_MODES(4)
NINFER_QGEMV4E_MODES(5)
NINFER_QGEMV4E_MODES(6)

// q4 / q5 on int8 activations (`v4_stage_i8`; x is the xq bytes, `e.x_scales` their scales; b <= 4).
// The SwiGLU also writes its output as int8 activations when `e.xq_out` is set (`v4_xq_out`).
#define NINFER_QGEMV4E_I8(BITS, MODE, TAG)                                                            \
  extern "C" __global__ void NINFER_V4_BOUNDS_I8                                                      \
      ninfer_qgemv4e_q##BITS##_##TAG##_i8(const __nv_bfloat16* x, const uint8_t* base, const uint8_t* high, \
                                          const __half* scales, __nv_bfloat16* y, uint32_t n_rows, uint32_t k, \
                                          uint32_t b_rows, uint32_t ks, const V4Epi e) {              \
    v4_body<BITS, __nv_bfloat16, true, MODE, true>(x, base, high, scales, y, n_rows, k, b_rows, ks, e, blockIdx.x, 0u); \
    if (MODE == V4_ADD && e.norm_y != nullptr)                                                        \
      v4_add_norm(y, e.norm_w, e.norm_y, e.norm_xq, e.norm_eps, e.norm_offset, e.norm_wbf16, n_rows, b_rows); \
  }
NINFER_QGEMV4E_I8(4, V4_PLAIN, plain)
NINFER_QGEMV4E_I8(4, V4_SWIGLU, swiglu)
NINFER_QGEMV4E_I8(4, V4_ADD, add)
NINFER_QGEMV4E_I8(5, V4_ADD, add)

// The q5 residual add on int8 stages from bf16 x of one row, quantized by each warp for its own K
// range (`XQS`): the mixers' output projections and the down projection, whose producers (the GDN
// step, attention, the SwiGLU) write bf16 only.
extern "C" __global__ void NINFER_V4_BOUNDS_I8 ninfer_qgemv4e_q5_add_i8s(
    const __nv_bfloat16* x, const uint8_t* base, const uint8_t* high, const __half* scales, __nv_bfloat16* y,
    uint32_t n_rows, uint32_t k, uint32_t b_rows, uint32_t ks, const V4Epi e) {
  v4_body<5, __nv_bfloat16, true, V4_ADD, true, true>(x, base, high, scales, y, n_rows, k, b_rows, ks, e, blockIdx.x, 0u);
  if (e.norm_y != nullptr)
    v4_add_norm(y, e.norm_w, e.norm_y, e.norm_xq, e.norm_eps, e.norm_offset, e.norm_wbf16, n_rows, b_rows);
}

// One V4_MULTI launch over q4 and q5 weights of one input (a mixer's projections: GDN q, k | v, z;
// attention q, k | gate, v): one tail and one PDL hand-over instead of two. The segment table lists
// the q4 weights first; blocks [0, blocks4) run their tiles as the q4 entry does (K split `ks`),
// the rest the q5 tiles after them (K split `ks5`), each block one format, so the per-format loops
// and rings of the two entries are used unchanged (the ring memory is the larger format's).
template <bool I8, bool XQN = false>
__device__ __forceinline__ void v4_multi45(const __nv_bfloat16* x, const uint8_t* base, const uint8_t* high,
                                           const __half* scales, __nv_bfloat16* y, uint32_t n_rows, uint32_t k,
                                           uint32_t b_rows, uint32_t ks, const V4Epi& e, uint32_t blocks4, uint32_t ks5) {
  const uint32_t warps = blockDim.x >> 5;
  if (blockIdx.x < blocks4)
    v4_body<4, __nv_bfloat16, true, V4_MULTI, I8, false, XQN>(x, base, high, scales, y, n_rows, k, b_rows, ks, e,
                                                              blockIdx.x, 0u);
  else
    v4_body<5, __nv_bfloat16, true, V4_MULTI, I8, false, XQN>(x, base, high, scales, y, n_rows, k, b_rows, ks5, e,
                                                              blockIdx.x - blocks4, blocks4 * (warps / ks));
}

extern "C" __global__ void NINFER_V4_BOUNDS ninfer_qgemv4e_q45_multi(
    const __nv_bfloat16* x, const uint8_t* base, const uint8_t* high, const __half* scales, __nv_bfloat16* y,
    uint32_t n_rows, uint32_t k, uint32_t b_rows, uint32_t ks, const V4Epi e, uint32_t blocks4, uint32_t ks5) {
  v4_multi45<false>(x, base, high, scales, y, n_rows, k, b_rows, ks, e, blocks4, ks5);
}

// The same on int8 activations (`v4_stage_i8`; x is the norm's xq bytes, `e.x_scales` their scales;
// b <= 4): the mixers' projections of the input norm's output (the opt-in kernel feature
// "gemv_int8_multi").
extern "C" __global__ void NINFER_V4_BOUNDS_I8 ninfer_qgemv4e_q45_multi_i8(
    const __nv_bfloat16* x, const uint8_t* base, const uint8_t* high, const __half* scales, __nv_bfloat16* y,
    uint32_t n_rows, uint32_t k, uint32_t b_rows, uint32_t ks, const V4Epi e, uint32_t blocks4, uint32_t ks5) {
  v4_multi45<true>(x, base, high, scales, y, n_rows, k, b_rows, ks, e, blocks4, ks5);
}

// The decode norm in the prologue (XQN, one row; docs/kernels/decode-gemv-v4.md "twenty-second
// pass"): x is the norm's input, `e.norm_w` (fp32, or bf16 when `e.norm_wbf16`), `e.norm_eps`,
// `e.norm_offset` its parameters; block 0 also writes the normalized row to `e.norm_y`. The norm
// kernel's launch boundary leaves the step: the mixers' projections of the input norm and the
// MLP's SwiGLU of the post-attention norm (its int8 output for the down projection as before).
extern "C" __global__ void NINFER_V4_BOUNDS_I8 ninfer_qgemv4e_q45_multi_i8n(
    const __nv_bfloat16* x, const uint8_t* base, const uint8_t* high, const __half* scales, __nv_bfloat16* y,
    uint32_t n_rows, uint32_t k, uint32_t b_rows, uint32_t ks, const V4Epi e, uint32_t blocks4, uint32_t ks5) {
  v4_multi45<true, true>(x, base, high, scales, y, n_rows, k, b_rows, ks, e, blocks4, ks5);
}

extern "C" __global__ void NINFER_V4_BOUNDS_I8 ninfer_qgemv4e_q4_swiglu_i8n(
    const __nv_bfloat16* x, const uint8_t* base, const uint8_t* high, const __half* scales, __nv_bfloat16* y,
    uint32_t n_rows, uint32_t k, uint32_t b_rows, uint32_t ks, const V4Epi e) {
  v4_body<4, __nv_bfloat16, true, V4_SWIGLU, true, false, true>(x, base, high, scales, y, n_rows, k, b_rows, ks, e,
                                                               blockIdx.x, 0u);
}


#endif  // NINFER_GEMV_DENSE_ONLY

// ------------------------------------------------------------------------------------------------
// dense: bf16 weights [N, K] x bf16 activations [B, K] for small N (decode GDN gates, N = 48).
// One block of 256 threads per output row: N = 48 rows spread over 48 SMs, each thread reads
// 16-byte vectors of the row (up to 4 in flight), products summed in fp32, block-reduced.
// ------------------------------------------------------------------------------------------------
namespace {

constexpr int DENSE_THREADS = 256;
constexpr int DENSE_UNROLL = 4;

// Blocks n_rows .. n_rows + n2 - 1 compute a second weight `w2` into `y2` (two small projections
// of one input in one launch: the GDN gates a and b).
template <int B>
__device__ __forceinline__ void dense_body(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* w,
                                           __nv_bfloat16* y, uint32_t n_rows, uint32_t k, uint32_t b_rows,
                                           const __nv_bfloat16* w2, __nv_bfloat16* y2) {
  __shared__ float red[DENSE_THREADS / 32][B];
  const uint32_t tid = threadIdx.x;
  uint32_t row = blockIdx.x;
  if (row >= n_rows) {
    row -= n_rows;
    n_rows = gridDim.x - n_rows;
    w = w2;
    y = y2;
  }
  const uint4* wr = reinterpret_cast<const uint4*>(w + static_cast<size_t>(row) * k);
  const uint32_t vecs = k >> 3;
  float acc[B];
#pragma unroll
  for (int b = 0; b < B; ++b) acc[b] = 0.f;
  pdl_enter();
  for (uint32_t i0 = tid; i0 < vecs; i0 += DENSE_THREADS * DENSE_UNROLL) {
    uint4 wv[DENSE_UNROLL];
#pragma unroll
    for (int u = 0; u < DENSE_UNROLL; ++u) {
      const uint32_t i = i0 + u * DENSE_THREADS;
      wv[u] = i < vecs ? __ldg(wr + i) : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int u = 0; u < DENSE_UNROLL; ++u) {
      const uint32_t i = i0 + u * DENSE_THREADS;
      if (i >= vecs) break;
      const uint32_t wq[4] = {wv[u].x, wv[u].y, wv[u].z, wv[u].w};
#pragma unroll
      for (int b = 0; b < B; ++b) {
        const uint32_t bb = b < (int)b_rows ? b : 0u;  // padded batch rows read row 0, never stored
        const uint4 xq = ld_dep16(reinterpret_cast<const uint4*>(x + bb * k) + i);
        const uint32_t xw[4] = {xq.x, xq.y, xq.z, xq.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          acc[b] = fmaf(__uint_as_float(wq[j] << 16), __uint_as_float(xw[j] << 16), acc[b]);
          acc[b] = fmaf(__uint_as_float(wq[j] & 0xFFFF0000u), __uint_as_float(xw[j] & 0xFFFF0000u), acc[b]);
        }
      }
    }
  }
#pragma unroll
  for (int b = 0; b < B; ++b) {
    float v = acc[b];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
    if ((tid & 31u) == 0) red[tid >> 5][b] = v;
  }
  __syncthreads();
  if (tid < (uint32_t)B && tid < b_rows) {
    float v = 0.f;
#pragma unroll
    for (int i = 0; i < DENSE_THREADS / 32; ++i) v += red[i][tid];
    y[tid * n_rows + row] = __float2bfloat16_rn(v);
  }
}

}  // namespace

#define NINFER_DENSE(B)                                                                              \
  extern "C" __global__ void __launch_bounds__(DENSE_THREADS)                                        \
      ninfer_dense_bf16_b##B(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* y,        \
                             uint32_t n_rows, uint32_t k, uint32_t b_rows, const __nv_bfloat16* w2,   \
                             __nv_bfloat16* y2) {                                                     \
    dense_body<B>(x, w, y, n_rows, k, b_rows, w2, y2);                                                \
  }

NINFER_DENSE(1)
NINFER_DENSE(2)
NINFER_DENSE(4)
NINFER_DENSE(8)

// ------------------------------------------------------------------------------------------------
// RMS norm of decode activations, in the GEMVs' PDL chain (built with the dense kernels, so that
// bf16 packages carry it without the grouped-int ones): between two projections a TVM kernel
// would wait for the previous launch to finish and make the next one wait for it; this one lets the
// next GEMV's weight copies start while it runs. y = bf16(x * rsqrt(mean(x^2) + eps) * (w + offset))
// in fp32, as ops/norm.py's TE kernel computes it. One block per activation row, K % 8 == 0, K <= 8192.
// ------------------------------------------------------------------------------------------------
namespace {
constexpr int NORM_THREADS = 256;

constexpr uint32_t NORM_VECS = 4;  // 8-element vectors per thread: K <= 8 x 4 x 256 = 8192

// 8 weights (+ offset) as fp32, from a constant parameter (read before `pdl_wait`).
__device__ __forceinline__ void norm_weight8(const float* w, uint32_t i, float offset, float* out) {
  const float4 a = __ldg(reinterpret_cast<const float4*>(w) + 2u * i), b = __ldg(reinterpret_cast<const float4*>(w) + 2u * i + 1u);
  out[0] = a.x + offset; out[1] = a.y + offset; out[2] = a.z + offset; out[3] = a.w + offset;
  out[4] = b.x + offset; out[5] = b.y + offset; out[6] = b.z + offset; out[7] = b.w + offset;
}

// 8 bf16 weights in v (+ offset) as fp32.
__device__ __forceinline__ void norm_weight8_bf16(const uint4& v, float offset, float* out) {
  const uint32_t q[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    out[2 * j] = __uint_as_float(q[j] << 16) + offset;
    out[2 * j + 1] = __uint_as_float(q[j] & 0xFFFF0000u) + offset;
  }
}

__device__ __forceinline__ void norm_weight8(const __nv_bfloat16* w, uint32_t i, float offset, float* out) {
  norm_weight8_bf16(__ldg(reinterpret_cast<const uint4*>(w) + i), offset, out);
}

// ss plus the squares of the 8 bf16 values in x, in element order (both norm forms sum this way).
__device__ __forceinline__ float norm_sumsq8(const uint4& x, float ss) {
  const uint32_t q[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float a = __uint_as_float(q[i] << 16), b = __uint_as_float(q[i] & 0xFFFF0000u);
    ss = fmaf(a, a, ss);
    ss = fmaf(b, b, ss);
  }
  return ss;
}

// The 8 bf16 values in x times inv times their weights (+ offset), rounded to bf16 pairs in o.
__device__ __forceinline__ void norm_scale8(const uint4& x, float inv, const float* wv, uint32_t (&o)[4]) {
  const uint32_t q[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(__uint_as_float(q[i] << 16) * inv * wv[2 * i],
                                                   __uint_as_float(q[i] & 0xFFFF0000u) * inv * wv[2 * i + 1]);
    o[i] = *reinterpret_cast<const uint32_t*>(&h);
  }
}

// Weights are loaded before the wait, x once into registers after it; one reduction, one store.
// `xq` (nullptr: none): rows 0..3 also as the int8 activations of the I8 GEMV entries (at <= 4 rows).
// NINFER_NORM_DIAG=1 (measurement builds only, wrong results): the launch and its PDL wait alone.
#ifndef NINFER_NORM_DIAG
#define NINFER_NORM_DIAG 0
#endif
template <typename TW>
__device__ __forceinline__ void rms_norm_body(const __nv_bfloat16* x, const TW* __restrict__ w, __nv_bfloat16* y,
                                              uint32_t k, float eps, float offset, uint8_t* xq = nullptr) {
  if (NINFER_NORM_DIAG == 1) {
    pdl_enter();
    return;
  }
  __shared__ float red[NORM_THREADS / 32];
  const uint32_t tid = threadIdx.x, vecs = k >> 3;
  float wv[NORM_VECS][8];
#pragma unroll
  for (uint32_t j = 0; j < NORM_VECS; ++j)
    if (tid + j * NORM_THREADS < vecs) norm_weight8(w, tid + j * NORM_THREADS, offset, wv[j]);
  pdl_enter();
  const uint4* xr = reinterpret_cast<const uint4*>(x + static_cast<size_t>(blockIdx.x) * k);
  uint4 xv[NORM_VECS];
#pragma unroll
  for (uint32_t j = 0; j < NORM_VECS; ++j)
    xv[j] = tid + j * NORM_THREADS < vecs ? ld_dep16(xr + tid + j * NORM_THREADS) : make_uint4(0u, 0u, 0u, 0u);
  float ss = 0.f;
#pragma unroll
  for (uint32_t j = 0; j < NORM_VECS; ++j) ss = norm_sumsq8(xv[j], ss);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xFFFFFFFFu, ss, o);
  if ((tid & 31u) == 0) red[tid >> 5] = ss;
  __syncthreads();
  float total = 0.f;
#pragma unroll
  for (int i = 0; i < NORM_THREADS / 32; ++i) total += red[i];
  const float inv = rsqrtf(total / static_cast<float>(k) + eps);
  uint4* yr = reinterpret_cast<uint4*>(y + static_cast<size_t>(blockIdx.x) * k);
  // (more than 4 rows: the int8 entries do not run, every reader takes y, so nothing is written)
  const bool with_xq = xq != nullptr && blockIdx.x < 4u && gridDim.x <= 4u;
#pragma unroll
  for (uint32_t j = 0; j < NORM_VECS; ++j) {
    const bool valid = tid + j * NORM_THREADS < vecs;
    // (a warp with no vector of the row skips; groups of 8 lanes are whole since K % 64 == 0)
    if (!valid && (!with_xq || (tid & ~31u) + j * NORM_THREADS >= vecs)) continue;
    uint32_t o[4];
    norm_scale8(xv[j], inv, wv[j], o);
    if (valid) yr[tid + j * NORM_THREADS] = make_uint4(o[0], o[1], o[2], o[3]);
    if (with_xq) norm_xq8(o, tid + j * NORM_THREADS, blockIdx.x, k, valid, xq);  // (uniform per block)
  }
}
}  // namespace

extern "C" __global__ void __launch_bounds__(NORM_THREADS)
    ninfer_rms_norm_wf32(const __nv_bfloat16* x, const float* w, __nv_bfloat16* y, uint32_t k, float eps, float offset) {
  rms_norm_body<float>(x, w, y, k, eps, offset);
}

extern "C" __global__ void __launch_bounds__(NORM_THREADS)
    ninfer_rms_norm_wbf16(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* y, uint32_t k, float eps,
                          float offset) {
  rms_norm_body<__nv_bfloat16>(x, w, y, k, eps, offset);
}

// The same, rows 0..3 also written as int8 activations (`norm_xq8`; K % 256 == 0).
extern "C" __global__ void __launch_bounds__(NORM_THREADS)
    ninfer_rms_norm_xq_wf32(const __nv_bfloat16* x, const float* w, __nv_bfloat16* y, uint32_t k, float eps,
                            float offset, uint8_t* xq) {
  rms_norm_body<float>(x, w, y, k, eps, offset, xq);
}

extern "C" __global__ void __launch_bounds__(NORM_THREADS)
    ninfer_rms_norm_xq_wbf16(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* y, uint32_t k, float eps,
                             float offset, uint8_t* xq) {
  rms_norm_body<__nv_bfloat16>(x, w, y, k, eps, offset, xq);
}

#ifndef NINFER_GEMV_DENSE_ONLY
// ------------------------------------------------------------------------------------------------
// The residual-add GEMV's RMS norm of its own output (`ninfer_qgemv_add_norm`, passes/add_norm.py):
// the norm's input is the whole of y, which every block of the launch writes a part of, so each
// block counts itself in after its stores are visible and the last one normalizes y's rows (the
// threadfence reduction of `v4_xq_out`). Why: the separate norm kernel cost a launch boundary on
// the decode step's critical path; here the next kernel's PDL wait covers the norm. The math is
// `rms_norm_body`'s (fp32 sum of squares, y * inv * (w + offset) rounded to bf16, `norm_xq8`); rows
// are normalized in parallel, `per` warps each, over two reads of y from L2.
// ------------------------------------------------------------------------------------------------
namespace {
__device__ uint32_t v4_norm_arrivals;  // 0 between launches (the last block resets it)

__device__ __forceinline__ uint4 ld_cg16(const void* p) {  // L2 only: y was written by other SMs
  uint4 v;
  asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

template <typename TW>
__device__ __forceinline__ void v4_norm_rows(const __nv_bfloat16* y, const TW* w, __nv_bfloat16* yn, uint8_t* xq,
                                             float eps, float offset, uint32_t k, uint32_t b_rows, float* red) {
  const uint32_t warps = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31u;
  const uint32_t per = b_rows >= warps ? 1u : warps / b_rows, conc = warps / per, vecs = k >> 3, span = per * 32u;
  for (uint32_t r0 = 0; r0 < b_rows; r0 += conc) {
    const uint32_t r = r0 + warp / per, t = (warp % per) * 32u + lane;
    const bool row_ok = warp / per < conc && r < b_rows;
    const uint4* yr = reinterpret_cast<const uint4*>(y + static_cast<size_t>(r) * k);
    float ss = 0.f;
    if (row_ok)
      for (uint32_t v = t; v < vecs; v += span) ss = norm_sumsq8(ld_cg16(yr + v), ss);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xFFFFFFFFu, ss, o);
    if (lane == 0) red[warp] = ss;
    __syncthreads();
    if (row_ok) {
      float total = 0.f;
      for (uint32_t i = 0; i < per; ++i) total += red[(warp / per) * per + i];
      const float inv = rsqrtf(total / static_cast<float>(k) + eps);
      uint4* out = reinterpret_cast<uint4*>(yn + static_cast<size_t>(r) * k);
      const bool with_xq = xq != nullptr && r < 4u;
      for (uint32_t v0 = (warp % per) * 32u; v0 < vecs; v0 += span) {  // warp-uniform: norm_xq8 shuffles
        const uint32_t v = v0 + lane;
        const bool valid = v < vecs;
        uint32_t o[4] = {0u, 0u, 0u, 0u};
        if (valid) {
          float wv[8];
          norm_weight8(w, v, offset, wv);
          norm_scale8(ld_cg16(yr + v), inv, wv, o);
          out[v] = make_uint4(o[0], o[1], o[2], o[3]);
        }
        if (with_xq) norm_xq8(o, v, r, k, valid, xq);
      }
    }
    __syncthreads();  // red is reused by the next rows
  }
}

__device__ __noinline__ void v4_add_norm(const __nv_bfloat16* y, const void* w, void* yn, uint8_t* xq, float eps,
                                         float offset, uint32_t wbf16, uint32_t k, uint32_t b_rows) {
  extern __shared__ __align__(16) uint8_t v4_smem[];
  volatile uint32_t* last = reinterpret_cast<volatile uint32_t*>(v4_smem);
  __threadfence();  // this thread's stores of y, before the count
  __syncthreads();  // (every thread is done with the ring and the partial sums)
  if (threadIdx.x == 0) {
    const uint32_t done = atomicAdd(&v4_norm_arrivals, 1u) == gridDim.x - 1u ? 1u : 0u;
    if (done) v4_norm_arrivals = 0u;
    *last = done;
  }
  __syncthreads();
  if (*last == 0u) return;
  __threadfence();
  float* red = reinterpret_cast<float*>(v4_smem + 16);
  __nv_bfloat16* out = static_cast<__nv_bfloat16*>(yn);
  if (wbf16)
    v4_norm_rows(y, static_cast<const __nv_bfloat16*>(w), out, xq, eps, offset, k, b_rows, red);
  else
    v4_norm_rows(y, static_cast<const float*>(w), out, xq, eps, offset, k, b_rows, red);
}

// The XQN prologue (one row, K % 256 == 0, K <= 8,192, blocks of 4 or 8 warps): x's RMS norm with
// `rms_norm_body`'s math in its summation order (virtual thread t = 32 vw + lane of 256 sums the
// squares of vectors t + 256 j in j order, the shuffle tree per virtual warp, then virtual warps 0..7),
// so every block, whatever its size, and the norm kernel compute the same bf16 row. The owner warp
// of virtual warp vw (vw % warps) holds the vectors of units vw + 8 j (vector t + 256 j is lane t % 32
// of unit t / 32 + 8 j) and writes each unit normalized, quantized as `v4_xq_slot` does (the norm
// kernel's `norm_xq8` math) to `region`, and to `yn` unless nullptr. A bf16 weight is read from the
// unit's bytes there (copied before the PDL wait by the same lane), an fp32 one from global memory.
// Ends with a barrier: the block's stages read any unit.
__device__ __noinline__ void v4_norm_in(const __nv_bfloat16* x, const void* w, uint32_t wbf16, float eps, float offset,
                                        uint32_t k, uint8_t* region, __nv_bfloat16* yn) {
  __shared__ float red[NORM_THREADS / 32];
  const uint32_t warp = threadIdx.x >> 5, lane = threadIdx.x & 31u, warps = blockDim.x >> 5, vecs = k >> 3;
  const uint4* xr = reinterpret_cast<const uint4*>(x);
  uint4 xv[2][NORM_VECS];  // [h][j]: virtual warp warp + h x warps, vector j
#pragma unroll
  for (uint32_t h = 0; h < 2; ++h)
#pragma unroll
    for (uint32_t j = 0; j < NORM_VECS; ++j) {
      const uint32_t vw = warp + h * warps, v = vw * 32u + lane + j * NORM_THREADS;
      xv[h][j] = vw < 8u && v < vecs ? ld_dep16(xr + v) : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
  for (uint32_t h = 0; h < 2; ++h) {
    float ss = 0.f;
#pragma unroll
    for (uint32_t j = 0; j < NORM_VECS; ++j) ss = norm_sumsq8(xv[h][j], ss);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xFFFFFFFFu, ss, o);
    if (lane == 0u && warp + h * warps < 8u) red[warp + h * warps] = ss;
  }
  __syncthreads();
  float total = 0.f;
#pragma unroll
  for (int i = 0; i < NORM_THREADS / 32; ++i) total += red[i];
  const float inv = rsqrtf(total / static_cast<float>(k) + eps);
#pragma unroll
  for (uint32_t h = 0; h < 2; ++h)
#pragma unroll
    for (uint32_t j = 0; j < NORM_VECS; ++j) {
      const uint32_t vw = warp + h * warps, u = vw + 8u * j;
      if (vw >= 8u || u >= (k >> 8)) continue;  // (warp-uniform: v4_xq_slot shuffles)
      uint8_t* unit = region + u * V4_XQN_UNIT;
      float wv[8];
      if (wbf16)
        norm_weight8_bf16(*reinterpret_cast<const uint4*>(unit + lane * 16u), offset, wv);
      else
        norm_weight8(static_cast<const float*>(w), u * 32u + lane, offset, wv);
      uint32_t o[4];
      norm_scale8(ld_dep16(xr + u * 32u + lane), inv, wv, o);  // (again: an L1 hit, xv is not kept)
      const uint4 o4 = make_uint4(o[0], o[1], o[2], o[3]);
      if (yn != nullptr) reinterpret_cast<uint4*>(yn)[u * 32u + lane] = o4;
      __syncwarp();  // every lane has read its weights from the unit's bytes
      v4_xq_slot(o4, unit, lane);
    }
  __syncthreads();
}
}  // namespace
#endif  // NINFER_GEMV_DENSE_ONLY
