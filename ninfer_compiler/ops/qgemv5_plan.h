// Decode GEMV v5 (qgemv5_cuda.cu): the launch parameter block and the work split, shared by the
// kernel (nvcc) and its launcher (qgemv5_host.cc, plain C++), so both sides compute the same
// partition from the same code.
//
// Work model. One launch computes up to NINFER_V5_MAX_OUTS outputs from up to NINFER_V5_MAX_SEGS
// weight *segments* that share K (the activations). A segment's rows are cut into warp *items*
// (grouped-int: two 16-row MMA tiles; bf16: 8 rows; swiglu: the gate tile and the up tile of the
// same 16 output rows), items into *strips* of NINFER_V5_WARPS items (one per warp of a block),
// and K into *ksteps* of 128 lanes. A *unit* is (strip, kstep); units are numbered strip-major
// over all segments (unit = strip * ksteps + kstep), and each has a cost: the weight bytes its
// strip reads per kstep. The grid is persistent (at most one block per SM); block b owns the
// units whose cost prefix p satisfies floor(p * nblk / total) == b, i.e. an equal share of the
// bytes (stream-K). A strip whose units belong to several blocks is reduced by the last of them
// to arrive (a counter per strip, indexed by its first block), summing the blocks' partial sums
// in block order, so the result does not depend on timing.
#ifndef NINFER_QGEMV5_PLAN_H_
#define NINFER_QGEMV5_PLAN_H_
#include <stdint.h>

#if defined(__CUDACC__)
#define NINFER_V5_HD __host__ __device__ __forceinline__
#else
#define NINFER_V5_HD inline
#endif

#define NINFER_V5_MAX_SEGS 8
#define NINFER_V5_MAX_OUTS 8
#ifndef NINFER_V5_WARPS
#define NINFER_V5_WARPS 8      // warps per block = items per strip
#endif
#ifndef NINFER_V5_MIN_BLOCKS
#define NINFER_V5_MIN_BLOCKS 2  // blocks per SM the registers must allow (2: the next PDL launch fits beside)
#endif
#define NINFER_V5_KSTEP 128    // K lanes per kstep (two 64-lane groups)
#define NINFER_V5_XSLOT 2048   // one kstep of staged activations: 8 columns x 16 pieces x 16 B
#ifndef NINFER_V5_XSLOTS
#define NINFER_V5_XSLOTS 4     // staged-activation ring depth (>= 3)
#endif
#define NINFER_V5_MIN_UNITS 3  // units per block at least (fewer blocks, fewer split pieces, for tiny launches)
#define NINFER_V5_MAX_STAGES 16
#define NINFER_V5_MAX_BLOCKS 344  // grid limit (two blocks per SM on GPUs of up to 172 SMs)

enum { V5_FMT_Q4 = 4, V5_FMT_Q5 = 5, V5_FMT_Q6 = 6, V5_FMT_BF16 = 16 };
enum { V5_MODE_PLAIN = 0, V5_MODE_SWIGLU = 1, V5_MODE_ADD = 2 };

// One weight (or, in swiglu mode, the gate/up pair: index 1 is the up weight).
struct V5Segment {
  const void* base[2];
  const void* high[2];
  const void* scales[2];
  uint64_t cost0;      // cost prefix at the segment's first unit
  uint32_t fmt;        // V5_FMT_*
  uint32_t rows;       // weight rows (swiglu: of each of gate and up)
  uint32_t items;      // warp items
  uint32_t strip0;     // global index of the segment's first strip
  uint32_t strips;
  uint32_t full_cost;  // bytes per kstep of a strip of NINFER_V5_WARPS items
  uint32_t last_cost;  // bytes per kstep of the segment's last strip
  uint32_t out;        // output index
  uint32_t out_row0;   // first row of this segment in its output
  uint32_t pad;
};

struct V5Params {
  const void* x;         // bf16 [batch, k]
  const void* residual;  // bf16 [batch, y_rows[0]] (add mode)
  void* y[NINFER_V5_MAX_OUTS];
  float* ws;             // partial sums: [nblk][2 sides][warps][32 rows][8 columns]
  uint32_t* cnt;         // arrival counters, [nblk], zero between launches
  uint64_t total_cost;
  uint32_t y_rows[NINFER_V5_MAX_OUTS];
  uint32_t k, ksteps, batch, nblk, nseg, mode, stages, slot_bytes, units, y_f32;
  V5Segment seg[NINFER_V5_MAX_SEGS];
  uint32_t blk_u0[NINFER_V5_MAX_BLOCKS + 1];  // v5_first_unit of every block (and units), from the launcher
};

// Bytes one row of a weight contributes per kstep (base + high + scales; bf16: the row slice).
NINFER_V5_HD uint32_t v5_row_bytes(uint32_t fmt) {
  return fmt == V5_FMT_Q4 ? 68u : fmt == V5_FMT_Q5 ? 84u : fmt == V5_FMT_Q6 ? 100u : 256u;
}

// Ring slot bytes of one warp item's kstep for `fmt` (the stage layout in qgemv5_cuda.cu).
NINFER_V5_HD uint32_t v5_stage_bytes(uint32_t fmt) {
  return fmt == V5_FMT_BF16 ? 8u * 256u : 32u * v5_row_bytes(fmt);
}

// Rows an item covers in the output, and the weight rows it reads (swiglu: each of gate and up).
NINFER_V5_HD uint32_t v5_item_rows(uint32_t fmt, uint32_t mode) {
  return fmt == V5_FMT_BF16 ? 8u : mode == V5_MODE_SWIGLU ? 16u : 32u;
}

// Weight bytes per kstep of item `i` of segment `s` (the last item may hold one tile only).
NINFER_V5_HD uint32_t v5_item_cost(const V5Segment& s, uint32_t mode, uint32_t i) {
  if (s.fmt == V5_FMT_BF16) return 8u * 256u;
  if (mode == V5_MODE_SWIGLU) return 32u * v5_row_bytes(s.fmt);
  const uint32_t rows = s.rows - 32u * i >= 32u ? 32u : 16u;
  return rows * v5_row_bytes(s.fmt);
}

NINFER_V5_HD uint32_t v5_seg_of_strip(const V5Params& p, uint32_t strip) {
  uint32_t s = 0;
  while (s + 1 < p.nseg && strip >= p.seg[s + 1].strip0) ++s;
  return s;
}

// Cost prefix at the start of unit `u`.
NINFER_V5_HD uint64_t v5_prefix(const V5Params& p, uint32_t u) {
  if (u >= p.units) return p.total_cost;
  const uint32_t strip = u / p.ksteps, ks = u % p.ksteps;
  const V5Segment& s = p.seg[v5_seg_of_strip(p, strip)];
  const uint32_t local = strip - s.strip0;
  return s.cost0 + uint64_t(local) * p.ksteps * s.full_cost + uint64_t(ks) * (local + 1 == s.strips ? s.last_cost : s.full_cost);
}

// The block that owns unit `u`.
NINFER_V5_HD uint32_t v5_owner(const V5Params& p, uint32_t u) {
  return static_cast<uint32_t>(v5_prefix(p, u) * p.nblk / p.total_cost);
}

NINFER_V5_HD uint64_t v5_ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

// The block owning unit u from the launcher's table (what the kernel uses: no 64-bit division).
NINFER_V5_HD uint32_t v5_owner_of(const V5Params& p, uint32_t u) {
  uint32_t lo = 0, hi = p.nblk;  // blk_u0[lo] <= u < blk_u0[hi]
  while (hi - lo > 1) {
    const uint32_t mid = (lo + hi) / 2;
    if (p.blk_u0[mid] <= u) lo = mid;
    else hi = mid;
  }
  return lo;
}

// The first unit of block `b` (p.units for b == nblk): the first u with prefix(u) * nblk >= b * total.
NINFER_V5_HD uint32_t v5_first_unit(const V5Params& p, uint32_t b) {
  if (b >= p.nblk) return p.units;
  const uint64_t target = v5_ceil_div(uint64_t(b) * p.total_cost, p.nblk);  // smallest prefix allowed
  for (uint32_t i = 0; i < p.nseg; ++i) {
    const V5Segment& s = p.seg[i];
    const uint64_t full = uint64_t(s.strips - 1) * p.ksteps * s.full_cost;
    const uint64_t end = s.cost0 + full + uint64_t(p.ksteps) * s.last_cost;
    if (target > end - s.last_cost) continue;  // past this segment's last unit start
    uint64_t local = 0;
    if (target > s.cost0) {
      const uint64_t d = target - s.cost0;
      local = d <= full ? v5_ceil_div(d, s.full_cost)
                        : uint64_t(s.strips - 1) * p.ksteps + v5_ceil_div(d - full, s.last_cost);
    }
    return s.strip0 * p.ksteps + static_cast<uint32_t>(local);
  }
  return p.units;
}

#endif  // NINFER_QGEMV5_PLAN_H_
