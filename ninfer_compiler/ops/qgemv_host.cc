// Host side of ninfer's decode GEMVs (qgemv_cuda.cu): launches the AOT-compiled SASS that the
// build embeds as NINFER_QGEMV_FATBIN through the CUDA driver API, looked up with dlopen.
// Built twice by ops/qgemv.py: the grouped-int launcher (`ninfer_qgemv`: v4/v3 tensor-core kernels
// for q4/q5/q6 with bf16 activations, v2 for q8 and fp32) and, with NINFER_GEMV_DENSE_ONLY, the bf16
// weight launcher (`ninfer_dense_gemv`), so that a package carries only the kernels it calls.
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
  CUresult (*func_set_attribute)(CUfunction, int, int);
};

const Driver& driver() {
  static Driver d = [] {
    Driver out{};
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    TVM_FFI_ICHECK(lib != nullptr) << "ninfer_gemv: cannot load libcuda.so.1";
    out.ctx_get_current = reinterpret_cast<decltype(out.ctx_get_current)>(dlsym(lib, "cuCtxGetCurrent"));
    out.module_load_data = reinterpret_cast<decltype(out.module_load_data)>(dlsym(lib, "cuModuleLoadData"));
    out.module_get_function =
        reinterpret_cast<decltype(out.module_get_function)>(dlsym(lib, "cuModuleGetFunction"));
    out.launch = reinterpret_cast<decltype(out.launch)>(dlsym(lib, "cuLaunchKernel"));
    out.func_set_attribute = reinterpret_cast<decltype(out.func_set_attribute)>(dlsym(lib, "cuFuncSetAttribute"));
    TVM_FFI_ICHECK(out.ctx_get_current && out.module_load_data && out.module_get_function && out.launch &&
                   out.func_set_attribute)
        << "ninfer_gemv: libcuda.so.1 lacks a driver symbol";
    return out;
  }();
  return d;
}

// Kernel names of this build, indexed by kernel_index / dense_index.
#ifndef NINFER_GEMV_DENSE_ONLY
constexpr int kKernels = 32 + 3 + 3;  // v2: 4 formats x 4 batch sizes x 2 dtypes; v3, v4: q4/q5/q6

// v4's ring depth per format; must equal the kernel's (tests/compiler/ops/test_qgemv_v4.py checks).
#define NINFER_V4_STAGES_Q4 2
#define NINFER_V4_STAGES_Q5 3
#define NINFER_V4_STAGES_Q6 2
#define NINFER_V4_XSTAGE 0
constexpr uint32_t kV4MaxWarps = 8;

// Dynamic shared memory of a v4 block: warps x stages x (16 rows x 4 groups of base, high, scales,
// and the staged activation rows).
uint32_t v4_smem(int bits, uint32_t warps) {
  const uint32_t hb = bits == 5 ? 8 : bits == 6 ? 16 : 0;
  const uint32_t stages = bits == 4 ? NINFER_V4_STAGES_Q4 : bits == 5 ? NINFER_V4_STAGES_Q5 : NINFER_V4_STAGES_Q6;
  return warps * stages * (16 * 128 + 16 * 4 * hb + 16 * 8 + NINFER_V4_XSTAGE * 512);
}

int kernel_index(int bits, int batch, bool f32) {
  const int fmt = bits == 4 ? 0 : bits == 5 ? 1 : bits == 6 ? 2 : 3;
  const int bi = batch == 1 ? 0 : batch == 2 ? 1 : batch == 4 ? 2 : 3;
  return (f32 ? 16 : 0) + fmt * 4 + bi;
}

int v3_index(int bits) { return 32 + (bits - 4); }
int v4_index(int bits) { return 35 + (bits - 4); }

std::string kernel_name(int i) {
  if (i >= 35) return "ninfer_qgemv4_q" + std::to_string(i - 35 + 4) + "_ybf16";
  if (i >= 32) return "ninfer_qgemv3_q" + std::to_string(i - 32 + 4) + "_ybf16";
  const int all_bits[4] = {4, 5, 6, 8};
  const int batches[4] = {1, 2, 4, 8};
  return "ninfer_qgemv_q" + std::to_string(all_bits[(i % 16) / 4]) + "_b" + std::to_string(batches[i % 4]) +
         (i >= 16 ? "_f32" : "_bf16");
}
#else
constexpr int kKernels = 4;  // batch 1, 2, 4, 8

int dense_index(int batch) { return batch == 1 ? 0 : batch == 2 ? 1 : batch <= 4 ? 2 : 3; }

std::string kernel_name(int i) {
  const int batches[4] = {1, 2, 4, 8};
  return "ninfer_dense_bf16_b" + std::to_string(batches[i]);
}
#endif

// Functions per CUDA context (one per device in TVM): loaded on first use, which is an eager
// call (TVM's graph capture runs each region once before capturing it).
constexpr int kMaxContexts = 16;
struct Loaded {
  CUcontext ctx;
  CUfunction fn[kKernels];
};
Loaded g_loaded[kMaxContexts];
int g_count = 0;
std::mutex g_mutex;

CUfunction lookup(int index) {
  const Driver& d = driver();
  CUcontext ctx = nullptr;
  TVM_FFI_ICHECK(d.ctx_get_current(&ctx) == 0 && ctx != nullptr) << "ninfer_gemv: no current CUDA context";
  std::lock_guard<std::mutex> lock(g_mutex);
  for (int i = 0; i < g_count; ++i)
    if (g_loaded[i].ctx == ctx) return g_loaded[i].fn[index];
  TVM_FFI_ICHECK(g_count < kMaxContexts) << "ninfer_gemv: too many CUDA contexts";
  CUmodule mod = nullptr;
  CUresult rc = d.module_load_data(&mod, NINFER_QGEMV_FATBIN);
  TVM_FFI_ICHECK(rc == 0) << "ninfer_gemv: cuModuleLoadData failed with " << rc;
  Loaded& entry = g_loaded[g_count];
  entry.ctx = ctx;
  for (int i = 0; i < kKernels; ++i) {
    const std::string name = kernel_name(i);
    CUfunction fn = nullptr;
    rc = d.module_get_function(&fn, mod, name.c_str());
    TVM_FFI_ICHECK(rc == 0) << "ninfer_gemv: no kernel " << name;
#ifndef NINFER_GEMV_DENSE_ONLY
    if (i >= 35) {  // v4 asks for more than the 48 KB of shared memory that need no opt-in
      rc = d.func_set_attribute(fn, 8 /* CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES */,
                                static_cast<int>(v4_smem(i - 35 + 4, kV4MaxWarps)));
      TVM_FFI_ICHECK(rc == 0) << "ninfer_gemv: cuFuncSetAttribute failed with " << rc;
    }
#endif
    entry.fn[i] = fn;
  }
  ++g_count;
  return entry.fn[index];
}

// Address of the first element (TVM's memory planner may hand out tensors with a byte offset).
char* address(const tvm::ffi::TensorView& t) {
  return static_cast<char*>(t.data_ptr()) + t.byte_offset();
}

#ifndef NINFER_GEMV_DENSE_ONLY
// v2: K-split warps per block so that a projection has at least ~2 blocks per SM (132 on the H200).
uint32_t choose_ks(uint32_t n_rows) {
  uint32_t ks = 1;
  while (ks < 8 && (n_rows + 4 * (8 / ks) - 1) / (4 * (8 / ks)) < 264) ks *= 2;
  return ks;
}

// v3: K-split warps per 16-row tile (1..16) so that a projection has ~32 warps per SM (4224 on the
// H200's 132 SMs) while each warp keeps >= 2 chunks of 128 lanes (one loop step of loads).
uint32_t choose_ks_v3(uint32_t n_rows, uint32_t k) {
  const uint32_t tiles = n_rows / 16, chunks = k / 128;
  uint32_t ks = 1;
  while (ks < 16 && tiles * ks < 4224 && chunks >= 4 * ks) ks *= 2;
  return ks;
}

// v4: K-split warps per 16-row tile (1, 2, 4 or 8) for >= 8,192 warps per launch (several waves:
// short warps that finish at different times balance the SMs), each warp keeping >= 1 stage of 256
// lanes. Measured on the H200 (docs/kernels/decode-gemv-v4.md): ks = 8 was best or within 3% for
// every 27B projection except the head (15,520 tiles: ks = 1); with the 3-stage q5 ring, the q5
// projections of K <= 8,192 (6144x5120, 5120x6144) are 7-17% faster at ks = 4.
uint32_t choose_ks_v4(int bits, uint32_t n_rows, uint32_t k) {
  const uint32_t tiles = n_rows / 16, units = k / 256;
  const uint32_t cap = bits == 5 && k <= 8192 ? 4 : kV4MaxWarps;
  uint32_t ks = 1;
  while (ks < cap && tiles * ks < 8192 && units >= 2 * ks) ks *= 2;
  return ks;
}

void qgemv(tvm::ffi::TensorView x, tvm::ffi::TensorView base, tvm::ffi::TensorView high,
           tvm::ffi::TensorView scales, int64_t bits, tvm::ffi::TensorView y) {
  const int64_t k = x.shape()[x.ndim() - 1];
  const int64_t rows = x.numel() / k;
  const int64_t n = y.shape()[y.ndim() - 1];
  const bool f32 = x.dtype().code == kDLFloat && x.dtype().bits == 32;
  TVM_FFI_ICHECK(f32 || (x.dtype().code == kDLBfloat && x.dtype().bits == 16)) << "ninfer_gemv: x must be bf16 or fp32";
  TVM_FFI_ICHECK(k % 128 == 0 && n % 4 == 0 && base.shape()[0] == n) << "ninfer_gemv: unsupported shape";
  // bf16 q4/q5/q6, as measured on the H200 (docs/kernels/decode-gemv-v4.md, b = 1..8):
  // * v4 from 16 Mi weights up (6144x5120 and larger: 8-27% faster than v2 / v3 at every batch);
  // * below that (2048x5120, 1024x5120): v2 at batch 1 (4.3-5.7 us vs v3 5.9-7.1, v4 6.5-7.2) and
  //   v3 from batch 2 (v2's cost grows with the batch; v4 is 5-10% slower there);
  // * v3 where v4 cannot run (K not a multiple of 256, `high` not 16-byte aligned).
  const bool v3_ok = !f32 && bits != 8 && n % 16 == 0;
  const bool small = n * k <= (int64_t{32} << 20);  // v2 at batch 1 (when v4 is not used)
  const bool v4_size = n * k >= (int64_t{16} << 20);
  const uint32_t ks2 = choose_ks(static_cast<uint32_t>(n));
  const uint32_t grid2 = static_cast<uint32_t>((n + 4 * (8 / ks2) - 1) / (4 * (8 / ks2)));
  // v4 (cp.async ring) where K is a multiple of its 256-lane stage
  const bool v4_ok = v3_ok && k % 256 == 0 && reinterpret_cast<uintptr_t>(address(high)) % 16 == 0;
  uint32_t ks4 = 0, grid4 = 0, warps4 = 0;
  if (v4_ok) {
    ks4 = choose_ks_v4(static_cast<int>(bits), static_cast<uint32_t>(n), static_cast<uint32_t>(k));
    warps4 = ks4 > 4 ? ks4 : 4;
    grid4 = static_cast<uint32_t>((n / 16 + warps4 / ks4 - 1) / (warps4 / ks4));
  }
  uint32_t ks3 = 0, grid3 = 0, threads3 = 0;
  if (v3_ok) {
    ks3 = choose_ks_v3(static_cast<uint32_t>(n), static_cast<uint32_t>(k));
    const uint32_t warps = ks3 > 8 ? ks3 : 8, slots = warps / ks3;
    grid3 = static_cast<uint32_t>((n / 16 + slots - 1) / slots);
    threads3 = warps * 32;
  }
  CUstream stream = TVMFFIEnvGetStream(kDLCUDA, x.device().device_id);
  const size_t esize = f32 ? 4 : 2;
  const char* xp = address(x);
  char* yp = address(y);
  const void* bp = address(base);
  const void* hp = address(high);
  const void* sp = address(scales);
  TVM_FFI_ICHECK(reinterpret_cast<uintptr_t>(xp) % 16 == 0 && reinterpret_cast<uintptr_t>(bp) % 16 == 0 &&
                 reinterpret_cast<uintptr_t>(hp) % 8 == 0 && reinterpret_cast<uintptr_t>(sp) % 4 == 0)
      << "ninfer_gemv: x, base, high and scales must be 16/16/8/4-byte aligned";
  uint32_t n32 = static_cast<uint32_t>(n), k32 = static_cast<uint32_t>(k);
  for (int64_t r0 = 0; r0 < rows; r0 += 8) {
    uint32_t b = static_cast<uint32_t>(rows - r0 < 8 ? rows - r0 : 8);
    const int batch = b == 1 ? 1 : b == 2 ? 2 : b <= 4 ? 4 : 8;
    const bool v4 = v4_ok && v4_size;
    const bool v3 = !v4 && v3_ok && !(b == 1 && small);
    const int ib = static_cast<int>(bits);
    CUfunction fn = lookup(v4 ? v4_index(ib) : v3 ? v3_index(ib) : kernel_index(ib, batch, f32));
    const void* xr = xp + r0 * k * esize;
    void* yr = yp + r0 * n * esize;
    uint32_t ks = v4 ? ks4 : v3 ? ks3 : ks2;
    void* args[] = {&xr, &bp, &hp, &sp, &yr, &n32, &k32, &b, &ks};
    const uint32_t grid = v4 ? grid4 : v3 ? grid3 : grid2, threads = v4 ? warps4 * 32 : v3 ? threads3 : 256;
    const uint32_t smem = v4 ? v4_smem(ib, warps4) : 0;
    CUresult rc = driver().launch(fn, grid, 1, 1, threads, 1, 1, smem, stream, args, nullptr);
    TVM_FFI_ICHECK(rc == 0) << "ninfer_gemv: launch failed with " << rc;
  }
}

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(ninfer_qgemv, qgemv);
#else
// bf16 weights: `y[b, n] = sum_k x[b, k] * w[n, k]`, one block of 256 threads per row.
void dense_gemv(tvm::ffi::TensorView x, tvm::ffi::TensorView w, tvm::ffi::TensorView y) {
  const int64_t k = x.shape()[x.ndim() - 1];
  const int64_t rows = x.numel() / k;
  const int64_t n = y.shape()[y.ndim() - 1];
  const auto is_bf16 = [](const tvm::ffi::TensorView& t) { return t.dtype().code == kDLBfloat && t.dtype().bits == 16; };
  TVM_FFI_ICHECK(is_bf16(x) && is_bf16(w) && is_bf16(y)) << "ninfer_gemv: dense needs bf16 x, w and y";
  TVM_FFI_ICHECK(k % 8 == 0 && w.shape()[0] == n && w.shape()[1] == k) << "ninfer_gemv: unsupported dense shape";
  CUstream stream = TVMFFIEnvGetStream(kDLCUDA, x.device().device_id);
  const char* xp = address(x);
  char* yp = address(y);
  const void* wp = address(w);
  TVM_FFI_ICHECK(reinterpret_cast<uintptr_t>(xp) % 16 == 0 && reinterpret_cast<uintptr_t>(wp) % 16 == 0)
      << "ninfer_gemv: x and w must be 16-byte aligned";
  uint32_t n32 = static_cast<uint32_t>(n), k32 = static_cast<uint32_t>(k);
  for (int64_t r0 = 0; r0 < rows; r0 += 8) {
    uint32_t b = static_cast<uint32_t>(rows - r0 < 8 ? rows - r0 : 8);
    CUfunction fn = lookup(dense_index(static_cast<int>(b)));
    const void* xr = xp + r0 * k * 2;
    void* yr = yp + r0 * n * 2;
    void* args[] = {&xr, &wp, &yr, &n32, &k32, &b};
    CUresult rc = driver().launch(fn, n32, 1, 1, 256, 1, 1, 0, stream, args, nullptr);
    TVM_FFI_ICHECK(rc == 0) << "ninfer_gemv: launch failed with " << rc;
  }
}

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(ninfer_dense_gemv, dense_gemv);
#endif
