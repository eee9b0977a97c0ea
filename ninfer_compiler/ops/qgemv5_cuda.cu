// Decode GEMV v5 (`ninfer_qgemv5_y{bf16,f32}`): fused, PDL-chained dequantizing GEMVs for batch 1..8
// over row_split_k128_v1 planes (q4/q5/q6) and dense bf16 weights, several weights per launch.
//
// Why (docs/kernels/decode-gemv-v5.md): v4 spent ~5-6 ALU-pipe ops per bf16 pair of codes (the
// int pipe is 64 lanes/clk/SM on sm_90, so q5 at full bandwidth was ALU-bound), re-read the
// activations through L1 in every warp, and paid a fixed ramp/tail per launch. v5:
// * builds each pair with fewer ALU ops: the code may sit at any bit position p of the bf16
//   mantissa because the one bf16x2 FMA that removes the magic also multiplies by 2^-p (exact),
//   so the nibble shifts are reduced and q5/q6 high bits are spread by one IMAD per word
//   (details at `q5_pair` / `q6_pair`);
// * stages the activations once per block per kstep in shared memory, already permuted into the
//   MMA's B-fragment order (producer threads: one 16-byte load and 4 PRMT per 8 lanes), so warps
//   load B fragments with two LDS.128 per group and no PRMT; the slots form a ring with mbarriers
//   (no block-wide barrier per kstep: a first build with one was held in lockstep);
// * streams each warp's weights through its own cp.async ring (v4), with the first stages issued
//   before `griddepcontrol.wait` (Programmatic Dependent Launch: weights never depend on the
//   previous kernel), and `griddepcontrol.launch_dependents` at the start, so the next launch's
//   blocks (sized to fit beside this one) prefetch while this one drains;
// * splits the work over a persistent grid by bytes (stream-K, qgemv5_plan.h) with a
//   deterministic last-block reduction of split strips, and computes the epilogue of the fused
//   ops (several outputs, silu(gate) * up, + residual) in fp32 before the single bf16 rounding.
//
// MMA fragments (mma.m16n8k16, g = lane / 4, c = lane % 4) as in v3: thread (g, c) holds rows g and
// g + 8, its 16 physical lanes 16c..16c+15 of a 64-lane group as words w0 (lanes +0..7) and w1
// (+8..15); in MMA m (0..3) the A pair of w is lanes (m, m + 4) of the word, and the B pair is the
// activations of the same lanes. A word's 8 nibbles sit at bits 4j; a bf16 half whose 7 mantissa
// bits hold an unsigned code u at bit p, with the magic 0x43 exponent, is 128 + u * 2^p, and
// `fma.rn.bf16x2(v, 2^-p, -(128 * 2^-p + 2^(b-1)))` gives the signed code exactly.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "qgemv5_plan.h"
#include "qgemv_codes.h"

#ifndef NINFER_V5_EVICT_FIRST  // weight copies tagged L2 evict-first (they are read once per launch)
#define NINFER_V5_EVICT_FIRST 1
#endif
#ifndef NINFER_V5_DIAG  // measurement builds only: 1 = the same loads without the code construction and MMAs
#define NINFER_V5_DIAG 0
#endif

namespace {

constexpr uint32_t W = NINFER_V5_WARPS;
constexpr uint32_t XSLOT = NINFER_V5_XSLOT;
constexpr uint32_t XSLOTS = NINFER_V5_XSLOTS;  // staged-activation ring depth
constexpr uint32_t XAHEAD = XSLOTS - 3;         // units the producers stage beyond the next one

static_assert(sizeof(V5Params) <= 4096, "kernel parameter space");

using ninfer_codes::code_pair;
using ninfer_codes::HighBits;
using ninfer_codes::mma_bf16;

// ---- codes -> bf16 pairs (qgemv_codes.h, shared with v3/v4) ------------------------------------
// q4: lanes (m, m + 4) at p = 0; q5: X = h8 * 0x10010 / X3 = h8 * 0x8008 (`q5_high`), p = 0, 1, 2, 2;
// q6: F as below, p = 0, 1, 0, 1.
template <int M>
__device__ __forceinline__ uint32_t q4_pair(uint32_t w) {
  return code_pair<4, M>(w, HighBits{0u, 0u});
}

template <int M>
__device__ __forceinline__ uint32_t q5_pair(uint32_t w, uint32_t x, uint32_t x3) {
  return code_pair<5, M>(w, HighBits{x, x3});
}

// hi * 65536 + lo as an IMAD (FMA pipe; the compiler would pick a PRMT, an ALU op).
__device__ __forceinline__ uint32_t spread16(uint32_t hi, uint32_t lo) {
  uint32_t d;
  asm("mad.lo.u32 %0, %1, 65536, %2;" : "=r"(d) : "r"(hi), "r"(lo));
  return d;
}

// q6: F = hh * 65536 + hl (hl, hh: the high bytes of lanes 0..3 and 4..7 of the word) puts lane m's
// two bits at 2m and lane m + 4's at 16 + 2m.
template <int M>
__device__ __forceinline__ uint32_t q6_pair(uint32_t w, uint32_t f) {
  return code_pair<6, M>(w, HighBits{f, 0u});
}

// ---- shared memory -------------------------------------------------------------------------
// Staged activations, one XSLOT per kstep: column n's 128 lanes as 8 blocks jj of 16 lanes (the
// lanes of thread c of group q: jj = 4q + c), each two pieces of 16 B holding that thread's B
// fragments in register order: piece e = (b0, b1) of MMA 2e, then (b0, b1) of MMA 2e + 1, where
// b0 of MMA m = (x[16jj+m], x[16jj+m+4]) and b1 = (x[16jj+8+m], x[16jj+12+m]). Piece P = 2jj + e
// sits at P ^ (n & 1) (conflict-free LDS.128), and each LDS.128 yields two aligned register pairs.
__device__ __forceinline__ uint32_t x_piece_offset(uint32_t n, uint32_t piece) { return n * 256u + ((piece ^ (n & 1u)) << 4); }

// Grouped-int stage (32 rows r = 16 t + rr of an item, one kstep): base at r * 64 (4 pieces, piece p
// at p ^ 2((r >> 1) & 1)), then high (q5: 16 B per row; q6: 32 B per row, piece q at q ^ ((r >> 2) & 1)),
// then the row's two fp16 scales (4 B). bf16 stage: 8 rows x 256 B, piece P at P ^ (r & 1).
__device__ __forceinline__ uint32_t base_offset(uint32_t r, uint32_t p) { return r * 64u + ((p ^ (((r >> 1) & 1u) << 1)) << 4); }
template <int FMT>
__device__ __forceinline__ uint32_t high_offset(uint32_t r, uint32_t q) {
  return 2048u + (FMT == 5 ? r * 16u : r * 32u + ((q ^ ((r >> 2) & 1u)) << 4));
}
template <int FMT>
__device__ __forceinline__ uint32_t scale_offset(uint32_t r) {
  return 2048u + 32u * (FMT == 5 ? 16u : FMT == 6 ? 32u : 0u) + r * 4u;
}
__device__ __forceinline__ uint32_t bf16_offset(uint32_t r, uint32_t piece) { return r * 256u + ((piece ^ (r & 1u)) << 4); }

// ---- copies --------------------------------------------------------------------------------
__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t p = 0;
#if NINFER_V5_EVICT_FIRST
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
#endif
  return p;
}

__device__ __forceinline__ void cp16(uint32_t dst, const void* src, uint64_t policy) {
#if NINFER_V5_EVICT_FIRST
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "l"(policy) : "memory");
#else
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
#endif
}

__device__ __forceinline__ void cp4(uint32_t dst, const void* src, uint64_t policy) {
#if NINFER_V5_EVICT_FIRST
  asm volatile("cp.async.ca.shared.global.L2::cache_hint [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "l"(policy) : "memory");
#else
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src) : "memory");
#endif
}

__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Wait until at most n groups of this thread are pending (n is the ring's lookahead - 1).
__device__ __forceinline__ void cp_wait_dyn(uint32_t n) {
  switch (n) {
    case 0: cp_wait<0>(); break;
    case 1: cp_wait<1>(); break;
    case 2: cp_wait<2>(); break;
    case 3: cp_wait<3>(); break;
    case 4: cp_wait<4>(); break;
    case 5: cp_wait<5>(); break;
    case 6: cp_wait<6>(); break;
    case 7: cp_wait<7>(); break;
    case 8: cp_wait<8>(); break;
    case 9: cp_wait<9>(); break;
    case 10: cp_wait<10>(); break;
    case 11: cp_wait<11>(); break;
    case 12: cp_wait<12>(); break;
    case 13: cp_wait<13>(); break;
    default: cp_wait<14>(); break;
  }
}

// mbarriers (shared::cta): the staged-activation ring's full / empty slots.
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("{\n\t.reg .b64 st;\n\tmbarrier.arrive.shared::cta.b64 st, [%0];\n\t}" ::"r"(bar) : "memory");
}

__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\tselp.u32 %0, 1, 0, p;\n\t}"
                 : "=r"(done)
                 : "r"(bar), "r"(parity)
                 : "memory");
  } while (!done);
}

// The planes a warp reads for its item of a strip: row-0 pointers of the item's two tiles.
struct Item {
  const uint8_t* base[2];
  const uint8_t* high[2];
  const uint8_t* scales[2];
  uint32_t fmt, index, seg;
  bool valid, two;  // this warp has an item in the strip; the item has a second tile
};

__device__ __forceinline__ Item item_of(const V5Params& p, uint32_t strip, uint32_t warp) {
  Item it;
  it.seg = v5_seg_of_strip(p, strip);
  const V5Segment& s = p.seg[it.seg];
  it.fmt = s.fmt;
  it.index = (strip - s.strip0) * W + warp;
  it.valid = it.index < s.items;
  const uint32_t k = p.k;
  if (s.fmt == V5_FMT_BF16) {
    it.two = false;
    it.base[0] = it.base[1] = static_cast<const uint8_t*>(s.base[0]) + size_t(it.index) * 8u * (2u * k);
    it.high[0] = it.high[1] = it.scales[0] = it.scales[1] = it.base[0];
    return it;
  }
  const uint32_t hb = s.fmt == V5_FMT_Q5 ? k / 8u : s.fmt == V5_FMT_Q6 ? k / 4u : 0u;  // high bytes per row
  const bool pair = p.mode == V5_MODE_SWIGLU;
#pragma unroll
  for (int t = 0; t < 2; ++t) {
    const uint32_t row = pair ? it.index * 16u : (2u * it.index + t) * 16u;
    const int set = pair ? t : 0;
    it.base[t] = static_cast<const uint8_t*>(s.base[set]) + size_t(row) * (k / 2u);
    it.high[t] = static_cast<const uint8_t*>(s.high[set]) + size_t(row) * hb;
    it.scales[t] = static_cast<const uint8_t*>(s.scales[set]) + size_t(row) * (k / 32u);
  }
  it.two = pair || 32u * it.index + 16u < s.rows;
  return it;
}

// Copies kstep `ks` of the warp's item into the ring slot at shared address `dst`.
template <int FMT>
__device__ __forceinline__ void issue_q(uint32_t dst, const Item& it, uint32_t k, uint32_t ks, uint32_t lane,
                                        uint64_t pol) {
  const uint32_t bstride = k / 2u, sstride = k / 32u;
#pragma unroll
  for (uint32_t j = 0; j < 4; ++j) {
    const uint32_t i = j * 32u + lane, r = i >> 2, pc = i & 3u, t = r >> 4;
    if (t == 1 && !it.two) continue;
    cp16(dst + base_offset(r, pc), (t ? it.base[1] : it.base[0]) + (r & 15u) * bstride + ks * 64u + pc * 16u, pol);
  }
  if (FMT == 5) {
    const uint32_t r = lane, t = r >> 4;
    if (t == 0 || it.two)
      cp16(dst + high_offset<5>(r, 0), (t ? it.high[1] : it.high[0]) + (r & 15u) * (k / 8u) + ks * 16u, pol);
  }
  if (FMT == 6) {
#pragma unroll
    for (uint32_t j = 0; j < 2; ++j) {
      const uint32_t i = j * 32u + lane, r = i >> 1, q = i & 1u, t = r >> 4;
      if (t == 1 && !it.two) continue;
      cp16(dst + high_offset<6>(r, q), (t ? it.high[1] : it.high[0]) + (r & 15u) * (k / 4u) + ks * 32u + q * 16u, pol);
    }
  }
  {
    const uint32_t r = lane, t = r >> 4;
    if (t == 0 || it.two)
      cp4(dst + scale_offset<FMT>(r), (t ? it.scales[1] : it.scales[0]) + (r & 15u) * sstride + ks * 4u, pol);
  }
}

__device__ __forceinline__ void issue_bf16(uint32_t dst, const Item& it, uint32_t k, uint32_t ks, uint32_t lane,
                                           uint64_t pol) {
#pragma unroll
  for (uint32_t j = 0; j < 4; ++j) {
    const uint32_t i = j * 32u + lane, r = i >> 4, piece = i & 15u;
    cp16(dst + bf16_offset(r, piece), it.base[0] + r * (2u * k) + ks * 256u + piece * 16u, pol);
  }
}

__device__ __forceinline__ void issue(uint32_t dst, const Item& it, uint32_t k, uint32_t ks, uint32_t lane,
                                      uint64_t pol) {
  if (!it.valid) return;
  switch (it.fmt) {
    case V5_FMT_Q4: issue_q<4>(dst, it, k, ks, lane, pol); break;
    case V5_FMT_Q5: issue_q<5>(dst, it, k, ks, lane, pol); break;
    case V5_FMT_Q6: issue_q<6>(dst, it, k, ks, lane, pol); break;
    default: issue_bf16(dst, it, k, ks, lane, pol); break;
  }
}

// ---- one kstep of one item -----------------------------------------------------------------
// B fragments of group q from the staged activations (columns >= batch: zero, never stored).
__device__ __forceinline__ void load_b(const uint8_t* xs, uint32_t g, uint32_t c, uint32_t q, bool has_x,
                                       uint32_t* b) {
  uint4 lo = make_uint4(0u, 0u, 0u, 0u), hi = lo;
  if (has_x) {
    lo = *reinterpret_cast<const uint4*>(xs + x_piece_offset(g, 8u * q + 2u * c));
    hi = *reinterpret_cast<const uint4*>(xs + x_piece_offset(g, 8u * q + 2u * c + 1u));
  }
  b[0] = lo.x; b[1] = lo.y; b[2] = lo.z; b[3] = lo.w;  // (b0, b1) of MMA 0, then MMA 1
  b[4] = hi.x; b[5] = hi.y; b[6] = hi.z; b[7] = hi.w;  // MMA 2, MMA 3
}

template <int FMT>
__device__ __forceinline__ void q_tile_group(const uint8_t* s, uint32_t t, uint32_t q, uint32_t g, uint32_t c,
                                             const uint32_t* b, float* acc) {
  const uint32_t ra = 16u * t + g, rb = ra + 8u;
  const uint32_t boff = ((((2u * q) + (c >> 1)) ^ (((g >> 1) & 1u) << 1)) << 4) + (c & 1u) * 8u;
  const uint2 wa = *reinterpret_cast<const uint2*>(s + ra * 64u + boff);
  const uint2 wb = *reinterpret_cast<const uint2*>(s + rb * 64u + boff);
  const __half2 sa = *reinterpret_cast<const __half2*>(s + scale_offset<FMT>(ra));
  const __half2 sb = *reinterpret_cast<const __half2*>(s + scale_offset<FMT>(rb));
  uint32_t a[4][4];  // [m][a0..a3]
  if (FMT == 4) {
#define NINFER_V5_Q4(M) a[M][0] = q4_pair<M>(wa.x); a[M][1] = q4_pair<M>(wb.x); a[M][2] = q4_pair<M>(wa.y); a[M][3] = q4_pair<M>(wb.y);
    NINFER_V5_Q4(0) NINFER_V5_Q4(1) NINFER_V5_Q4(2) NINFER_V5_Q4(3)
#undef NINFER_V5_Q4
  } else if (FMT == 5) {
    // high byte of w0 is byte 2c, of w1 byte 2c + 1 of the group's 8 bytes
    const uint8_t* ha = s + high_offset<5>(ra, 0) + 8u * q + 2u * c;
    const uint8_t* hbp = s + high_offset<5>(rb, 0) + 8u * q + 2u * c;
    const uint32_t h[4] = {ha[0], hbp[0], ha[1], hbp[1]};
    const uint32_t wd[4] = {wa.x, wb.x, wa.y, wb.y};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t x = h[i] * 0x10010u, x3 = h[i] * 0x8008u;
      a[0][i] = q5_pair<0>(wd[i], x, x3);
      a[1][i] = q5_pair<1>(wd[i], x, x3);
      a[2][i] = q5_pair<2>(wd[i], x, x3);
      a[3][i] = q5_pair<3>(wd[i], x, x3);
    }
  } else {
    // high bytes 4c, 4c + 1 (w0) and 4c + 2, 4c + 3 (w1) of the group's 16 bytes
    const uint8_t* ha = s + high_offset<6>(ra, q) + 4u * c;
    const uint8_t* hbp = s + high_offset<6>(rb, q) + 4u * c;
    const uint32_t f[4] = {spread16(ha[1], ha[0]), spread16(hbp[1], hbp[0]), spread16(ha[3], ha[2]),
                           spread16(hbp[3], hbp[2])};
    const uint32_t wd[4] = {wa.x, wb.x, wa.y, wb.y};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      a[0][i] = q6_pair<0>(wd[i], f[i]);
      a[1][i] = q6_pair<1>(wd[i], f[i]);
      a[2][i] = q6_pair<2>(wd[i], f[i]);
      a[3][i] = q6_pair<3>(wd[i], f[i]);
    }
  }
  float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int m = 0; m < 4; ++m) mma_bf16(d, a[m][0], a[m][1], a[m][2], a[m][3], b[2 * m], b[2 * m + 1]);
  const float s_a = q ? __high2float(sa) : __low2float(sa);
  const float s_b = q ? __high2float(sb) : __low2float(sb);
  acc[0] = fmaf(d[0], s_a, acc[0]);
  acc[1] = fmaf(d[1], s_a, acc[1]);
  acc[2] = fmaf(d[2], s_b, acc[2]);
  acc[3] = fmaf(d[3], s_b, acc[3]);
}

// Both tiles always (an item with one tile computes garbage into acc[1], which is never stored), so
// the kstep is one straight-line block and the two tiles' MMA chains interleave.
template <int FMT>
__device__ __forceinline__ void q_kstep(const uint8_t* s, const uint8_t* xs, uint32_t g, uint32_t c, bool has_x,
                                        float (*acc)[4]) {
#pragma unroll
  for (uint32_t q = 0; q < 2; ++q) {
    uint32_t b[8];
    load_b(xs, g, c, q, has_x, b);
    q_tile_group<FMT>(s, 0, q, g, c, b, acc[0]);
    q_tile_group<FMT>(s, 1, q, g, c, b, acc[1]);
  }
}

// NINFER_V5_DIAG == 1: every word q_kstep loads from shared memory, folded into acc (wrong results).
template <int FMT>
__device__ __forceinline__ void diag_kstep(const uint8_t* s, const uint8_t* xs, uint32_t g, uint32_t c, bool has_x,
                                           float (*acc)[4]) {
#pragma unroll
  for (uint32_t q = 0; q < 2; ++q) {
    uint32_t b[8];
    load_b(xs, g, c, q, has_x, b);
#pragma unroll
    for (uint32_t t = 0; t < 2; ++t) {
      const uint32_t ra = 16u * t + g, rb = ra + 8u;
      const uint32_t boff = ((((2u * q) + (c >> 1)) ^ (((g >> 1) & 1u) << 1)) << 4) + (c & 1u) * 8u;
      const uint2 wa = *reinterpret_cast<const uint2*>(s + ra * 64u + boff);
      const uint2 wb = *reinterpret_cast<const uint2*>(s + rb * 64u + boff);
      uint32_t h = *reinterpret_cast<const uint32_t*>(s + scale_offset<FMT>(ra)) ^ *reinterpret_cast<const uint32_t*>(s + scale_offset<FMT>(rb));
      if (FMT == 5) h ^= s[high_offset<5>(ra, 0) + 8u * q + 2u * c] ^ s[high_offset<5>(rb, 0) + 8u * q + 2u * c + 1u];
      if (FMT == 6) h ^= *reinterpret_cast<const uint32_t*>(s + high_offset<6>(ra, q) + 4u * c) ^ *reinterpret_cast<const uint32_t*>(s + high_offset<6>(rb, q) + 4u * c);
      const uint32_t v = wa.x ^ wa.y ^ wb.x ^ wb.y ^ h ^ b[0] ^ b[3] ^ b[5] ^ b[6];
      acc[t][q] += __uint_as_float(v & 0x3FFFFFFFu);
      acc[t][q + 2] += __uint_as_float((v ^ b[1] ^ b[2] ^ b[4] ^ b[7]) & 0x3FFFFFFFu);
    }
  }
}

// bf16 rows: row g of the 8-row item at MMA row g (rows g + 8 are zero); A pairs built from the
// natural layout with one PRMT each to match the staged activations' lane pairing.
__device__ __forceinline__ void bf16_kstep(const uint8_t* s, const uint8_t* xs, uint32_t g, uint32_t c, bool has_x,
                                           float* acc) {
#pragma unroll
  for (uint32_t q = 0; q < 2; ++q) {
    uint32_t b[8];
    load_b(xs, g, c, q, has_x, b);
    const uint4 lo = *reinterpret_cast<const uint4*>(s + bf16_offset(g, 8u * q + 2u * c));
    const uint4 hi = *reinterpret_cast<const uint4*>(s + bf16_offset(g, 8u * q + 2u * c + 1u));
    const uint32_t v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const uint32_t sel = (m & 1) ? 0x7632u : 0x5410u;
      const uint32_t a0 = __byte_perm(v[m >> 1], v[(m >> 1) + 2], sel);
      const uint32_t a2 = __byte_perm(v[4 + (m >> 1)], v[6 + (m >> 1)], sel);
      mma_bf16(acc, a0, 0u, a2, 0u, b[2 * m], b[2 * m + 1]);
    }
  }
}

// ---- epilogue ------------------------------------------------------------------------------
__device__ __forceinline__ void store_y(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ void store_y(float* p, float v) { *p = v; }

__device__ __forceinline__ float silu(float v) { return v / (1.f + expf(-v)); }

// Writes the item's final sums (acc[t][i]: tile t, row g + 8 (i >> 1), column 2c + (i & 1)).
template <typename TY>
__device__ __forceinline__ void epilogue(const V5Params& p, const Item& it, uint32_t g, uint32_t c, float (*acc)[4]) {
  const V5Segment& s = p.seg[it.seg];
  TY* y = static_cast<TY*>(p.y[s.out]);
  const uint32_t n = p.y_rows[s.out];
  const __nv_bfloat16* res = static_cast<const __nv_bfloat16*>(p.residual);
  const int tiles = s.fmt == V5_FMT_BF16 || p.mode == V5_MODE_SWIGLU ? 1 : (it.two ? 2 : 1);
#pragma unroll
  for (int t = 0; t < 2; ++t) {
    if (t >= tiles) break;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t col = 2u * c + (i & 1), rr = g + 8u * (i >> 1);
      if (col >= p.batch) continue;
      uint32_t row;
      float v = acc[t][i];
      if (s.fmt == V5_FMT_BF16) {
        if (i >> 1) continue;  // MMA rows 8..15 are empty
        row = it.index * 8u + rr;
      } else if (p.mode == V5_MODE_SWIGLU) {
        row = it.index * 16u + rr;
        v = silu(acc[0][i]) * acc[1][i];
      } else {
        row = (2u * it.index + t) * 16u + rr;
      }
      row += s.out_row0;
      if (p.mode == V5_MODE_ADD) v += __bfloat162float(__ldcg(res + size_t(col) * n + row));
      store_y(y + size_t(col) * n + row, v);
    }
  }
}

// Workspace piece of (block, side, warp): [32 rows][8 columns] fp32.
__device__ __forceinline__ float* piece(const V5Params& p, uint32_t blk, uint32_t side, uint32_t warp) {
  return p.ws + ((size_t(blk) * 2u + side) * W + warp) * 256u;
}

// ---- the kernel ----------------------------------------------------------------------------
template <typename TY>
__device__ __forceinline__ void v5_body(const V5Params& p) {
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ uint32_t last_flag;
  __shared__ __align__(8) uint64_t x_bars[2 * XSLOTS];
  const uint32_t tid = threadIdx.x, warp = tid >> 5, lane = tid & 31u, g = lane >> 2, c = lane & 3u;
  const uint32_t blk = blockIdx.x, ksteps = p.ksteps, k = p.k;
  const uint32_t stages = p.stages, slot = p.slot_bytes, ahead = stages - 1u;
  const uint32_t u0 = p.blk_u0[blk], u1 = p.blk_u0[blk + 1u];
  uint8_t* ring = smem + XSLOTS * XSLOT + warp * stages * slot;
  const uint32_t ring_s = static_cast<uint32_t>(__cvta_generic_to_shared(ring));
  const uint64_t pol = evict_first_policy();

  // weights first: they do not depend on the previous kernel. Cursors advance by counting (no
  // division per unit): unit u is (strip, kstep) = (u / ksteps, u % ksteps).
  const uint32_t strip0 = u0 / ksteps, ks0 = u0 - strip0 * ksteps;
  uint32_t iu = u0, islot = 0, istrip = strip0, iks = ks0;
  Item iitem = item_of(p, strip0, warp);
  auto issue_next = [&]() {
    if (iu < u1) {
      issue(ring_s + islot * slot, iitem, k, iks, lane, pol);
      ++iu;
      islot = islot + 1u == stages ? 0u : islot + 1u;
      if (++iks == ksteps) {
        iks = 0;
        iitem = item_of(p, ++istrip, warp);
      }
    }
    cp_commit();
  };
  for (uint32_t i = 0; i < ahead; ++i) issue_next();
  if (tid < XSLOTS) {
    mbar_init(static_cast<uint32_t>(__cvta_generic_to_shared(x_bars + tid)), (16u * p.batch + 31u) / 32u);  // full
    mbar_init(static_cast<uint32_t>(__cvta_generic_to_shared(x_bars + XSLOTS + tid)), W);                   // empty
  }
  __syncthreads();
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");

  // activations: a ring of XSLOTS slots, one kstep each, with full / empty mbarriers, so warps are
  // never held in lockstep. Producers (16 threads per batch column, each 8 lanes = half of a block
  // jj; warps 0 .. ceil(batch / 2) - 1) store unit j into slot j % XSLOTS at iteration
  // j - XAHEAD - 1, after every warp released the slot's previous unit, with the loads two units
  // ahead of the stores in registers.
  const uint32_t batch = p.batch, n_units = u1 - u0;
  const uint32_t producer_warps = (16u * batch + 31u) / 32u;
  const bool producer = tid < 16u * batch, producer_warp = warp < producer_warps;
  const uint32_t pn = tid >> 4, pjj = (tid >> 1) & 7u, ph = tid & 1u;
  const __nv_bfloat16* xsrc = static_cast<const __nv_bfloat16*>(p.x) + size_t(pn) * k + pjj * 16u + ph * 8u;
  const uint32_t bars = static_cast<uint32_t>(__cvta_generic_to_shared(x_bars));  // full[XSLOTS], empty[XSLOTS]
  uint32_t xks = ks0;  // kstep of the next unit to load
  auto load_x = [&](uint32_t j) -> uint4 {  // called for j = 0, 1, ... in order
    const uint32_t ks = xks;
    xks = xks + 1u == ksteps ? 0u : xks + 1u;
    return producer && j < n_units ? __ldcg(reinterpret_cast<const uint4*>(xsrc + ks * NINFER_V5_KSTEP))
                                   : make_uint4(0, 0, 0, 0);
  };
  auto store_x = [&](uint32_t j, uint4 r) {  // producer warps: unit j into its slot, then arrive on full
    const uint32_t sl = j % XSLOTS;
    if (j >= XSLOTS) mbar_wait(bars + 8u * (XSLOTS + sl), (j / XSLOTS - 1u) & 1u);
    if (producer) {
      uint8_t* d0 = smem + sl * XSLOT + x_piece_offset(pn, 2u * pjj) + 4u * ph;
      uint8_t* d1 = smem + sl * XSLOT + x_piece_offset(pn, 2u * pjj + 1u) + 4u * ph;
      *reinterpret_cast<uint32_t*>(d0) = __byte_perm(r.x, r.z, 0x5410u);      // MMA 0
      *reinterpret_cast<uint32_t*>(d0 + 8) = __byte_perm(r.x, r.z, 0x7632u);  // MMA 1
      *reinterpret_cast<uint32_t*>(d1) = __byte_perm(r.y, r.w, 0x5410u);      // MMA 2
      *reinterpret_cast<uint32_t*>(d1 + 8) = __byte_perm(r.y, r.w, 0x7632u);  // MMA 3
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(bars + 8u * sl);
  };
  uint4 xn1 = make_uint4(0, 0, 0, 0), xn2 = xn1;
  if (producer_warp) {
    for (uint32_t j = 0; j <= XAHEAD; ++j) {
      const uint4 v = load_x(j);
      if (j < n_units) store_x(j, v);
    }
    xn1 = load_x(XAHEAD + 1u);
    xn2 = load_x(XAHEAD + 2u);
  }

  uint32_t cslot = 0, strip = strip0, cks = ks0;
  Item citem = item_of(p, strip0, warp);
  float acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
  const bool has_x = g < batch;
  for (uint32_t i = 0, u = u0; u < u1; ++i, ++u) {
    if (producer_warp && i + XAHEAD + 1u < n_units) {
      store_x(i + XAHEAD + 1u, xn1);
      xn1 = xn2;
      xn2 = load_x(i + XAHEAD + 3u);
    }
    const uint32_t xsl = i % XSLOTS;
    mbar_wait(bars + 8u * xsl, (i / XSLOTS) & 1u);  // activations of unit u staged
    cp_wait_dyn(ahead - 1u);                         // this thread's copies of unit u have landed
    __syncwarp();                                    // ... and every lane's; the slot of u - 1 is free
    issue_next();
    if (citem.valid) {
      const uint8_t* s = ring + cslot * slot;
      const uint8_t* xs = smem + xsl * XSLOT;
#if NINFER_V5_DIAG == 1
      switch (citem.fmt) {
        case V5_FMT_Q4: diag_kstep<4>(s, xs, g, c, has_x, acc); break;
        case V5_FMT_Q5: diag_kstep<5>(s, xs, g, c, has_x, acc); break;
        case V5_FMT_Q6: diag_kstep<6>(s, xs, g, c, has_x, acc); break;
        default: bf16_kstep(s, xs, g, c, has_x, acc[0]); break;
      }
#else
      switch (citem.fmt) {
        case V5_FMT_Q4: q_kstep<4>(s, xs, g, c, has_x, acc); break;
        case V5_FMT_Q5: q_kstep<5>(s, xs, g, c, has_x, acc); break;
        case V5_FMT_Q6: q_kstep<6>(s, xs, g, c, has_x, acc); break;
        default: bf16_kstep(s, xs, g, c, has_x, acc[0]); break;
      }
#endif
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(bars + 8u * (XSLOTS + xsl));  // this warp is done with the slot
    cslot = cslot + 1u == stages ? 0u : cslot + 1u;

    // end of this block's part of the strip: epilogue, or partial sums + last-block reduction
    const bool strip_end = cks + 1u == ksteps || u + 1u == u1;
    if (!strip_end) {
      ++cks;
      continue;
    }
    const uint32_t sbeg = strip * ksteps, send = sbeg + ksteps;
    const uint32_t bfirst = sbeg >= u0 ? blk : v5_owner_of(p, sbeg);
    const uint32_t blast = send <= u1 ? blk : v5_owner_of(p, send - 1u);
    if (bfirst == blast) {
      if (citem.valid) epilogue<TY>(p, citem, g, c, acc);
    } else {
      const uint32_t side = strip0 == strip ? 0u : 1u;  // the block's first strip, or its last
      if (citem.valid) {
        float* dst = piece(p, blk, side, warp);
#pragma unroll
        for (int t = 0; t < 2; ++t)
#pragma unroll
          for (int h = 0; h < 2; ++h)
            if (2u * c < batch)
              *reinterpret_cast<float2*>(dst + (16u * t + g + 8u * h) * 8u + 2u * c) =
                  make_float2(acc[t][2 * h], acc[t][2 * h + 1]);
      }
      __threadfence();
      __syncthreads();
      if (tid == 0) {
        const uint32_t old = atomicAdd(p.cnt + bfirst, 1u);
        last_flag = old == blast - bfirst ? 1u : 0u;
      }
      __syncthreads();
      if (last_flag) {
        __threadfence();
        if (citem.valid) {
          // the strip is the first strip of every block after bfirst (side 0); bfirst's side
          const uint32_t side_first = bfirst == blk ? side : (p.blk_u0[bfirst] >= sbeg ? 0u : 1u);
          float sum[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
          for (uint32_t b0 = bfirst; b0 <= blast; b0 += 4) {
            float part[4][2][4];
#pragma unroll
            for (int j = 0; j < 4; ++j) {  // four pieces' loads in flight at once
              const uint32_t bb = b0 + j;
              const float* src = piece(p, bb, bb == bfirst ? side_first : 0u, warp);
#pragma unroll
              for (int t = 0; t < 2; ++t)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                  float2 v = make_float2(0.f, 0.f);
                  if (bb <= blast && bb != blk && 2u * c < batch)
                    v = __ldcg(reinterpret_cast<const float2*>(src + (16u * t + g + 8u * h) * 8u + 2u * c));
                  part[j][t][2 * h] = bb == blk ? acc[t][2 * h] : v.x;
                  part[j][t][2 * h + 1] = bb == blk ? acc[t][2 * h + 1] : v.y;
                }
            }
#pragma unroll
            for (int j = 0; j < 4; ++j)  // summed in block order, whoever arrives last
#pragma unroll
              for (int t = 0; t < 2; ++t)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                  if (b0 + j <= blast) sum[t][e] = b0 + j == bfirst ? part[j][t][e] : sum[t][e] + part[j][t][e];
          }
          epilogue<TY>(p, citem, g, c, sum);
        }
        if (tid == 0) p.cnt[bfirst] = 0u;  // ready for the next launch
      }
    }
#pragma unroll
    for (int t = 0; t < 2; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[t][i] = 0.f;
    cks = 0;
    if (u + 1u < u1) citem = item_of(p, ++strip, warp);
  }
  cp_wait<0>();
}

}  // namespace

extern "C" __global__ void __launch_bounds__(NINFER_V5_WARPS * 32, NINFER_V5_MIN_BLOCKS) ninfer_qgemv5_ybf16(const __grid_constant__ V5Params p) {
  v5_body<__nv_bfloat16>(p);
}

extern "C" __global__ void __launch_bounds__(NINFER_V5_WARPS * 32, NINFER_V5_MIN_BLOCKS) ninfer_qgemv5_yf32(const __grid_constant__ V5Params p) {
  v5_body<float>(p);
}
