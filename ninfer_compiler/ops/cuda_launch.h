// cuLaunchKernelEx's CUlaunchAttribute / CUlaunchConfig (cuda.h, CUDA 12+) in the same layout, for
// launchers that look the driver up with dlopen and include no CUDA header (qgemv_host.cc,
// qgemv5_host.cc). The builds inline this file before the launcher (ops/qgemv.py); a standalone
// compile of a launcher includes it.
#ifndef NINFER_CUDA_LAUNCH_H
#define NINFER_CUDA_LAUNCH_H

#include <stdlib.h>
#include <string.h>

namespace ninfer_launch {

struct LaunchAttr {
  int id;
  char pad[4];
  union {
    char bytes[64];
    int value;
  } v;
};

struct LaunchConfig {
  unsigned grid_x, grid_y, grid_z, block_x, block_y, block_z, shared;
  void* stream;  // CUstream
  LaunchAttr* attrs;
  unsigned num_attrs;
};
static_assert(sizeof(LaunchAttr) == 72 && sizeof(LaunchConfig) == 56, "cuda.h launch structs");

constexpr int kAttrProgrammaticStreamSerialization = 6;  // CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION

// The attribute that lets a launch start before the previous kernel of its stream has finished.
inline LaunchAttr programmatic_serialization() {
  LaunchAttr attr{};
  attr.id = kAttrProgrammaticStreamSerialization;
  attr.v.value = 1;
  return attr;
}

constexpr int kAttrClusterDimension = 4;  // CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION (value: unsigned x, y, z)

// The attribute that launches the grid's blocks in clusters of (x, y, 1).
inline LaunchAttr cluster_dimension(unsigned x, unsigned y = 1u) {
  LaunchAttr attr{};
  attr.id = kAttrClusterDimension;
  const unsigned dims[3] = {x, y, 1u};
  memcpy(attr.v.bytes, dims, sizeof dims);
  return attr;
}

// Whether launches that can take Programmatic Dependent Launch do (unless NINFER_PDL=0; read once).
// Such a kernel may start while the previous kernel of the stream still runs, so it must wait for it
// (`griddepcontrol.wait`; Triton's `gdc_wait`) before touching anything that kernel may write.
inline bool pdl_enabled() {
  static const bool on = [] {
    const char* v = getenv("NINFER_PDL");
    return v == nullptr || v[0] != '0';
  }();
  return on;
}

constexpr int kFuncPreferredSharedCarveout = 9;  // CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
constexpr int kCarveoutUnset = -1, kCarveoutInvalid = -2;

// A measurement knob: NINFER_SMEM_CARVEOUT=P (0..100) asks the driver for P% of each SM's unified
// L1 / shared memory as shared memory on every kernel these launchers load (read once). Unset:
// kCarveoutUnset (the driver's own choice per kernel); anything but 0..100: kCarveoutInvalid.
// With one carveout for all, no SM has to change its configuration between kernels of the chain.
inline int smem_carveout() {
  static const int value = [] {
    const char* v = getenv("NINFER_SMEM_CARVEOUT");
    if (v == nullptr || v[0] == 0) return kCarveoutUnset;
    char* end = nullptr;
    const long p = strtol(v, &end, 10);
    return *end == 0 && p >= 0 && p <= 100 ? static_cast<int>(p) : kCarveoutInvalid;
  }();
  return value;
}

// Applies smem_carveout() to `fn` through the launcher's driver table (`func_set_attribute`):
// 0 when done or unset, kCarveoutInvalid for a bad value, else the driver's error.
template <class Driver, class Function>
inline int apply_smem_carveout(const Driver& d, Function fn) {
  const int p = smem_carveout();
  if (p == kCarveoutInvalid) return p;
  if (p == kCarveoutUnset) return 0;
  return static_cast<int>(d.func_set_attribute(fn, kFuncPreferredSharedCarveout, p));
}

}  // namespace ninfer_launch

#endif  // NINFER_CUDA_LAUNCH_H
