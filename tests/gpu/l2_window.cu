// Whether the small kernels of a decode step can warm L2 with the next projection's weights
// (tests/gpu/check_stream_ceiling.py builds and runs this: `--program l2_window`; CUDA runtime only).
//
// At one request the 27B decode step spends ~0.75 ms of the H200's ~5.8 in latency-bound kernels
// between the projections (norms; the short convolution and the GDN step; the attention prologue,
// split-KV decode and combine), during which HBM reads little more than the next GEMV's ring
// prologue. The weights do not depend on any activation, so a small kernel could ask L2 for the
// next projection's bytes while it runs. This program replays the step as stream_ceiling.cu does
// (read launches at the real sizes, each its own region; spin kernels with the real kernels' grid
// sizes and in-graph times; PDL with the trigger first, as the package launches them) and times
// variants in which the next projection's first bytes are prefetched into L2 during a window:
//   by the window's first kernel (the convolution before a GDN output projection, the prologue
//   before an attention one; with `+ norm`, also the norm before the multi and SwiGLU launches, one
//   block), before or after its griddepcontrol.wait;
//   by the projection's own blocks before their wait (resident early under PDL), after a window
//   only or after every kernel;
//   how: bulk = cp.async.bulk.prefetch.L2 of 16 KiB pieces, one lane per warp; line =
//   prefetch.global.L2 per 128-byte line over every thread; line-last = with evict_last.
// Output: a line per variant (ms per step, against the first variant, no prefetch), two rounds,
// then `json {...}`.
#include <string>
#include <vector>

#include "stream_common.cuh"

namespace {

enum How : int { kNone = 0, kBulk = 1, kLine = 2, kLineLast = 3 };

__device__ __forceinline__ void prefetch_range(const uint8_t* p, uint64_t bytes, int how) {
  if (how == kNone || bytes == 0) return;
  const uint64_t threads = uint64_t(gridDim.x) * blockDim.x;
  const uint64_t t = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (how == kBulk) {
    if ((threadIdx.x & 31u) != 0) return;
    const uint64_t piece = 16384, warps = threads / 32, w = t / 32;
    for (uint64_t off = w * piece; off < bytes; off += warps * piece) {
      const uint32_t n = uint32_t(bytes - off < piece ? bytes - off : piece);
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + off), "r"(n) : "memory");
    }
    return;
  }
  for (uint64_t off = t * 128; off < bytes; off += threads * 128) {
    if (how == kLine)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(p + off));
    else
      asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(p + off));
  }
}

// A latency-bound kernel of the step: every block spins `ns` after the wait (the trigger first, as
// the package's kernels do), and the grid prefetches `pf_bytes` at `pf` before or after the wait.
__global__ void small(uint64_t ns, const uint8_t* pf, uint64_t pf_bytes, int how, int before_wait) {
  gdc_launch();
  if (before_wait) prefetch_range(pf, pf_bytes, how);
  gdc_wait();
  if (!before_wait) prefetch_range(pf, pf_bytes, how);
  uint64_t t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}

// The projections: the trigger first, then a ring-prologue's worth (64 B a thread) before the wait.
// `pf_bytes` > 0: the grid first prefetches the first `pf_bytes` of its own region (the bytes it
// reads first), before the wait: the projection's own resident blocks as the prefetchers.
__global__ void __launch_bounds__(512) read_proj(const uint4* __restrict__ w, uint64_t nvec, uint32_t* sink,
                                                 uint64_t pf_bytes, int how) {
  gdc_launch();
  prefetch_range(reinterpret_cast<const uint8_t*>(w), pf_bytes, how);
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  uint32_t acc = 0u;
  bool waited = false;
  for (; i + 3 * stride < nvec; i += 4 * stride) {
    const uint4 a = ld_stream(w + i), b = ld_stream(w + i + stride), c = ld_stream(w + i + 2 * stride),
                d = ld_stream(w + i + 3 * stride);
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    if (!waited) gdc_wait(), waited = true;
  }
  for (; i < nvec; i += stride) {
    const uint4 a = ld_stream(w + i);
    acc ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  if (!waited) gdc_wait();
  if (acc == 0x9e3779b9u) sink[0] = acc;
}

struct Launch {
  bool read;
  uint64_t bytes;   // read: weight bytes; small: nanoseconds
  int blocks;       // small: its grid (the real kernel's programs at one request)
  int window;       // small: 0 none, 1 first of a window before an output projection, 2 a norm before a GEMV
  uint64_t off;     // read: its region
};

// The 27B step at one request, small kernels at their H200 in-graph advance (trace_27b.py).
std::vector<Launch> step() {
  const double MB = 1e6;
  std::vector<Launch> s;
  uint64_t off = 0;
  auto rd = [&](double mb) {
    const uint64_t b = uint64_t(mb * MB) / 16 * 16;
    s.push_back({true, b, 0, 0, off});
    off += b;
  };
  auto sp = [&](double us, int blocks, int window) { s.push_back({false, uint64_t(us * 1e3), blocks, window, 0}); };
  for (int l = 0; l < 64; ++l) {
    const bool attn = l % 4 == 3;
    sp(2.2, 1, 2);                                   // input RMS norm (one block a row)
    rd(attn ? 43.6 : 52.4);                          // multi
    if (attn) {
      sp(1.9, 32, 1), sp(6.1, 96, 0), sp(3.3, 24, 0);  // prologue, split-KV decode, combine
    } else {
      sp(1.3, 40, 1), sp(4.5, 48, 0);                // short convolution, GDN step
    }
    rd(20.6);                                        // output projection + residual
    sp(2.2, 1, 2);                                   // post-attention RMS norm
    rd(94.7);                                        // gate + up + SwiGLU
    rd(58.5);                                        // down + residual
  }
  sp(2.2, 1, 0);
  rd(993.3);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = reps_argument(argc, argv, 9, "l2_window");
  if (reps < 0) return 2;
  const std::vector<Launch> seq = step();
  uint64_t total = 0;
  for (const Launch& l : seq)
    if (l.read) total += l.bytes;
  const Rig rig = make_rig(total + 4096);

  struct V {
    std::string name;
    int where;  // 1: windows before output projections (their first kernel); 2: the norms; 4: the
                // projection's own blocks before their wait (after a window; 8: after any kernel)
    int how, before;
    double budget_mb;
  };
  auto hn = [](int how) { return how == kBulk ? "bulk" : how == kLine ? "line" : "line-last"; };
  std::vector<V> vs = {{"no prefetch", 0, kNone, 0, 0}};
  for (int how : {kBulk, kLine, kLineLast})
    for (int before : {0, 1})
      vs.push_back({std::string("window kernel, out 20 MB, ") + hn(how) + (before ? ", before wait" : ", after wait"), 1,
                    how, before, 20.6});
  for (double mb : {8.0, 14.0})
    vs.push_back({std::string("window kernel, out ") + std::to_string(int(mb)) + " MB, bulk, after wait", 1, kBulk, 0,
                  mb});
  for (double mb : {4.0, 8.0})
    vs.push_back({std::string("window kernel, out 20 MB + norm ") + std::to_string(int(mb)) + " MB, bulk", 3, kBulk, 0,
                  mb});
  for (int how : {kBulk, kLine})
    for (double mb : {8.0, 14.0, 20.6})
      vs.push_back({std::string("projection itself after a window, ") + std::to_string(int(mb)) + " MB, " + hn(how), 4,
                    how, 1, mb});
  for (double mb : {4.0, 8.0, 16.0})
    vs.push_back({std::string("every projection itself, ") + std::to_string(int(mb)) + " MB, bulk", 8, kBulk, 1, mb});
  vs.push_back({"no prefetch (again)", 0, kNone, 0, 0});

  auto enqueue = [&](const V& v) {
    for (size_t i = 0; i < seq.size(); ++i) {
      const Launch& l = seq[i];
      cudaLaunchConfig_t cfg = {};
      cudaLaunchAttribute attr[1];
      attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attr[0].val.programmaticStreamSerializationAllowed = 1;
      cfg.stream = rig.st, cfg.attrs = attr, cfg.numAttrs = 1;
      if (l.read) {
        const bool after_window = i > 0 && !seq[i - 1].read && seq[i - 1].window == 0 && seq[i - 1].blocks > 1;
        uint64_t pf = 0;
        if ((v.where & 8) || ((v.where & 4) && after_window)) pf = std::min(l.bytes, uint64_t(v.budget_mb * 1e6)) / 16 * 16;
        cfg.gridDim = dim3(rig.sms * 4), cfg.blockDim = dim3(512);
        CK(cudaLaunchKernelEx(&cfg, read_proj, reinterpret_cast<const uint4*>(rig.buf + l.off), l.bytes / 16, rig.sink, pf,
                              pf ? v.how : int(kNone)));
        continue;
      }
      const Launch* next = nullptr;  // the projection after this window
      for (size_t j = i + 1; j < seq.size() && !next; ++j)
        if (seq[j].read) next = &seq[j];
      uint64_t pf = 0;
      if (next && l.window == 1 && (v.where & 1)) pf = v.where == 3 ? next->bytes : uint64_t(v.budget_mb * 1e6);
      if (next && l.window == 2 && (v.where & 2)) pf = uint64_t(v.budget_mb * 1e6);
      pf = std::min(pf, next ? next->bytes : 0) / 16 * 16;
      cfg.gridDim = dim3(l.blocks), cfg.blockDim = dim3(128);
      CK(cudaLaunchKernelEx(&cfg, small, l.bytes, static_cast<const uint8_t*>(next ? rig.buf + next->off : rig.buf), pf,
                            pf ? v.how : int(kNone), v.before));
    }
  };
  std::printf("device %s, %d SMs, L2 %d MB; step: %.2f GB in read launches with small kernels between\n", rig.prop.name, rig.sms,
              rig.prop.l2CacheSize >> 20, total / 1e9);
  std::printf("%-52s %9s %9s\n", "variant", "ms/step", "vs none");
  std::string json = "{\"device\": \"" + std::string(rig.prop.name) + "\", \"variants\": {";
  double none = 0;
  for (int round = 0; round < 2; ++round)
    for (size_t k = 0; k < vs.size(); ++k) {
      const V& v = vs[k];
      const double t = graph_median_ms(rig.st, rig.e0, rig.e1, reps, [&] { enqueue(v); });
      if (v.how == kNone) none = t;
      std::printf("%-52s %9.3f %+8.2f%%%s\n", v.name.c_str(), t, 100.0 * (t / none - 1.0), round ? " (round 2)" : "");
      json += std::string(round || k ? ", " : "") + "\"" + v.name + (round ? " r2" : "") + "\": " + std::to_string(t);
    }
  std::printf("json %s}}\n", json.c_str());
  return 0;
}
