// The streaming ceiling of a decode step built from one launch per projection
// (tests/gpu/check_stream_ceiling.py builds and runs this; a standalone program, CUDA runtime only).
//
// A Qwen3.6-27B decode step reads 15.39 GB of weights in 257 projection launches of 20-95 MB (and
// one of 993 MB), with ~5 small latency-bound kernels per layer between them (norms, convolution,
// the GDN step, attention). This program replays that launch sequence with kernels that only read
// (the weight bytes at the sizes of the real launches, each launch its own region, 15.4 GB in all),
// in one CUDA graph, and times it, so that the step time of the per-launch structure can be told
// apart from the time our GEMVs' math and rings add. Variants:
//   * the read kernels alone, or with spin kernels of the small kernels' durations between them
//     (one block each, PDL-chained like the real ones);
//   * PDL off; PDL with every read after `griddepcontrol.wait` ("late": no overlap of a launch's
//     stream with its predecessor); PDL with the first `ahead` bytes of each thread's share read
//     before the wait (as a GEMV's ring prologue does) and the rest after; PDL with every read
//     before the wait ("early": the upper bound of the overlap, which no GEMV can have, since its
//     math needs the previous kernel's output);
//   * one launch reading all 15.39 GB (the streaming ceiling itself);
//   * the chain with no bytes to read: what the launches and their dependencies cost alone.
// Output: one line per variant (ms per step, GB/s, fraction of the single-launch ceiling), then
// `json {...}` with the same numbers.
#include <string>
#include <vector>

#include "stream_common.cuh"

// A small latency-bound kernel: one block that waits for its predecessor and spins `ns`.
__global__ void spin(uint64_t ns, int mode) {
  if (mode != 0) {
    gdc_wait();
    gdc_launch();
  }
  uint64_t t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}

struct Launch {
  bool read;
  uint64_t bytes;  // read: the weight bytes; spin: nanoseconds
};

// The 27B step: 64 layers (every 4th full attention), then the final norm and the output head.
// Small kernels at their in-graph durations (docs/performance.md, per-kernel breakdown).
static std::vector<Launch> step_launches(bool with_small) {
  const double MB = 1e6;
  std::vector<Launch> s;
  auto rd = [&](double mb) { s.push_back({true, uint64_t(mb * MB) / 16 * 16}); };
  auto sp = [&](double us) {
    if (with_small) s.push_back({false, uint64_t(us * 1e3)});
  };
  for (int l = 0; l < 64; ++l) {
    const bool attn = l % 4 == 3;
    sp(2.7);                      // input RMS norm
    rd(attn ? 43.6 : 53.4);       // multi: q, k, v (, z / gate), gates
    if (attn) {
      sp(3.0), sp(6.0), sp(3.0);  // prologue (norms, rope, cache write), split-KV decode, gated combine
    } else {
      sp(3.0), sp(7.0);           // short convolution, fused GDN step
    }
    rd(20.6);                     // output projection + residual
    sp(2.7);                      // post-attention RMS norm
    rd(94.7);                     // gate + up + SwiGLU
    rd(58.5);                     // down + residual
  }
  sp(2.7);
  rd(993.3);                      // output head
  return s;
}

int main(int argc, char** argv) {
  const int reps = reps_argument(argc, argv, 7, "stream_ceiling");
  if (reps < 0) return 2;
  std::vector<Launch> bare = step_launches(false), full = step_launches(true);
  uint64_t total = 0;
  for (const Launch& l : bare) total += l.bytes;
  const Rig rig = make_rig(total + 4096);
  const cudaDeviceProp& prop = rig.prop;
  const int sms = rig.sms;
  uint8_t* const buf = rig.buf;
  uint32_t* const sink = rig.sink;
  const cudaStream_t st = rig.st;

  int blocks = sms * 4;
  const int threads = 512;  // 4 blocks per SM: 2,048 threads, 64 B in flight each
  auto launch = [&](const Launch& l, uint64_t off, int mode, uint32_t ahead) {
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.stream = st;
    cfg.attrs = attr;
    cfg.numAttrs = mode != 0 ? 1 : 0;
    if (l.read) {
      cfg.gridDim = dim3(blocks), cfg.blockDim = dim3(threads);
      CK(cudaLaunchKernelEx(&cfg, read_weights, reinterpret_cast<const uint4*>(buf + off), l.bytes / 16, sink,
                            mode, ahead));
    } else {
      cfg.gridDim = dim3(1), cfg.blockDim = dim3(32);
      CK(cudaLaunchKernelEx(&cfg, spin, l.bytes, mode));
    }
  };
  // median ms of one graph replay of `seq`
  auto time_seq = [&](const std::vector<Launch>& seq, int mode, uint32_t ahead) {
    return graph_median_ms(st, rig.e0, rig.e1, reps, [&] {
      uint64_t off = 0;
      for (const Launch& l : seq) {
        launch(l, off, mode, ahead);
        if (l.read) off += l.bytes;
      }
    });
  };

  const double one = time_seq({{true, total}}, 0, 0);
  double spins_ns = 0;
  for (const Launch& l : full)
    if (!l.read) spins_ns += double(l.bytes);
  std::printf("device %s, %d SMs; step: %zu read launches, %.2f GB; %zu small kernels, %.2f ms of spin\n", prop.name,
              sms, bare.size(), total / 1e9, full.size() - bare.size(), spins_ns / 1e6);
  std::printf("%-52s %9s %9s %9s\n", "variant", "ms/step", "GB/s", "of one");
  std::printf("%-52s %9.3f %9.0f %8.1f%%\n", "one launch, all weights", one, total / one / 1e6, 100.0);
  std::string json = "{\"device\": \"" + std::string(prop.name) + "\", \"bytes\": " + std::to_string(total) +
                     ", \"one_launch_ms\": " + std::to_string(one) + ", \"variants\": {";
  struct V {
    const char* name;
    bool small;
    int mode;
    uint32_t ahead;
  };
  const V vs[] = {
      {"reads only, no PDL", false, 0, 0},       {"reads only, PDL late", false, 1, 0},
      {"reads only, PDL ahead 1 (64 B/thread)", false, 2, 1}, {"reads only, PDL ahead 2", false, 2, 2},
      {"reads only, PDL early", false, 3, 0},    {"with small kernels, no PDL", true, 0, 0},
      {"with small kernels, PDL late", true, 1, 0}, {"with small kernels, PDL ahead 1", true, 2, 1},
      {"with small kernels, PDL ahead 2", true, 2, 2}, {"with small kernels, PDL early", true, 3, 0},
  };
  bool first = true;
  for (int bps : {4, 2, 1}) {  // read blocks of 512 threads per SM
    blocks = sms * bps;
    for (const V& v : vs) {
      const double t = time_seq(v.small ? full : bare, v.mode, v.ahead);
      const std::string name = std::string(v.name) + ", " + std::to_string(bps) + " blocks/SM";
      std::printf("%-52s %9.3f %9.0f %8.1f%%\n", name.c_str(), t, total / t / 1e6, 100.0 * one / t);
      json += std::string(first ? "" : ", ") + "\"" + name + "\": " + std::to_string(t);
      first = false;
    }
  }
  // The chain without its bytes: the same launches with 0 bytes to read (each read launch only waits
  // for its predecessor), the spin kernels alone, and both: what the launch dependencies cost.
  blocks = sms * 4;
  std::vector<Launch> no_bytes = full, empty_reads = bare, spins;
  for (Launch& l : no_bytes)
    if (l.read) l.bytes = 0;
  for (Launch& l : empty_reads) l.bytes = 0;
  for (const Launch& l : full)
    if (!l.read) spins.push_back(l);
  struct E {
    const char* name;
    const std::vector<Launch>* seq;
  };
  const E es[] = {{"no bytes: empty read launches and spin kernels", &no_bytes},
                  {"no bytes: empty read launches alone", &empty_reads},
                  {"no bytes: spin kernels alone", &spins}};
  for (const E& e : es) {
    for (int mode : {0, 1}) {
      const double t = time_seq(*e.seq, mode, 0);
      const std::string name = std::string(e.name) + (mode ? ", PDL" : ", no PDL");
      std::printf("%-52s %9.3f ms, %5.2f us per launch (%zu launches)\n", name.c_str(), t, 1e3 * t / e.seq->size(),
                  e.seq->size());
      json += ", \"" + name + "\": " + std::to_string(t);
    }
  }
  std::printf("json %s}}\n", json.c_str());
  return 0;
}
