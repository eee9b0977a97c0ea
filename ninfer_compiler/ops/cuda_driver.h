// ninfer_cuda: launching ahead-of-time compiled kernel images (Triton cubins, nvcc fatbins) from
// a package's host library through the CUDA driver API, looked up with dlopen.
//
// Why the driver API: the host side stays plain C++, so the same source builds for the x86_64
// and the AArch64 host without a CUDA toolkit for that host, and no NVRTC or PTX JIT is needed
// at load time. Launches go to TVM's stream for the device, so they are ordered with TVM's
// kernels and captured into decode's CUDA graph; nothing here synchronises with the host.
//
// The build (ops/cuda_extern.py) prepends this header and a table of the embedded images:
//   ninfer_cuda::images(&count) -> {{key, symbol, data, shared, threads}, ...}
// and then the extern's own launcher source.
#include <dlfcn.h>
#include <stdint.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/container/tuple.h>
#include <tvm/ffi/function.h>

#include <cstring>
#include <initializer_list>
#include <mutex>

// cuda_launch.h (cuLaunchKernelEx's structs) is prepended by the build (ops/cuda_extern.py).

// Everything is internal to the translation unit (an anonymous namespace): a package links one
// such launcher per extern, each with its own image table.
namespace {
namespace ninfer_cuda {

typedef int CUresult;
typedef void* CUmodule;
typedef void* CUfunction;
typedef void* CUcontext;
typedef void* CUstream;

// One embedded kernel image: the key launches name it by, its entry symbol, bytes (cubin or
// fatbin), dynamic shared memory and threads per block to launch it with.
struct Image {
  const char* key;
  const char* symbol;
  const unsigned char* data;
  unsigned shared;
  unsigned threads;
};

struct Driver {
  CUresult (*ctx_get_current)(CUcontext*);
  CUresult (*module_load_data)(CUmodule*, const void*);
  CUresult (*module_get_function)(CUfunction*, CUmodule, const char*);
  CUresult (*func_set_attribute)(CUfunction, int, int);
  CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                     CUstream, void**, void**);
  CUresult (*launch_ex)(const ninfer_launch::LaunchConfig*, CUfunction, void**, void**);
};

inline const Driver& driver() {
  static Driver d = [] {
    Driver out{};
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    TVM_FFI_ICHECK(lib != nullptr) << "ninfer_cuda: cannot load libcuda.so.1";
    out.ctx_get_current = reinterpret_cast<decltype(out.ctx_get_current)>(dlsym(lib, "cuCtxGetCurrent"));
    out.module_load_data = reinterpret_cast<decltype(out.module_load_data)>(dlsym(lib, "cuModuleLoadData"));
    out.module_get_function =
        reinterpret_cast<decltype(out.module_get_function)>(dlsym(lib, "cuModuleGetFunction"));
    out.func_set_attribute =
        reinterpret_cast<decltype(out.func_set_attribute)>(dlsym(lib, "cuFuncSetAttribute"));
    out.launch = reinterpret_cast<decltype(out.launch)>(dlsym(lib, "cuLaunchKernel"));
    out.launch_ex = reinterpret_cast<decltype(out.launch_ex)>(dlsym(lib, "cuLaunchKernelEx"));
    TVM_FFI_ICHECK(out.ctx_get_current && out.module_load_data && out.module_get_function &&
                   out.func_set_attribute && out.launch && out.launch_ex)
        << "ninfer_cuda: libcuda.so.1 lacks a driver symbol";
    return out;
  }();
  return d;
}

// A kernel ready to launch in the current context.
struct Kernel {
  CUfunction fn;
  unsigned shared;
  unsigned threads;
};

constexpr int kMaxContexts = 16;
constexpr int kMaxImages = 64;
constexpr int kMaxDynamicSharedAttr = 8;  // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES

// The image table of this translation unit (defined by the build after this header).
const Image* images(int* count);

// Functions per CUDA context, loaded on first use. The first use is an eager call: TVM's graph
// capture runs each region once before capturing it, so no module load happens while capturing.
inline const Kernel& kernel(const char* name) {
  struct PerContext {
    CUcontext ctx;
    Kernel k[kMaxImages];
    bool loaded[kMaxImages];
  };
  static PerContext table[kMaxContexts];
  static int used = 0;
  static std::mutex mutex;
  int count = 0;
  const Image* imgs = images(&count);
  int index = -1;
  for (int i = 0; i < count; ++i)
    if (std::strcmp(imgs[i].key, name) == 0) index = i;
  TVM_FFI_ICHECK(index >= 0) << "ninfer_cuda: no kernel image named " << name;
  const Driver& d = driver();
  CUcontext ctx = nullptr;
  TVM_FFI_ICHECK(d.ctx_get_current(&ctx) == 0 && ctx != nullptr) << "ninfer_cuda: no current CUDA context";
  std::lock_guard<std::mutex> lock(mutex);
  PerContext* slot = nullptr;
  for (int i = 0; i < used; ++i)
    if (table[i].ctx == ctx) slot = &table[i];
  if (slot == nullptr) {
    TVM_FFI_ICHECK(used < kMaxContexts) << "ninfer_cuda: too many CUDA contexts";
    slot = &table[used++];
    slot->ctx = ctx;
    for (bool& b : slot->loaded) b = false;
  }
  if (!slot->loaded[index]) {
    const Image& img = imgs[index];
    CUmodule mod = nullptr;
    CUresult rc = d.module_load_data(&mod, img.data);
    TVM_FFI_ICHECK(rc == 0) << "ninfer_cuda: cuModuleLoadData failed with " << rc << " for " << name;
    CUfunction fn = nullptr;
    rc = d.module_get_function(&fn, mod, img.symbol);
    TVM_FFI_ICHECK(rc == 0) << "ninfer_cuda: no function " << name << " in its image (" << rc << ")";
    if (img.shared > 48 * 1024) {
      rc = d.func_set_attribute(fn, kMaxDynamicSharedAttr, static_cast<int>(img.shared));
      TVM_FFI_ICHECK(rc == 0) << "ninfer_cuda: " << name << " needs " << img.shared
                              << " bytes of shared memory, which the device refuses (" << rc << ")";
    }
    const int carveout = ninfer_launch::apply_smem_carveout(d, fn);
    TVM_FFI_ICHECK(carveout != ninfer_launch::kCarveoutInvalid)
        << "ninfer_cuda: NINFER_SMEM_CARVEOUT must be a percentage 0..100, not " << getenv("NINFER_SMEM_CARVEOUT");
    TVM_FFI_ICHECK(carveout == 0) << "ninfer_cuda: setting the shared memory carveout of " << name << " failed with " << carveout;
    slot->k[index] = Kernel{fn, img.shared, img.threads};
    slot->loaded[index] = true;
  }
  return slot->k[index];
}

// Launches `name` on TVM's stream for `device_id`. `args` point at the kernel's parameter values
// in order (as cuLaunchKernel takes them); the two scratch pointers that Triton appends to every
// kernel are passed as null (images with scratch needs are refused at build time). Empty grids
// are skipped. `pdl`: launch with Programmatic Dependent Launch (sm_90 and later) unless NINFER_PDL=0
// (`ninfer_launch::pdl_enabled`, shared with the decode GEMVs); the kernel must wait for its
// predecessor itself before touching memory (Triton's `gdc_wait` first, tests/compiler/ops/test_pdl_kernels.py).
// `cluster_y` > 1: the grid's blocks in thread block clusters of (1, cluster_y, 1) (gy a multiple of it).
inline void launch(const char* name, unsigned gx, unsigned gy, unsigned gz, std::initializer_list<void*> args,
                   int device_id, bool pdl = false, unsigned cluster_y = 1) {
  if (gx == 0 || gy == 0 || gz == 0) return;
  const Kernel& k = kernel(name);
  static uint64_t null_scratch = 0;
  void* params[48];
  TVM_FFI_ICHECK(args.size() + 2 <= 48) << "ninfer_cuda: too many kernel arguments for " << name;
  int n = 0;
  for (void* a : args) params[n++] = a;
  params[n++] = &null_scratch;
  params[n++] = &null_scratch;
  CUstream stream = TVMFFIEnvGetStream(kDLCUDA, device_id);
  CUresult rc = 0;
  TVM_FFI_ICHECK(cluster_y >= 1 && gy % cluster_y == 0) << "ninfer_cuda: " << name << ": " << gy
                                                        << " blocks along y in clusters of " << cluster_y;
  const bool with_pdl = pdl && ninfer_launch::pdl_enabled();
  if (with_pdl || cluster_y > 1) {
    ninfer_launch::LaunchAttr attrs[2];
    unsigned n_attrs = 0;
    if (with_pdl) attrs[n_attrs++] = ninfer_launch::programmatic_serialization();
    if (cluster_y > 1) attrs[n_attrs++] = ninfer_launch::cluster_dimension(1, cluster_y);
    const ninfer_launch::LaunchConfig cfg{gx, gy, gz, k.threads, 1, 1, k.shared, stream, attrs, n_attrs};
    rc = driver().launch_ex(&cfg, k.fn, params, nullptr);
  } else {
    rc = driver().launch(k.fn, gx, gy, gz, k.threads, 1, 1, k.shared, stream, params, nullptr);
  }
  TVM_FFI_ICHECK(rc == 0) << "ninfer_cuda: launch of " << name << " failed with " << rc;
}

// Address of a tensor's first element (TVM's memory planner may hand out byte offsets).
inline char* address(const tvm::ffi::TensorView& t) {
  return static_cast<char*>(t.data_ptr()) + t.byte_offset();
}

// `address(t)` as the 64-bit value a kernel pointer parameter takes, checked for the 16-byte
// alignment that the images are compiled to assume for pointers.
inline uint64_t pointer(const tvm::ffi::TensorView& t, const char* what) {
  const uint64_t p = reinterpret_cast<uint64_t>(address(t));
  TVM_FFI_ICHECK(p % 16 == 0) << "ninfer_cuda: " << what << " is not 16-byte aligned";
  return p;
}

}  // namespace ninfer_cuda
}  // namespace
