// How fast one decode projection's weight bytes stream at the v4 GEMV's launch geometry, by copy
// mechanism (tests/gpu/check_copy_geometry.py builds and runs this; CUDA runtime only).
//
// The v4 decode GEMV (ops/qgemv_cuda.cu) gives each warp a 16-row tile and a K range, and streams
// its stages (128 bytes of each of the 16 rows per 256 k) through a per-warp shared-memory ring
// with 16-byte cp.async per lane. Its loads-only build reaches only 58-70% of the read ceiling on
// the 27B's mid-size projections, and deeper rings made that worse. This program reads the same
// bytes in the same pattern (base plane only: N rows of K / 2 bytes; tiles, K split and warps per
// block as the launcher picks them) with no math, by:
//   ring S    per-lane 16-byte cp.async into a per-warp ring of S stages (v4's copy path);
//   regs      the same pieces as plain 16-byte loads into registers, one stage ahead;
//   tma-row S one 128-byte cp.async.bulk per row and stage (16 per stage, issued by 16 lanes),
//             completing on an mbarrier per ring slot;
//   tma-blk S the stage as one 2,048-byte cp.async.bulk (a layout with each warp's stage
//             contiguous: what a repacked weight plane would allow);
//   grid      a grid-stride read of the same bytes, 4 blocks of 512 threads per SM (the ceiling).
// Each is timed as a chain of launches in one CUDA graph with PDL (the first stages issued before
// `griddepcontrol.wait`, as v4 does), each launch reading its own copy of the plane (L2 holds none).
// Output: a line per shape and mechanism (us per launch, GB/s, fraction of the grid read), then
// `json {...}`.
#include <string>

#include "stream_common.cuh"

namespace {

__device__ __forceinline__ void cp16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n .reg .pred p;\n"
      "W%=: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      " @!p bra W%=;\n}" ::"r"(bar),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void bulk(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
__device__ __forceinline__ void fence_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// What a warp streams: its tile's 16 rows, K units [u0, u1) of 128 bytes each (256 k at 4 bits).
struct Warp {
  const uint8_t* rows;  // row 0 of the tile at unit 0
  uint32_t u0, n, stride;
};

__device__ __forceinline__ Warp warp_share(const uint8_t* base, uint32_t n_rows, uint32_t k, uint32_t ks) {
  const uint32_t warps = blockDim.x >> 5, warp = threadIdx.x >> 5, slots = warps / ks;
  const uint32_t kpart = warp / slots, slot = warp % slots, tile = blockIdx.x * slots + slot;
  const uint32_t units = k / 256, u0 = kpart * units / ks, u1 = (kpart + 1) * units / ks;
  Warp w;
  w.stride = k / 2;
  w.rows = base + size_t(tile) * 16 * w.stride;
  w.u0 = u0;
  w.n = tile * 16 < n_rows ? u1 - u0 : 0u;
  return w;
}

// ring: v4's copy path (lane l: pieces (row 4j + l / 8, piece l % 8), j = 0..3), S stages
template <int S>
__global__ void ring(const uint8_t* base, uint32_t n_rows, uint32_t k, uint32_t ks, uint32_t* sink) {
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  const Warp w = warp_share(base, n_rows, k, ks);
  uint8_t* mine = smem + warp * S * 2048u;
  const uint32_t ring_s = static_cast<uint32_t>(__cvta_generic_to_shared(mine));
  const uint8_t* src = w.rows + size_t(lane >> 3) * w.stride + w.u0 * 128u + (lane & 7u) * 16u;
  const uint32_t doff = (lane >> 3) * 128u + (lane & 7u) * 16u;
  auto copy = [&](uint32_t slot, uint32_t u) {
    for (uint32_t j = 0; j < 4; ++j) cp16(ring_s + slot * 2048u + doff + j * 512u, src + size_t(4 * j) * w.stride + u * 128u);
  };
  for (uint32_t i = 0; i + 1 < S; ++i) {
    if (i < w.n) copy(i, i);
    cp_commit();
  }
  gdc_wait();
  gdc_launch();
  uint32_t acc = 0;
  for (uint32_t i = 0; i < w.n; ++i) {
    cp_wait<S - 2>();
    __syncwarp();
    if (i + S - 1 < w.n) copy((i + S - 1) % S, i + S - 1);
    cp_commit();
    const uint4 v = *reinterpret_cast<const uint4*>(mine + (i % S) * 2048u + ((lane * 16u + 528u * (i & 3u)) & 2047u));
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  cp_wait<0>();
  if (acc == 0x9e3779b9u) sink[0] = acc;
}

// regs: the same pieces as plain loads, the next stage's in flight while this one is consumed
__global__ void regs(const uint8_t* base, uint32_t n_rows, uint32_t k, uint32_t ks, uint32_t* sink) {
  const uint32_t lane = threadIdx.x & 31u;
  const Warp w = warp_share(base, n_rows, k, ks);
  const uint8_t* src = w.rows + size_t(lane >> 3) * w.stride + w.u0 * 128u + (lane & 7u) * 16u;
  uint4 cur[4], nxt[4];
  auto load = [&](uint4* d, uint32_t u) {
    for (uint32_t j = 0; j < 4; ++j) d[j] = ld_stream(reinterpret_cast<const uint4*>(src + size_t(4 * j) * w.stride + u * 128u));
  };
  if (w.n > 0) load(cur, 0);
  gdc_wait();
  gdc_launch();
  uint32_t acc = 0;
  for (uint32_t i = 0; i < w.n; ++i) {
    if (i + 1 < w.n) load(nxt, i + 1);
    for (int j = 0; j < 4; ++j) acc ^= cur[j].x ^ cur[j].y ^ cur[j].z ^ cur[j].w;
    for (int j = 0; j < 4; ++j) cur[j] = nxt[j];
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;
}

// tma: S slots per warp, each with an mbarrier; ROW: 16 bulk copies of 128 B per stage (the row
// layout), else one of 2,048 B (each warp's stages contiguous: the plane read as tile-major blocks)
template <int S, bool ROW>
__global__ void tma(const uint8_t* base, uint32_t n_rows, uint32_t k, uint32_t ks, uint32_t* sink) {
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const Warp w = warp_share(base, n_rows, k, ks);
  uint8_t* mine = smem + warp * S * 2048u;
  const uint32_t ring_s = static_cast<uint32_t>(__cvta_generic_to_shared(mine));
  const uint32_t bars = static_cast<uint32_t>(__cvta_generic_to_shared(smem + warps * S * 2048u)) + warp * S * 8u;
  // tile-major blocks: warp's unit u at (tile, u) * 2,048 (same bytes, same tile -> warp map)
  const uint8_t* blk = w.rows + size_t(w.u0) * 2048u;
  if (lane == 0)
    for (uint32_t s = 0; s < S; ++s) mbar_init(bars + 8u * s, 1);
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  __syncwarp();
  auto issue = [&](uint32_t slot, uint32_t u) {
    if (lane == 0) mbar_expect(bars + 8u * slot, 2048u);
    __syncwarp();
    if (ROW) {
      if (lane < 16) bulk(ring_s + slot * 2048u + lane * 128u, w.rows + size_t(lane) * w.stride + (w.u0 + u) * 128u, 128u,
                          bars + 8u * slot);
    } else if (lane == 0) {
      bulk(ring_s + slot * 2048u, blk + size_t(u) * 2048u, 2048u, bars + 8u * slot);
    }
  };
  for (uint32_t i = 0; i + 1 < S; ++i)
    if (i < w.n) issue(i, i);
  gdc_wait();
  gdc_launch();
  uint32_t acc = 0;
  for (uint32_t i = 0; i < w.n; ++i) {
    const uint32_t slot = i % S;
    mbar_wait(bars + 8u * slot, (i / S) & 1u);
    const uint4 v = *reinterpret_cast<const uint4*>(mine + slot * 2048u + ((lane * 16u + 528u * (i & 3u)) & 2047u));
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
    __syncwarp();  // every lane has read slot (i - 1) % S, the one refilled next
    if (i + S - 1 < w.n) {
      fence_async();  // generic reads of the slot before the async proxy writes it again
      issue((i + S - 1) % S, i + S - 1);
    }
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;
}

using Kernel = void (*)(const uint8_t*, uint32_t, uint32_t, uint32_t, uint32_t*);

struct Mech {
  const char* name;
  Kernel fn;
  int stages;  // shared memory: stages x 2,048 B per warp (+ 8 B per stage for the mbarriers)
  bool bars;
};

struct Shape {
  const char* name;
  uint32_t n, k, ks, warps;  // as qgemv_host.cc picks them (K split, warps per block)
  uint32_t per_sm;           // v4's resident blocks per SM at that size (80 registers per thread)
};

}  // namespace

int main(int argc, char** argv) {
  const int reps = reps_argument(argc, argv, 9, "copy_geometry");
  if (reps < 0) return 2;
  const Shape shapes[] = {
      {"q5 out 5120x6144 (base plane)", 5120, 6144, 4, 4, 6},
      {"q5 down 5120x17408", 5120, 17408, 8, 8, 3},
      {"q5 v/z 6144x5120", 6144, 5120, 4, 4, 6},
      {"q4 gate+up 34816x5120", 34816, 5120, 4, 8, 3},
  };
  const Mech mechs[] = {
      {"ring 2", ring<2>, 2, false},          {"ring 3", ring<3>, 3, false},
      {"ring 4", ring<4>, 4, false},          {"regs", regs, 0, false},
      {"tma-row 3", tma<3, true>, 3, true},   {"tma-row 6", tma<6, true>, 6, true},
      {"tma-blk 3", tma<3, false>, 3, true},  {"tma-blk 6", tma<6, false>, 6, true},
  };
  uint64_t most = 0;
  for (const Shape& s : shapes) most = std::max<uint64_t>(most, uint64_t(s.n) * s.k / 2);
  const int copies = int(std::max<uint64_t>(4, (600ull << 20) / most + 1));
  const Rig rig = make_rig(most * copies);
  const cudaDeviceProp& prop = rig.prop;
  const int sms = rig.sms;
  uint8_t* const buf = rig.buf;
  uint32_t* const sink = rig.sink;
  const cudaStream_t st = rig.st;
  // every mechanism runs at v4's residency: dynamic shared memory padded to 1 / per_sm of the SM's
  const int sm_smem = int(prop.sharedMemPerMultiprocessor) - 1024 * 8;  // (the per-block reserve, generously)
  for (const Mech& m : mechs) CK(cudaFuncSetAttribute(m.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, int(prop.sharedMemPerBlockOptin)));

  // median us per launch of a graph of `copies` PDL-chained launches, each on its own copy
  auto time_chain = [&](auto&& launch_one) {
    return 1e3 * graph_median_ms(st, rig.e0, rig.e1, reps, [&] {
             for (int c = 0; c < copies; ++c) launch_one(c);
           }) / copies;
  };
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;

  std::printf("device %s, %d SMs; %d launches per graph, each on its own copy\n", prop.name, sms, copies);
  std::printf("%-34s %-10s %9s %9s %8s\n", "shape", "mechanism", "us/launch", "GB/s", "of grid");
  std::string json = "{\"device\": \"" + std::string(prop.name) + "\", \"shapes\": {";
  for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); ++si) {
    const Shape& s = shapes[si];
    const uint64_t bytes = uint64_t(s.n) * s.k / 2;
    const uint32_t slots = s.warps / s.ks, tiles = s.n / 16, grid = (tiles + slots - 1) / slots;
    const double ceil_us = time_chain([&](int c) {
      cudaLaunchConfig_t cfg = {};
      cfg.stream = st, cfg.attrs = attr, cfg.numAttrs = 1;
      cfg.gridDim = dim3(sms * 4), cfg.blockDim = dim3(512);
      CK(cudaLaunchKernelEx(&cfg, read_weights, reinterpret_cast<const uint4*>(buf + size_t(c) * most), bytes / 16, sink,
                            1, 0u));  // PDL, every read after the wait
    });
    std::printf("%-34s %-10s %9.2f %9.0f %7.1f%%\n", s.name, "grid", ceil_us, bytes / ceil_us / 1e3, 100.0);
    json += std::string(si ? ", " : "") + "\"" + s.name + "\": {\"bytes\": " + std::to_string(bytes) +
            ", \"grid\": " + std::to_string(ceil_us);
    for (const Mech& m : mechs) {
      const size_t need = m.stages > 0 ? size_t(s.warps) * m.stages * (2048 + (m.bars ? 8 : 0)) : 0;
      const size_t smem = std::max(need, size_t(sm_smem / int(s.per_sm) / 1024 * 1024));
      const double us = time_chain([&](int c) {
        cudaLaunchConfig_t cfg = {};
        cfg.stream = st, cfg.attrs = attr, cfg.numAttrs = 1;
        cfg.gridDim = dim3(grid), cfg.blockDim = dim3(32 * s.warps), cfg.dynamicSmemBytes = smem;
        CK(cudaLaunchKernelEx(&cfg, m.fn, static_cast<const uint8_t*>(buf + size_t(c) * most), s.n, s.k, s.ks, sink));
      });
      std::printf("%-34s %-10s %9.2f %9.0f %7.1f%%\n", s.name, m.name, us, bytes / us / 1e3, 100.0 * ceil_us / us);
      json += ", \"" + std::string(m.name) + "\": " + std::to_string(us);
    }
    json += "}";
  }
  json += "}}";
  CK(cudaGetLastError());
  std::printf("json %s\n", json.c_str());
  return 0;
}
