// Host side of decode GEMV v5 (qgemv5_cuda.cu): plans a launch (segments, stream-K split, ring
// depth, grid) and launches the AOT-compiled SASS through the CUDA driver API (dlopen), with
// Programmatic Dependent Launch unless NINFER_PDL=0.
//
// Three layers in one file:
// * the core (namespace ninfer_gemv5): plain C++, no TVM, no CUDA headers: `plan` (pure, tested on
//   the CPU through the C API) and `run` (module per context, launcher-owned workspace, launch);
// * TVM FFI exports (unless NINFER_GEMV5_NO_TVM): `ninfer_qgemv5_multi`, `_swiglu`, `_add`, used by
//   ops/qgemv.py; launches go to TVM's stream, so they are ordered with TVM's kernels and captured
//   into decode's CUDA graph (nothing here synchronises with the host);
// * a C API (NINFER_GEMV5_CAPI) for tests and the GPU check, which run without TVM.
//
// The build prepends qgemv5_plan.h (and, for the TVM build, the fatbin as NINFER_QGEMV5_FATBIN).
//
// Constraints: the launcher-owned workspace (split-strip partial sums and their counters, one set
// per CUDA context, allocated and zeroed on the first call in that context, which must be eager,
// not inside a stream capture) assumes that launches of this kernel in one context do not run
// concurrently on two streams. Each launch leaves the counters at zero.
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <mutex>
#include <string>

#ifndef NINFER_V5_PLAN_INLINED
#include "cuda_launch.h"
#include "qgemv5_plan.h"
#endif

namespace ninfer_gemv5 {

typedef int CUresult;
typedef void* CUcontext;
typedef void* CUmodule;
typedef void* CUfunction;
typedef void* CUstream;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;

using ninfer_launch::LaunchAttr;
using ninfer_launch::LaunchConfig;
constexpr int kFuncMaxDynamicShared = 8;                 // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
constexpr int kDevAttrSmCount = 16;                      // CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
constexpr int kDevAttrSmemPerSm = 81;                    // ..._MAX_SHARED_MEMORY_PER_MULTIPROCESSOR
constexpr int kDevAttrSmemOptin = 97;                    // ..._MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
constexpr uint32_t kThreads = NINFER_V5_WARPS * 32;
constexpr uint32_t kStaticShared = 128;   // the kernel's static shared memory (flag, mbarriers), rounded up
constexpr uint32_t kReservedShared = 1024;  // per block, by the driver
constexpr uint64_t kLongLaunch = 128ull << 20;  // weight bytes from which one launch may take a whole SM
constexpr uint32_t kMaxBlocksPerSm = 2;         // plans use at most this many blocks per SM (workspace size)

struct Driver {
  CUresult (*ctx_get_current)(CUcontext*);
  CUresult (*ctx_get_device)(CUdevice*);
  CUresult (*device_get_attribute)(int*, int, CUdevice);
  CUresult (*module_load_data)(CUmodule*, const void*);
  CUresult (*module_get_function)(CUfunction*, CUmodule, const char*);
  CUresult (*func_set_attribute)(CUfunction, int, int);
  CUresult (*launch_ex)(const LaunchConfig*, CUfunction, void**, void**);
  CUresult (*mem_alloc)(CUdeviceptr*, size_t);
  CUresult (*memset_d32_async)(CUdeviceptr, unsigned, size_t, CUstream);
};

inline const Driver* driver() {
  static const Driver* d = []() -> const Driver* {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (lib == nullptr) return nullptr;
    static Driver out;
    out.ctx_get_current = reinterpret_cast<decltype(out.ctx_get_current)>(dlsym(lib, "cuCtxGetCurrent"));
    out.ctx_get_device = reinterpret_cast<decltype(out.ctx_get_device)>(dlsym(lib, "cuCtxGetDevice"));
    out.device_get_attribute =
        reinterpret_cast<decltype(out.device_get_attribute)>(dlsym(lib, "cuDeviceGetAttribute"));
    out.module_load_data = reinterpret_cast<decltype(out.module_load_data)>(dlsym(lib, "cuModuleLoadData"));
    out.module_get_function = reinterpret_cast<decltype(out.module_get_function)>(dlsym(lib, "cuModuleGetFunction"));
    out.func_set_attribute = reinterpret_cast<decltype(out.func_set_attribute)>(dlsym(lib, "cuFuncSetAttribute"));
    out.launch_ex = reinterpret_cast<decltype(out.launch_ex)>(dlsym(lib, "cuLaunchKernelEx"));
    out.mem_alloc = reinterpret_cast<decltype(out.mem_alloc)>(dlsym(lib, "cuMemAlloc_v2"));
    out.memset_d32_async = reinterpret_cast<decltype(out.memset_d32_async)>(dlsym(lib, "cuMemsetD32Async"));
    if (!out.ctx_get_current || !out.ctx_get_device || !out.device_get_attribute || !out.module_load_data ||
        !out.module_get_function || !out.func_set_attribute || !out.launch_ex || !out.mem_alloc || !out.memset_d32_async)
      return nullptr;
    return &out;
  }();
  return d;
}

// Environment switches, read once: NINFER_PDL=0 launches without the PDL attribute;
// NINFER_GEMV5_STAGES=n forces the ring depth (measurements). The C API can override both.
struct Options {
  int pdl, stages, blocks_per_sm, min_units;  // measurements: 2 blocks of one launch per SM; units per block
};

inline Options& options() {
  static Options o = [] {
    const char* pdl = getenv("NINFER_PDL");
    const char* stages = getenv("NINFER_GEMV5_STAGES");
    return Options{pdl != nullptr && pdl[0] == '0' ? 0 : 1, stages != nullptr ? atoi(stages) : 0, 1, 0};
  }();
  return o;
}

struct Weight {
  uint32_t fmt, rows;  // V5_FMT_*, weight rows
  const void* base;
  const void* high;    // q5/q6 (else ignored)
  const void* scales;  // q4/q5/q6 (else ignored)
};

struct Request {
  uint32_t mode = V5_MODE_PLAIN, batch = 1, k = 0, nw = 0, nout = 0, y_f32 = 0;
  const void* x = nullptr;         // bf16 [batch, k]
  const void* residual = nullptr;  // bf16 [batch, rows] (add mode)
  Weight w[NINFER_V5_MAX_SEGS];
  uint32_t out_of[NINFER_V5_MAX_SEGS] = {};  // output of each weight (plain mode; in order)
  void* y[NINFER_V5_MAX_OUTS] = {};
};

struct DeviceInfo {
  uint32_t n_sm, smem_per_sm, smem_optin;
};

struct Plan {
  V5Params p;
  uint32_t grid, smem;
};

// Fills `out` for one launch of at most 8 batch rows; returns an error message or nullptr.
// `stages` > 0 forces the ring depth; `blocks_per_sm` 2 plans two blocks of this launch per SM;
// `min_units` > 0 replaces NINFER_V5_MIN_UNITS.
inline const char* plan(const Request& r, const DeviceInfo& dev, int stages, Plan* out, int blocks_per_sm = 1,
                        int min_units = 0) {
  V5Params& p = out->p;
  memset(&p, 0, sizeof(p));
  if (r.batch < 1 || r.batch > 8) return "batch must be 1..8 per launch";
  if (r.k == 0 || r.k % NINFER_V5_KSTEP != 0) return "K must be a positive multiple of 128";
  if (r.mode > V5_MODE_ADD) return "unknown mode";
  const uint32_t nseg = r.mode == V5_MODE_SWIGLU ? 1u : r.nw;
  if (r.mode == V5_MODE_SWIGLU && r.nw != 2) return "swiglu takes a gate and an up weight";
  if (r.mode == V5_MODE_ADD && r.nw != 1) return "add takes one weight";
  if (nseg == 0 || nseg > NINFER_V5_MAX_SEGS) return "1..8 weights per launch";
  const uint32_t nout = r.mode == V5_MODE_PLAIN ? r.nout : 1u;
  if (nout == 0 || nout > NINFER_V5_MAX_OUTS) return "1..8 outputs per launch";
  if (r.mode == V5_MODE_SWIGLU && (r.w[0].fmt != r.w[1].fmt || r.w[0].rows != r.w[1].rows || r.w[0].fmt == V5_FMT_BF16))
    return "swiglu needs grouped-int gate and up weights of one format and shape";
  p.x = r.x;
  p.residual = r.residual;
  p.k = r.k;
  p.ksteps = r.k / NINFER_V5_KSTEP;
  p.batch = r.batch;
  p.nseg = nseg;
  p.mode = r.mode;
  p.y_f32 = r.y_f32;
  for (uint32_t o = 0; o < nout; ++o) p.y[o] = r.y[o];
  uint64_t cost = 0;
  uint32_t strip = 0, slot = 0, max_unit = 0, prev_out = 0;
  for (uint32_t i = 0; i < nseg; ++i) {
    const Weight& w = r.w[i];
    V5Segment& s = p.seg[i];
    const bool q = w.fmt == V5_FMT_Q4 || w.fmt == V5_FMT_Q5 || w.fmt == V5_FMT_Q6;
    if (!q && w.fmt != V5_FMT_BF16) return "weight format must be q4, q5, q6 or bf16";
    if (w.rows == 0 || w.rows % (q ? 16u : 8u) != 0) return "weight rows must be a multiple of 16 (q4/q5/q6) or 8 (bf16)";
    s.fmt = w.fmt;
    s.rows = w.rows;
    for (int t = 0; t < 2; ++t) {
      const Weight& src = r.mode == V5_MODE_SWIGLU ? r.w[t] : w;
      s.base[t] = src.base;
      s.high[t] = w.fmt == V5_FMT_Q5 || w.fmt == V5_FMT_Q6 ? src.high : src.base;
      s.scales[t] = q ? src.scales : src.base;
    }
    s.items = w.fmt == V5_FMT_BF16 ? w.rows / 8u : r.mode == V5_MODE_SWIGLU ? w.rows / 16u : (w.rows + 31u) / 32u;
    s.strips = (s.items + NINFER_V5_WARPS - 1) / NINFER_V5_WARPS;
    s.strip0 = strip;
    s.cost0 = cost;
    s.full_cost = 0;
    for (uint32_t j = 0; j < NINFER_V5_WARPS && j < s.items; ++j) s.full_cost += v5_item_cost(s, r.mode, j);
    s.last_cost = 0;
    for (uint32_t j = (s.strips - 1) * NINFER_V5_WARPS; j < s.items; ++j) s.last_cost += v5_item_cost(s, r.mode, j);
    cost += (uint64_t(s.strips - 1) * s.full_cost + s.last_cost) * p.ksteps;
    strip += s.strips;
    max_unit = s.full_cost > max_unit ? s.full_cost : max_unit;
    slot = v5_stage_bytes(w.fmt) > slot ? v5_stage_bytes(w.fmt) : slot;
    const uint32_t o = r.mode == V5_MODE_PLAIN ? r.out_of[i] : 0u;
    if (o >= nout || o < prev_out) return "weights must be grouped by output, in output order";
    prev_out = o;
    s.out = o;
    s.out_row0 = p.y_rows[o];
    p.y_rows[o] += w.rows;
  }
  for (uint32_t o = 0; o < nout; ++o)
    if (p.y_rows[o] == 0) return "an output has no weight";
  p.units = strip * p.ksteps;
  p.total_cost = cost;
  // at most one block per SM, each with at least one unit (cost share >= the largest unit) and, for tiny
  // launches, NINFER_V5_MIN_UNITS units (fewer pieces for the split strips' reduction)
  uint64_t nblk = cost / max_unit;
  const uint32_t per_block = min_units > 0 ? uint32_t(min_units) : NINFER_V5_MIN_UNITS;
  if (nblk > p.units / per_block) nblk = p.units / per_block;
  uint64_t max_blocks = uint64_t(dev.n_sm) * (blocks_per_sm > 1 ? 2u : 1u);
  if (max_blocks > NINFER_V5_MAX_BLOCKS) max_blocks = NINFER_V5_MAX_BLOCKS;
  p.nblk = static_cast<uint32_t>(nblk < 1 ? 1 : nblk > max_blocks ? max_blocks : nblk);
  for (uint32_t b = 0; b <= p.nblk; ++b) p.blk_u0[b] = v5_first_unit(p, b);
  // ring: two launches per SM (the next PDL launch prefetches beside this one) unless this launch
  // is long or the half SM holds fewer than 3 stages; then the whole SM
  const uint32_t fixed = NINFER_V5_XSLOTS * NINFER_V5_XSLOT;
  const uint32_t half = dev.smem_per_sm / 2u - kReservedShared - kStaticShared;
  const uint32_t full = dev.smem_optin - kStaticShared;
  const uint32_t per_stage = NINFER_V5_WARPS * slot;
  uint32_t budget = (cost >= kLongLaunch && blocks_per_sm < 2) || NINFER_V5_MIN_BLOCKS < 2 ? full : (half < full ? half : full);
  if (budget < fixed + 3u * per_stage) budget = full;
  uint32_t n = stages > 0 ? uint32_t(stages) : (budget - fixed) / per_stage;
  n = n < 2u ? 2u : n > NINFER_V5_MAX_STAGES ? NINFER_V5_MAX_STAGES : n;
  if (fixed + n * per_stage > full) return "shared memory too small for two ring stages";
  p.stages = n;
  p.slot_bytes = slot;
  out->grid = p.nblk;
  out->smem = fixed + n * per_stage;
  return nullptr;
}

// A loaded module in one CUDA context, with the launcher-owned workspace.
struct Context {
  CUcontext ctx;
  const void* image;
  CUfunction fn[2];  // bf16, fp32 output
  CUdeviceptr ws, cnt;
  DeviceInfo info;
};

inline const Context* context(const void* image, CUstream stream, std::string* err) {
  constexpr int kMax = 16;
  static Context table[kMax];
  static int used = 0;
  static std::mutex mutex;
  const Driver* d = driver();
  if (d == nullptr) {
    *err = "cannot load libcuda.so.1 or it lacks a driver symbol";
    return nullptr;
  }
  CUcontext ctx = nullptr;
  if (d->ctx_get_current(&ctx) != 0 || ctx == nullptr) {
    *err = "no current CUDA context";
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(mutex);
  for (int i = 0; i < used; ++i)
    if (table[i].ctx == ctx && table[i].image == image) return &table[i];
  if (used == kMax) {
    *err = "too many CUDA contexts";
    return nullptr;
  }
  Context c{};
  c.ctx = ctx;
  c.image = image;
  CUdevice dev = 0;
  int n_sm = 0, smem_sm = 0, optin = 0;
  CUresult rc = d->ctx_get_device(&dev);
  if (rc == 0) rc = d->device_get_attribute(&n_sm, kDevAttrSmCount, dev);
  if (rc == 0) rc = d->device_get_attribute(&smem_sm, kDevAttrSmemPerSm, dev);
  if (rc == 0) rc = d->device_get_attribute(&optin, kDevAttrSmemOptin, dev);
  CUmodule mod = nullptr;
  if (rc == 0) rc = d->module_load_data(&mod, image);
  const char* names[2] = {"ninfer_qgemv5_ybf16", "ninfer_qgemv5_yf32"};
  for (int i = 0; i < 2 && rc == 0; ++i) {
    rc = d->module_get_function(&c.fn[i], mod, names[i]);
    if (rc == 0) rc = d->func_set_attribute(c.fn[i], kFuncMaxDynamicShared, optin - int(kStaticShared));
  }
  c.info = DeviceInfo{uint32_t(n_sm), uint32_t(smem_sm), uint32_t(optin)};
  // workspace for the most blocks a plan may use (two per SM, see plan)
  const size_t blocks = size_t(kMaxBlocksPerSm) * n_sm;
  const size_t ws_bytes = blocks * 2 * NINFER_V5_WARPS * 256 * sizeof(float);
  if (rc == 0) rc = d->mem_alloc(&c.ws, ws_bytes);
  if (rc == 0) rc = d->mem_alloc(&c.cnt, blocks * sizeof(uint32_t));
  if (rc == 0) rc = d->memset_d32_async(c.cnt, 0u, blocks, stream);
  if (rc != 0) {
    *err = "CUDA driver call failed while loading the kernels (error " + std::to_string(rc) + ")";
    return nullptr;
  }
  table[used] = c;
  return &table[used++];
}

// Runs `r` (any batch: chunks of 8 rows, each one launch) on `stream`; "" on success.
inline std::string run(Request r, const void* image, CUstream stream) {
  std::string err;
  const Context* c = context(image, stream, &err);
  if (c == nullptr) return err;
  const uint32_t rows = r.batch;
  const bool pdl = options().pdl != 0;
  for (uint32_t r0 = 0; r0 < rows; r0 += 8) {
    Request q = r;
    q.batch = rows - r0 < 8 ? rows - r0 : 8;
    Plan pl;
    const char* e = plan(q, c->info, options().stages, &pl, options().blocks_per_sm, options().min_units);
    if (e != nullptr) return e;
    if (pl.grid > kMaxBlocksPerSm * c->info.n_sm) return "plan has more blocks than the workspace holds";
    const size_t es = r.y_f32 ? 4 : 2;
    pl.p.x = static_cast<const char*>(r.x) + size_t(r0) * r.k * 2;
    if (r.residual != nullptr) pl.p.residual = static_cast<const char*>(r.residual) + size_t(r0) * pl.p.y_rows[0] * 2;
    for (uint32_t o = 0; o < NINFER_V5_MAX_OUTS; ++o)
      if (pl.p.y[o] != nullptr) pl.p.y[o] = static_cast<char*>(r.y[o]) + size_t(r0) * pl.p.y_rows[o] * es;
    pl.p.ws = reinterpret_cast<float*>(c->ws);
    pl.p.cnt = reinterpret_cast<uint32_t*>(c->cnt);
    LaunchAttr attr = ninfer_launch::programmatic_serialization();
    LaunchConfig cfg{pl.grid, 1, 1, kThreads, 1, 1, pl.smem, stream, pdl ? &attr : nullptr, pdl ? 1u : 0u};
    void* args[] = {&pl.p};
    const CUresult rc = driver()->launch_ex(&cfg, c->fn[r.y_f32 ? 1 : 0], args, nullptr);
    if (rc != 0) return "launch failed with CUDA error " + std::to_string(rc);
  }
  return "";
}

}  // namespace ninfer_gemv5

#ifndef NINFER_GEMV5_NO_TVM
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>

// NINFER_QGEMV5_FATBIN (unsigned char[]) is prepended by the build (ops/qgemv.py).

namespace {

using ninfer_gemv5::Request;
using ninfer_gemv5::Weight;
using tvm::ffi::AnyView;
using tvm::ffi::TensorView;

const void* address(const TensorView& t) { return static_cast<const char*>(t.data_ptr()) + t.byte_offset(); }
void* mutable_address(const TensorView& t) { return static_cast<char*>(t.data_ptr()) + t.byte_offset(); }

bool is_bf16(const TensorView& t) { return t.dtype().code == kDLBfloat && t.dtype().bits == 16; }
bool is_f32(const TensorView& t) { return t.dtype().code == kDLFloat && t.dtype().bits == 32; }

void check_aligned(const void* p, uintptr_t a, const char* what) {
  TVM_FFI_ICHECK(reinterpret_cast<uintptr_t>(p) % a == 0) << "ninfer_qgemv5: " << what << " must be " << a << "-byte aligned";
}

// x [..., K] (rows = numel / K) -> request fields; the device is x's (checked at the launch, after
// every argument was read, so the argument layout can be checked on a machine without a GPU).
Request start(const TensorView& x, uint32_t mode) {
  TVM_FFI_ICHECK(is_bf16(x)) << "ninfer_qgemv5: x must be bf16";
  Request r;
  r.mode = mode;
  const int64_t k = x.shape()[x.ndim() - 1];
  r.k = static_cast<uint32_t>(k);
  r.batch = static_cast<uint32_t>(x.numel() / k);
  r.x = address(x);
  check_aligned(r.x, 16, "x");
  return r;
}

Weight weight(int64_t fmt, const TensorView& base, const TensorView& high, const TensorView& scales, uint32_t k) {
  Weight w;
  w.fmt = static_cast<uint32_t>(fmt);
  w.rows = static_cast<uint32_t>(base.shape()[0]);
  w.base = address(base);
  w.high = address(high);
  w.scales = address(scales);
  check_aligned(w.base, 16, "base");
  if (fmt == V5_FMT_BF16) {
    TVM_FFI_ICHECK(is_bf16(base) && base.shape()[1] == k) << "ninfer_qgemv5: a bf16 weight must be [rows, K] bf16";
  } else {
    TVM_FFI_ICHECK(base.shape()[1] == k / 2) << "ninfer_qgemv5: base plane is not [rows, K / 2]";
    if (fmt != V5_FMT_Q4) check_aligned(w.high, 16, "high");
    check_aligned(w.scales, 4, "scales");
  }
  return w;
}

void launch(Request& r, const TensorView& x) {
  TVM_FFI_ICHECK(x.device().device_type == kDLCUDA) << "ninfer_qgemv5: x must be on a CUDA device";
  void* stream = TVMFFIEnvGetStream(kDLCUDA, x.device().device_id);
  const std::string err = ninfer_gemv5::run(r, NINFER_QGEMV5_FATBIN, stream);
  TVM_FFI_ICHECK(err.empty()) << "ninfer_qgemv5: " << err;
}

void set_output(Request& r, uint32_t o, const TensorView& y) {
  TVM_FFI_ICHECK(is_bf16(y) || is_f32(y)) << "ninfer_qgemv5: outputs must be bf16 or fp32";
  r.y_f32 = is_f32(y) ? 1u : 0u;
  r.y[o] = mutable_address(y);
}

// (x, fmt, gate base, high, scales, up base, high, scales, y): y = silu(x Wg^T) * (x Wu^T).
void swiglu(TensorView x, int64_t fmt, TensorView gb, TensorView gh, TensorView gs, TensorView ub, TensorView uh,
            TensorView us, TensorView y) {
  Request r = start(x, V5_MODE_SWIGLU);
  r.nw = 2;
  r.w[0] = weight(fmt, gb, gh, gs, r.k);
  r.w[1] = weight(fmt, ub, uh, us, r.k);
  r.nout = 1;
  set_output(r, 0, y);
  launch(r, x);
}

// (x, fmt, base, high, scales, residual, y): y = residual + x W^T.
void add(TensorView x, int64_t fmt, TensorView base, TensorView high, TensorView scales, TensorView residual,
         TensorView y) {
  Request r = start(x, V5_MODE_ADD);
  r.nw = 1;
  r.w[0] = weight(fmt, base, high, scales, r.k);
  TVM_FFI_ICHECK(is_bf16(residual) && residual.numel() == int64_t(r.batch) * r.w[0].rows)
      << "ninfer_qgemv5: residual must be bf16 [b, 1, rows]";
  r.residual = address(residual);
  r.nout = 1;
  set_output(r, 0, y);
  launch(r, x);
}

}  // namespace

// (x, n_out, n_0 .. n_{n_out-1}, then per weight: fmt, base, high, scales, then y_0 .. y_{n_out-1}):
// output o is the concatenation of x W^T over its n_o weights.
extern "C" TVM_FFI_DLL_EXPORT int __tvm_ffi_ninfer_qgemv5_multi(void*, const TVMFFIAny* packed, int32_t num_args,
                                                              TVMFFIAny* result) {
  TVM_FFI_SAFE_CALL_BEGIN();
  const AnyView* a = reinterpret_cast<const AnyView*>(packed);
  TVM_FFI_ICHECK(num_args >= 2) << "ninfer_qgemv5_multi: too few arguments";
  const TensorView x = a[0].cast<TensorView>();
  Request r = start(x, V5_MODE_PLAIN);
  const int64_t nout = a[1].cast<int64_t>();
  TVM_FFI_ICHECK(nout >= 1 && nout <= NINFER_V5_MAX_OUTS && num_args >= 2 + nout) << "ninfer_qgemv5_multi: bad n_out";
  int i = 2 + static_cast<int>(nout);
  for (int64_t o = 0; o < nout; ++o) {
    const int64_t n = a[2 + o].cast<int64_t>();
    for (int64_t j = 0; j < n; ++j) {
      TVM_FFI_ICHECK(r.nw < NINFER_V5_MAX_SEGS && i + 4 <= num_args) << "ninfer_qgemv5_multi: bad weight list";
      r.out_of[r.nw] = static_cast<uint32_t>(o);
      r.w[r.nw++] = weight(a[i].cast<int64_t>(), a[i + 1].cast<TensorView>(), a[i + 2].cast<TensorView>(),
                           a[i + 3].cast<TensorView>(), r.k);
      i += 4;
    }
  }
  TVM_FFI_ICHECK(i + nout == num_args) << "ninfer_qgemv5_multi: expected " << i + nout << " arguments, got " << num_args;
  r.nout = static_cast<uint32_t>(nout);
  for (int64_t o = 0; o < nout; ++o) set_output(r, static_cast<uint32_t>(o), a[i + o].cast<TensorView>());
  launch(r, x);
  reinterpret_cast<tvm::ffi::Any*>(result)->operator=(nullptr);
  TVM_FFI_SAFE_CALL_END();
}

TVM_FFI_DLL_EXPORT_TYPED_FUNC(ninfer_qgemv5_swiglu, swiglu);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(ninfer_qgemv5_add, add);
#endif  // NINFER_GEMV5_NO_TVM

#ifdef NINFER_GEMV5_CAPI
namespace {
ninfer_gemv5::Request c_request(uint32_t mode, const void* x, const void* residual, uint32_t batch, uint32_t k,
                                uint32_t nw, const uint32_t* fmt, const uint32_t* rows, const void* const* base,
                                const void* const* high, const void* const* scales, const uint32_t* out_of,
                                uint32_t nout, void* const* y, uint32_t y_f32) {
  ninfer_gemv5::Request r;
  r.mode = mode;
  r.x = x;
  r.residual = residual;
  r.batch = batch;
  r.k = k;
  r.nw = nw;  // plan() refuses more than NINFER_V5_MAX_SEGS
  for (uint32_t i = 0; i < nw && i < NINFER_V5_MAX_SEGS; ++i) {
    r.w[i] = ninfer_gemv5::Weight{fmt[i], rows[i], base[i], high[i], scales[i]};
    r.out_of[i] = out_of[i];
  }
  r.nout = nout;
  for (uint32_t o = 0; o < nout && o < NINFER_V5_MAX_OUTS; ++o) r.y[o] = y[o];
  r.y_f32 = y_f32;
  return r;
}

void c_error(const std::string& e, char* err, uint32_t len) {
  if (err != nullptr && len > 0) {
    strncpy(err, e.c_str(), len - 1);
    err[len - 1] = 0;
  }
}
}  // namespace

// Plans one launch (batch <= 8) for a device with these properties; 0 on success.
extern "C" int ninfer_gemv5_plan(uint32_t mode, uint32_t batch, uint32_t k, uint32_t nw, const uint32_t* fmt,
                                 const uint32_t* rows, const void* const* base, const void* const* high,
                                 const void* const* scales, const uint32_t* out_of, uint32_t nout, uint32_t n_sm,
                                 uint32_t smem_per_sm, uint32_t smem_optin, int stages, V5Params* out, uint32_t* grid,
                                 uint32_t* smem, char* err, uint32_t err_len) {
  void* y[NINFER_V5_MAX_OUTS] = {};
  for (uint32_t o = 0; o < NINFER_V5_MAX_OUTS; ++o) y[o] = reinterpret_cast<void*>(uintptr_t(0x1000 * (o + 1)));
  const ninfer_gemv5::Request r =
      c_request(mode, nullptr, nullptr, batch, k, nw, fmt, rows, base, high, scales, out_of, nout, y, 0);
  ninfer_gemv5::Plan pl;
  const char* e = ninfer_gemv5::plan(r, ninfer_gemv5::DeviceInfo{n_sm, smem_per_sm, smem_optin}, stages, &pl);
  if (e != nullptr) {
    c_error(e, err, err_len);
    return 1;
  }
  *out = pl.p;
  *grid = pl.grid;
  *smem = pl.smem;
  return 0;
}

// The functions of qgemv5_plan.h, for the CPU tests.
extern "C" uint64_t ninfer_gemv5_prefix(const V5Params* p, uint32_t u) { return v5_prefix(*p, u); }
extern "C" uint32_t ninfer_gemv5_owner(const V5Params* p, uint32_t u) { return v5_owner(*p, u); }
extern "C" uint32_t ninfer_gemv5_first_unit(const V5Params* p, uint32_t b) { return v5_first_unit(*p, b); }
extern "C" uint32_t ninfer_gemv5_owner_of(const V5Params* p, uint32_t u) { return v5_owner_of(*p, u); }
extern "C" uint32_t ninfer_gemv5_params_size() { return sizeof(V5Params); }

// Overrides NINFER_PDL and NINFER_GEMV5_STAGES for this process, the blocks per SM and the units per
// block (measurements; stages 0 = planned, blocks_per_sm 1 and min_units 0 = the default plan).
extern "C" void ninfer_gemv5_set_options(int pdl, int stages, int blocks_per_sm, int min_units) {
  ninfer_gemv5::options() = ninfer_gemv5::Options{pdl, stages, blocks_per_sm, min_units};
}

// Runs one request on `stream` (any batch); 0 on success.
extern "C" int ninfer_gemv5_run(const void* image, void* stream, uint32_t mode, const void* x, const void* residual,
                                uint32_t batch, uint32_t k, uint32_t nw, const uint32_t* fmt, const uint32_t* rows,
                                const void* const* base, const void* const* high, const void* const* scales,
                                const uint32_t* out_of, uint32_t nout, void* const* y, uint32_t y_f32, char* err,
                                uint32_t err_len) {
  const ninfer_gemv5::Request r =
      c_request(mode, x, residual, batch, k, nw, fmt, rows, base, high, scales, out_of, nout, y, y_f32);
  const std::string e = ninfer_gemv5::run(r, image, stream);
  c_error(e, err, err_len);
  return e.empty() ? 0 : 1;
}
#endif  // NINFER_GEMV5_CAPI
