// fp8_e4m3fn_row_bf16 decode GEMV (batch 1..8) on the tensor cores, for `ops/fp8_row.py` (`[b, 1, K]`).
//
// Why: decode streams every weight byte once per step; the nvfp4 Triton GEMV of the same structure
// ran at ~11% of HBM bandwidth (docs/kernels/nvfp4.md) while this layout (the nvfp4 tensor-core
// GEMV's, docs/kernels/nvfp4-gemv.md) reached 44-46%. Here a weight costs ~2.25 integer/bf16
// instructions, codes are streamed with 16-byte loads, the next step's loads issued before the
// current step is computed.
//
// Planes (spec 3.4, as bound by ops/fp8_row.py): codes u8 [N, K] (one E4M3FN word per weight),
// scales bf16 [N] (one multiplier per row). NaN words (0x7F, 0xFF) are invalid and refused at load.
//
// Exact decode in bf16. A code's 7 magnitude bits (e3..e0 m2..m0) placed at bf16 bits 4..10 (and its
// sign at bit 15) are the bf16 e4m3fn(c) * 2^-120: the exponent field is e, the top 3 mantissa bits
// m, so e = 0 lands on the bf16 subnormal m/8 * 2^-126, which bf16 arithmetic keeps. One
// `fma.rn.bf16x2` by 2^120 (0x7B80) per two weights gives the code values exactly (<= 4 significant
// bits, 2^-9 .. 448); the signs are XORed into the multiplier. The products with x are exact in the
// fp32 MMA; the row scale multiplies each output once, in fp32, after the K parts are summed.
//
// Byte pairs. Bytes 0 and 2 of a code word are 16 bits apart, so `w << 4` puts both magnitudes at
// bits 4..10 of the two halves (mask 0x07F007F0) and `w << 8` both signs at bits 15 and 31; bytes
// 1 and 3 are `w >> 4` and `w` itself; sign | multiplier is one LOP3. 9 instructions per 4 weights.
//
// Fragments of mma.m16n8k16 (g = lane / 4, c = lane % 4): a0/a2 hold row g, a1/a3 row g + 8, at
// logical k (2c, 2c + 1) and (2c + 8, 2c + 9); b0/b1 hold batch column g at the same k. Only the sum
// over k matters, so each thread maps its logical k to physical k of its own: in a 128-k chunk,
// thread c reads bytes 32c .. 32c + 31 of its two rows (the 4 threads of a row read 128 contiguous
// bytes). Word q of those (k = 4q .. 4q + 3) feeds one MMA: bytes (0, 2) are logical (2c, 2c + 1)
// (a0 row g, a1 row g + 8) and bytes (1, 3) logical (2c + 8, 2c + 9) (a2, a3), with b0 = (x0, x2),
// b1 = (x1, x3) paired from the activation words by PRMT.
//
// Layout: a warp owns 16 rows (a tile); `ks` warps of a block split K (contiguous chunk ranges) for
// the same tile and are summed through shared memory, so no output needs zeroing and the launch is
// CUDA-graph safe. A block of ks * slots warps works on `slots` tiles at a time (a group) and loops
// over groups b, b + grid, ... (persistent when the grid is the resident block count).
#include <cuda_bf16.h>
#include <stdint.h>

#ifndef FP8_ROW_CH
#define FP8_ROW_CH 2  // 128-k chunks per pipelined step (two 16-byte loads per row and thread each)
#endif

namespace {

constexpr int kMaxWarps = 16;
constexpr uint32_t kMagMask = 0x07F007F0u;   // bf16 bits 4..10 of both halves
constexpr uint32_t kSignMask = 0x80008000u;
constexpr uint32_t kTwo120 = 0x7B807B80u;    // bf16x2 (2^120, 2^120)

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

// (a & 0x80008000) | c in one LOP3 (c in a register; the compiler splits it into two otherwise).
__device__ __forceinline__ uint32_t signs_or(uint32_t a, uint32_t c) {
  uint32_t out;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(out) : "r"(a), "n"(kSignMask), "r"(c));
  return out;
}

// Bytes 0 and 2 of code word w as the bf16x2 (e4m3fn(b0), e4m3fn(b2)); `two120` holds kTwo120.
__device__ __forceinline__ uint32_t pair02(uint32_t w, uint32_t two120) {
  return bf16x2_scale((w << 4) & kMagMask, signs_or(w << 8, two120));
}

// Bytes 1 and 3 of code word w as the bf16x2 (e4m3fn(b1), e4m3fn(b3)).
__device__ __forceinline__ uint32_t pair13(uint32_t w, uint32_t two120) {
  return bf16x2_scale((w >> 4) & kMagMask, signs_or(w, two120));
}

__device__ __forceinline__ uint32_t word_of(const uint4& v, int q) {
  return q == 0 ? v.x : (q == 1 ? v.y : (q == 2 ? v.z : v.w));
}

// One code word (4 k) of rows g and g + 8 with its activations (x words (x0, x1), (x2, x3)): one MMA.
__device__ __forceinline__ void word_mma(float* acc, uint32_t wa, uint32_t wb, uint32_t x01, uint32_t x23,
                                         uint32_t two120) {
  mma_bf16(acc, pair02(wa, two120), pair02(wb, two120), pair13(wa, two120), pair13(wb, two120),
           __byte_perm(x01, x23, 0x5410), __byte_perm(x01, x23, 0x7632));
}

__device__ __forceinline__ float scale_of(const __nv_bfloat16* scales, uint32_t row) {
  return __bfloat162float(scales[row]);
}

__device__ __forceinline__ void store_y(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ void store_y(float* p, float v) { *p = v; }

template <typename TY>
__device__ __forceinline__ void gemv_body(const __nv_bfloat16* __restrict__ x, const uint8_t* __restrict__ codes,
                                          const __nv_bfloat16* __restrict__ scales, TY* __restrict__ y,
                                          uint32_t n_rows, uint32_t k, uint32_t b_rows, uint32_t ks) {
  __shared__ float part[kMaxWarps * 128];
  const uint32_t warp = threadIdx.x >> 5, lane = threadIdx.x & 31u;
  const uint32_t g = lane >> 2, c = lane & 3u;
  const uint32_t slots = (blockDim.x >> 5) / ks;
  const uint32_t kpart = warp / slots, slot = warp % slots;
  const uint32_t tiles = n_rows >> 4, groups = (tiles + slots - 1u) / slots;
  const uint32_t chunks = k >> 7, per = (chunks + ks - 1u) / ks;
  const uint32_t cbeg = min(kpart * per, chunks), cend = min(cbeg + per, chunks);
  const uint32_t steps = (per + FP8_ROW_CH - 1u) / FP8_ROW_CH;  // the same for every warp (barriers)
  const bool has_x = g < b_rows;
  const __nv_bfloat16* xr = x + g * k + c * 32u;
  uint32_t two120 = kTwo120;
  asm volatile("" : "+r"(two120));  // keep the multiplier in a register (the LOP3 operand)

  uint4 ca[2 * FP8_ROW_CH], cb[2 * FP8_ROW_CH];
  // Loads of step `s` of group `gi` (clamped to valid addresses; out-of-range data is never used).
  auto load = [&](uint32_t gi, uint32_t s) {
    const uint32_t tile = min(gi * slots + slot, tiles - 1u);
    const uint32_t ra = tile * 16u + g, rb = ra + 8u;
    const uint8_t* pa = codes + static_cast<size_t>(ra) * k + c * 32u;
    const uint8_t* pb = codes + static_cast<size_t>(rb) * k + c * 32u;
#pragma unroll
    for (int u = 0; u < FP8_ROW_CH; ++u) {
      const uint32_t ch = min(cbeg + s * FP8_ROW_CH + u, chunks - 1u);
      ca[2 * u] = __ldg(reinterpret_cast<const uint4*>(pa + ch * 128u));
      ca[2 * u + 1] = __ldg(reinterpret_cast<const uint4*>(pa + ch * 128u + 16u));
      cb[2 * u] = __ldg(reinterpret_cast<const uint4*>(pb + ch * 128u));
      cb[2 * u + 1] = __ldg(reinterpret_cast<const uint4*>(pb + ch * 128u + 16u));
    }
  };

  // Persistent: block b takes groups b, b + grid, ... (grid <= groups); each warp streams its K range
  // of each group's tile, the next step's loads (possibly of the next group) in flight meanwhile.
  uint32_t gi = blockIdx.x, s = 0;
  if (gi >= groups) return;  // uniform per block
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  load(gi, 0);
  while (true) {
    uint4 ca_c[2 * FP8_ROW_CH], cb_c[2 * FP8_ROW_CH];
#pragma unroll
    for (int u = 0; u < 2 * FP8_ROW_CH; ++u) {
      ca_c[u] = ca[u];
      cb_c[u] = cb[u];
    }
    uint32_t s_n = s + 1u, gi_n = gi;
    if (s_n == steps) { s_n = 0u; gi_n += gridDim.x; }
    if (gi_n < groups) load(gi_n, s_n);
    const uint32_t row0 = (gi * slots + slot) * 16u;
#pragma unroll
    for (int u = 0; u < FP8_ROW_CH; ++u) {
      const uint32_t ch = cbeg + s * FP8_ROW_CH + u;
      if (ch < cend && row0 < n_rows) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {  // 8 k per 16-byte activation load, two code words
          uint4 xv = make_uint4(0u, 0u, 0u, 0u);
          if (has_x) xv = __ldg(reinterpret_cast<const uint4*>(xr + ch * 128u + j * 8u));
          const uint4& va = ca_c[2 * u + (j >> 1)];
          const uint4& vb = cb_c[2 * u + (j >> 1)];
          const int q = (j & 1) * 2;
          word_mma(acc, word_of(va, q), word_of(vb, q), xv.x, xv.y, two120);
          word_mma(acc, word_of(va, q + 1), word_of(vb, q + 1), xv.z, xv.w, two120);
        }
      }
    }
    if (s_n == 0u) {  // the group is done: sum the K parts, scale, store, reset
      // D: acc[0..1] = row g, batch columns 2c, 2c + 1; acc[2..3] = row g + 8, same columns
      if (ks == 1) {
        if (row0 < n_rows) {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const uint32_t row = row0 + g + (i >> 1) * 8u, col = 2u * c + (i & 1);
            if (col < b_rows) store_y(y + col * n_rows + row, acc[i] * scale_of(scales, row));
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
          store_y(y + col * n_rows + row, v * scale_of(scales, row));
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
#define NINFER_FP8_ROW_GEMV(TY, TAG)                                                                   \
  extern "C" __global__ void __launch_bounds__(kMaxWarps * 32)                                         \
      ninfer_fp8_row_gemv_y##TAG(const __nv_bfloat16* x, const uint8_t* codes, const __nv_bfloat16* scales, \
                                 TY* y, uint32_t n_rows, uint32_t k, uint32_t b_rows, uint32_t ks) {   \
    gemv_body<TY>(x, codes, scales, y, n_rows, k, b_rows, ks);                                         \
  }

NINFER_FP8_ROW_GEMV(__nv_bfloat16, bf16)
NINFER_FP8_ROW_GEMV(float, f32)  // fp32 output: lets the GPU check see fp32-level error
