// Host side of ninfer's decode GEMV (qgemv_cuda.cu): launches the AOT-compiled SASS that the
// build embeds as NINFER_QGEMV_FATBIN through the CUDA driver API, looked up with dlopen.
//
// Why the driver API: this file is plain C++, so the same source builds for the x86_64 and the
// AArch64 (DGX Spark) host without a CUDA cross toolkit, and the device code stays SASS-only
// (the fatbin is nvcc's, for exactly the target's arch). Launches go to TVM's stream for the
// device, so they are ordered with TVM's kernels and captured into decode's CUDA graph.
#include <dlfcn.h>
#include <stdint.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>

#include <mutex>
#include <string>

// NINFER_QGEMV_FATBIN (unsigned char[]) is prepended by the build (ops/qgemv.py).

namespace {

typedef int CUresult;
typedef void* CUmodule;
typedef void* CUfunction;
typedef void* CUcontext;
typedef void* CUstream;

struct Driver {
  CUresult (*ctx_get_current)(CUcontext*);
  CUresult (*module_load_data)(CUmodule*, const void*);
  CUresult (*module_get_function)(CUfunction*, CUmodule, const char*);
  CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                     CUstream, void**, void**);
};

const Driver& driver() {
  static Driver d = [] {
    Driver out{};
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    TVM_FFI_ICHECK(lib != nullptr) << "ninfer_qgemv: cannot load libcuda.so.1";
    out.ctx_get_current = reinterpret_cast<decltype(out.ctx_get_current)>(dlsym(lib, "cuCtxGetCurrent"));
    out.module_load_data = reinterpret_cast<decltype(out.module_load_data)>(dlsym(lib, "cuModuleLoadData"));
    out.module_get_function =
        reinterpret_cast<decltype(out.module_get_function)>(dlsym(lib, "cuModuleGetFunction"));
    out.launch = reinterpret_cast<decltype(out.launch)>(dlsym(lib, "cuLaunchKernel"));
    TVM_FFI_ICHECK(out.ctx_get_current && out.module_load_data && out.module_get_function && out.launch)
        << "ninfer_qgemv: libcuda.so.1 lacks a driver symbol";
    return out;
  }();
  return d;
}

// Functions per CUDA context (one per device in TVM): loaded on first use, which is an eager
// call (TVM's graph capture runs each region once before capturing it).
constexpr int kMaxContexts = 16;
constexpr int kKernels = 32;  // 4 formats x 4 batch sizes x 2 dtypes
struct Loaded {
  CUcontext ctx;
  CUfunction fn[kKernels];
};
Loaded g_loaded[kMaxContexts];
int g_count = 0;
std::mutex g_mutex;

int kernel_index(int bits, int batch, bool f32) {
  const int fmt = bits == 4 ? 0 : bits == 5 ? 1 : bits == 6 ? 2 : 3;
  const int bi = batch == 1 ? 0 : batch == 2 ? 1 : batch == 4 ? 2 : 3;
  return (f32 ? 16 : 0) + fmt * 4 + bi;
}

CUfunction lookup(int bits, int batch, bool f32) {
  const Driver& d = driver();
  CUcontext ctx = nullptr;
  TVM_FFI_ICHECK(d.ctx_get_current(&ctx) == 0 && ctx != nullptr) << "ninfer_qgemv: no current CUDA context";
  std::lock_guard<std::mutex> lock(g_mutex);
  for (int i = 0; i < g_count; ++i)
    if (g_loaded[i].ctx == ctx) return g_loaded[i].fn[kernel_index(bits, batch, f32)];
  TVM_FFI_ICHECK(g_count < kMaxContexts) << "ninfer_qgemv: too many CUDA contexts";
  CUmodule mod = nullptr;
  CUresult rc = d.module_load_data(&mod, NINFER_QGEMV_FATBIN);
  TVM_FFI_ICHECK(rc == 0) << "ninfer_qgemv: cuModuleLoadData failed with " << rc;
  Loaded& entry = g_loaded[g_count];
  entry.ctx = ctx;
  const int all_bits[4] = {4, 5, 6, 8};
  const int batches[4] = {1, 2, 4, 8};
  for (int f = 0; f < 2; ++f)
    for (int b : all_bits)
      for (int n : batches) {
        std::string name = "ninfer_qgemv_q" + std::to_string(b) + "_b" + std::to_string(n) + (f ? "_f32" : "_bf16");
        CUfunction fn = nullptr;
        rc = d.module_get_function(&fn, mod, name.c_str());
        TVM_FFI_ICHECK(rc == 0) << "ninfer_qgemv: no kernel " << name;
        entry.fn[kernel_index(b, n, f == 1)] = fn;
      }
  ++g_count;
  return entry.fn[kernel_index(bits, batch, f32)];
}

// K-split warps per block so that a projection has at least ~2 blocks per SM (132 on the H200).
uint32_t choose_ks(uint32_t n_rows) {
  uint32_t ks = 1;
  while (ks < 8 && (n_rows + 4 * (8 / ks) - 1) / (4 * (8 / ks)) < 264) ks *= 2;
  return ks;
}

// Address of the first element (TVM's memory planner may hand out tensors with a byte offset).
char* address(const tvm::ffi::TensorView& t) {
  return static_cast<char*>(t.data_ptr()) + t.byte_offset();
}

void qgemv(tvm::ffi::TensorView x, tvm::ffi::TensorView base, tvm::ffi::TensorView high,
           tvm::ffi::TensorView scales, int64_t bits, tvm::ffi::TensorView y) {
  const int64_t k = x.shape()[x.ndim() - 1];
  const int64_t rows = x.numel() / k;
  const int64_t n = y.shape()[y.ndim() - 1];
  const bool f32 = x.dtype().code == kDLFloat && x.dtype().bits == 32;
  TVM_FFI_ICHECK(f32 || (x.dtype().code == kDLBfloat && x.dtype().bits == 16)) << "ninfer_qgemv: x must be bf16 or fp32";
  TVM_FFI_ICHECK(k % 128 == 0 && n % 4 == 0 && base.shape()[0] == n) << "ninfer_qgemv: unsupported shape";
  const uint32_t ks = choose_ks(static_cast<uint32_t>(n));
  const uint32_t grid = static_cast<uint32_t>((n + 4 * (8 / ks) - 1) / (4 * (8 / ks)));
  CUstream stream = TVMFFIEnvGetStream(kDLCUDA, x.device().device_id);
  const size_t esize = f32 ? 4 : 2;
  const char* xp = address(x);
  char* yp = address(y);
  const void* bp = address(base);
  const void* hp = address(high);
  const void* sp = address(scales);
  TVM_FFI_ICHECK(reinterpret_cast<uintptr_t>(xp) % 16 == 0 && reinterpret_cast<uintptr_t>(bp) % 16 == 0 &&
                 reinterpret_cast<uintptr_t>(hp) % 8 == 0)
      << "ninfer_qgemv: x, base and high must be 16/16/8-byte aligned";
  uint32_t n32 = static_cast<uint32_t>(n), k32 = static_cast<uint32_t>(k);
  for (int64_t r0 = 0; r0 < rows; r0 += 8) {
    uint32_t b = static_cast<uint32_t>(rows - r0 < 8 ? rows - r0 : 8);
    const int batch = b == 1 ? 1 : b == 2 ? 2 : b <= 4 ? 4 : 8;
    CUfunction fn = lookup(static_cast<int>(bits), batch, f32);
    const void* xr = xp + r0 * k * esize;
    void* yr = yp + r0 * n * esize;
    void* args[] = {&xr, &bp, &hp, &sp, &yr, &n32, &k32, &b, const_cast<uint32_t*>(&ks)};
    CUresult rc = driver().launch(fn, grid, 1, 1, 256, 1, 1, 0, stream, args, nullptr);
    TVM_FFI_ICHECK(rc == 0) << "ninfer_qgemv: launch failed with " << rc;
  }
}

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(ninfer_qgemv, qgemv);
