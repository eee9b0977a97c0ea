// Shared by the streaming measurements (stream_ceiling.cu, copy_geometry.cu; both built by
// tests/gpu/check_stream_ceiling.py): error checks, the PDL instructions, the streaming load, the
// grid-stride read every figure is held against, the fill of the weight buffer, and the median
// time of a captured CUDA graph.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                                   \
  do {                                                                                          \
    cudaError_t e_ = (x);                                                                       \
    if (e_ != cudaSuccess) {                                                                    \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));  \
      std::exit(2);                                                                             \
    }                                                                                           \
  } while (0)

__device__ __forceinline__ void gdc_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void gdc_launch() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// Reads nvec 16-byte vectors, 4 per thread in flight per iteration, grid-stride. mode: 0 no PDL
// instructions, 1 wait first ("late"), 2 the first `ahead` iterations before the wait, 3 all
// before the wait ("early"). The XOR of everything goes to `sink` only if it equals a value the
// data never produces, so nothing is written and no load can be dropped.
__global__ void __launch_bounds__(512) read_weights(const uint4* __restrict__ w, uint64_t nvec, uint32_t* sink,
                                                    int mode, uint32_t ahead) {
  if (mode == 1) gdc_wait();
  if (mode != 0) gdc_launch();
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  uint32_t acc = 0u, it = 0u;
  for (; i + 3 * stride < nvec; i += 4 * stride, ++it) {
    if (mode == 2 && it == ahead) gdc_wait();
    const uint4 a = ld_stream(w + i), b = ld_stream(w + i + stride), c = ld_stream(w + i + 2 * stride),
                d = ld_stream(w + i + 3 * stride);
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
  }
  for (; i < nvec; i += stride) {
    const uint4 a = ld_stream(w + i);
    acc ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  if (mode >= 2) gdc_wait();
  if (acc == 0x9e3779b9u) sink[0] = acc;
}

__global__ void fill(uint32_t* p, uint64_t n) {
  for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x) {
    uint32_t x = uint32_t(i) * 0x9e3779b1u + 0x7f4a7c15u;
    x ^= x >> 15;
    p[i] = x * 0x2c1b3c6du;
  }
}

// What every measurement program runs on: device 0's properties, a weight buffer of `bytes` filled
// with nonzero data, a sink for the reads' checksums, a non-blocking stream and two events.
struct Rig {
  cudaDeviceProp prop;
  int sms;
  uint8_t* buf;
  uint32_t* sink;
  cudaStream_t st;
  cudaEvent_t e0, e1;
};

inline Rig make_rig(uint64_t bytes) {
  Rig r;
  CK(cudaGetDeviceProperties(&r.prop, 0));
  r.sms = r.prop.multiProcessorCount;
  CK(cudaMalloc(&r.buf, bytes));
  CK(cudaMalloc(&r.sink, 64));
  fill<<<r.sms * 8, 512>>>(reinterpret_cast<uint32_t*>(r.buf), bytes / 4);
  CK(cudaDeviceSynchronize());
  CK(cudaStreamCreateWithFlags(&r.st, cudaStreamNonBlocking));
  CK(cudaEventCreate(&r.e0));
  CK(cudaEventCreate(&r.e1));
  return r;
}

// The repetitions from argv[1] (default `fallback`), or -1 after a usage line for anything below 1.
inline int reps_argument(int argc, char** argv, int fallback, const char* program) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : fallback;
  if (reps < 1) std::fprintf(stderr, "usage: %s [REPS >= 1]\n", program);
  return reps < 1 ? -1 : reps;
}

// Median ms of one replay of the graph that `enqueue()` captures on `st` (two warm-up replays).
template <typename F>
double graph_median_ms(cudaStream_t st, cudaEvent_t e0, cudaEvent_t e1, int reps, F&& enqueue) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  enqueue();
  CK(cudaStreamEndCapture(st, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  for (int i = 0; i < 2; ++i) CK(cudaGraphLaunch(ge, st));
  CK(cudaStreamSynchronize(st));
  std::vector<float> ms;
  for (int r = 0; r < reps; ++r) {
    CK(cudaEventRecord(e0, st));
    CK(cudaGraphLaunch(ge, st));
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    float t;
    CK(cudaEventElapsedTime(&t, e0, e1));
    ms.push_back(t);
  }
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  std::sort(ms.begin(), ms.end());
  return double(ms[ms.size() / 2]);
}
