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

#define ROWS 4
#define THREADS 256

namespace {

// 8 consecutive activations as fp32 (one 16-byte load for bf16, two for fp32).
__device__ __forceinline__ void load_x8(const __nv_bfloat16* p, float* out) {
  const uint4 q = __ldg(reinterpret_cast<const uint4*>(p));
  const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    out[2 * j] = __uint_as_float(w[j] << 16);
    out[2 * j + 1] = __uint_as_float(w[j] & 0xFFFF0000u);
  }
}

__device__ __forceinline__ void load_x8(const float* p, float* out) {
  const float4* v = reinterpret_cast<const float4*>(p);
  const float4 a = __ldg(v), b = __ldg(v + 1);
  out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w;
  out[4] = b.x; out[5] = b.y; out[6] = b.z; out[7] = b.w;
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
                                          uint32_t n_rows, uint32_t k, uint32_t b_rows, uint32_t ks) {
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
    if (row < n_rows && b < b_rows) store_y(y + b * n_rows + row, v);
  }
}

}  // namespace

#define NINFER_QGEMV(BITS, B, T, TAG)                                                              \
  extern "C" __global__ void __launch_bounds__(THREADS)                                             \
      ninfer_qgemv_q##BITS##_b##B##_##TAG(const T* x, const uint8_t* base, const uint8_t* high,     \
                                          const __half* scales, T* y, uint32_t n_rows, uint32_t k,  \
                                          uint32_t b_rows, uint32_t ks) {                           \
    gemv_body<BITS, B, T>(x, base, high, scales, y, n_rows, k, b_rows, ks);                        \
  }

#define NINFER_QGEMV_BATCHES(BITS, T, TAG) \
  NINFER_QGEMV(BITS, 1, T, TAG)            \
  NINFER_QGEMV(BITS, 2, T, TAG)            \
  NINFER_QGEMV(BITS, 4, T, TAG)            \
  NINFER_QGEMV(BITS, 8, T, TAG)

NINFER_QGEMV_BATCHES(4, __nv_bfloat16, bf16)
NINFER_QGEMV_BATCHES(5, __nv_bfloat16, bf16)
NINFER_QGEMV_BATCHES(6, __nv_bfloat16, bf16)
NINFER_QGEMV_BATCHES(8, __nv_bfloat16, bf16)
NINFER_QGEMV_BATCHES(4, float, f32)
NINFER_QGEMV_BATCHES(5, float, f32)
NINFER_QGEMV_BATCHES(6, float, f32)
NINFER_QGEMV_BATCHES(8, float, f32)
