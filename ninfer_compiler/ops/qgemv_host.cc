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

#include <stdlib.h>

#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

// NINFER_QGEMV_FATBIN (unsigned char[]) and cuda_launch.h are prepended by the build (ops/qgemv.py).

namespace {

typedef int CUresult;
typedef void* CUmodule;
typedef void* CUfunction;
typedef void* CUcontext;
typedef void* CUstream;

using ninfer_launch::LaunchAttr;
using ninfer_launch::LaunchConfig;

struct Driver {
  CUresult (*ctx_get_current)(CUcontext*);
  CUresult (*module_load_data)(CUmodule*, const void*);
  CUresult (*module_get_function)(CUfunction*, CUmodule, const char*);
  CUresult (*launch_ex)(const LaunchConfig*, CUfunction, void**, void**);
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
    out.launch_ex = reinterpret_cast<decltype(out.launch_ex)>(dlsym(lib, "cuLaunchKernelEx"));
    out.func_set_attribute = reinterpret_cast<decltype(out.func_set_attribute)>(dlsym(lib, "cuFuncSetAttribute"));
    TVM_FFI_ICHECK(out.ctx_get_current && out.module_load_data && out.module_get_function && out.launch_ex &&
                   out.func_set_attribute)
        << "ninfer_gemv: libcuda.so.1 lacks a driver symbol";
    return out;
  }();
  return d;
}

// Kernel names of this build, indexed by kernel_index / dense_index.
#ifndef NINFER_GEMV_DENSE_ONLY
// v2: 4 formats x 4 batch sizes x 2 dtypes; v3: q4/q5/q6; v4 (the launcher's entries): q4/q5/q6 x
// 4 epilogues, the mixed q4 + q5 multi entry, on int8 activations q4 plain / SwiGLU / add, q5 add
// and the mixed multi, and the q5 add quantizing its bf16 activations itself; the decode norm with
// int8 output (fp32 / bf16 weight) and the SwiGLU / mixed multi computing that norm themselves
constexpr int kKernels = 32 + 3 + 12 + 1 + 5 + 1 + 2 + 2;
constexpr int kMulti45Index = 47;
constexpr int kI8Index = 48;  // + 0: q4 plain, + 1: q4 SwiGLU, + 2: q4 add, + 3: q5 add (`v4_stage_i8`)
constexpr int kMulti45I8Index = 52;
constexpr int kSelfI8Index = 53;  // ninfer_qgemv4e_q5_add_i8s
constexpr int kNormXqIndex = 54;   // + 0: ninfer_rms_norm_xq_wf32, + 1: ninfer_rms_norm_xq_wbf16
constexpr int kSwigluI8nIndex = 56;   // ninfer_qgemv4e_q4_swiglu_i8n (the norm in the prologue, XQN)
constexpr int kMulti45I8nIndex = 57;  // ninfer_qgemv4e_q45_multi_i8n
// Which `ninfer_qgemv_norm_*` calls compute the norm in the launch's prologue at one row (bit 0: the
// mixed multi, bit 1: the SwiGLU); the others launch the norm kernel first (a measurement knob).
#define NINFER_V4_XQN_LAUNCHES 3
constexpr uint32_t kXqnUnitBytes = 528;  // qgemv_cuda.cu V4_XQN_UNIT: a block's activations per 256 k
constexpr int64_t kXqnMaxK = 8192;       // the XQN prologue's K (qgemv_cuda.cu NORM_VECS x 8 x 256)
constexpr uint32_t kXqGroups = 8192;  // qgemv_cuda.cu V4_XQ_GROUPS: the SwiGLU's xq output has <= 64 x this

// v4's ring depth per format; must equal the kernel's (tests/compiler/ops/test_qgemv_v4.py checks).
#define NINFER_V4_STAGES_Q4 2
#define NINFER_V4_STAGES_Q5 2
#define NINFER_V4_STAGES_Q6 2
constexpr uint32_t kV4MaxWarps = 8;
// The largest K split of a q5 residual-add or plain v4 launch at one or two activation rows (a
// measurement knob: `bench_27b.py prepare --variant NAME=NINFER_V4_Q5_KS_FEW_ROWS=4`; 8 caps nothing).
// Per launch the down projection ran 6% faster at ks 4 than at 8 with 1-2 rows, slower with 4-8
// (docs/kernels/decode-gemv-v4.md, "twelfth pass").
#define NINFER_V4_Q5_KS_FEW_ROWS 8
// The largest K split of a q5 v4 launch over K <= 8,192 (`choose_ks_v4`): plain and residual-add
// launches (`run`; 8: no cap of their own; a SwiGLU keeps its cap of 4), and the q5 part of the
// multi launches (4). Per
// launch on the H200, v4.1 found 4 faster with a ring of 3 stages; in the 27B decode graph (2-stage
// ring, PDL) the GDN output projection, launched while the GDN step holds 48 SMs, took 12.6 us at
// ks 4 (4-warp blocks, six fit an SM) and 9.3 us at ks 8 on an H100, the multi launches were
// slower at 8 (docs/kernels/decode-gemv-v4.md, "twenty-first pass"). Measurement knobs.
#define NINFER_V4_Q5_KS_CAP 8
#define NINFER_V4_Q5_KS_CAP_MULTI 4
// ... and of the q4 part of a mixed multi launch (a measurement knob; 8: the launcher's choice). With
// `NINFER_V4_Q5_KS_CAP_MULTI=2` a cap of 4 makes the 27B multi launches one wave of blocks (640 / 672
// blocks of 4 warps, six fit an SM, against 640 / 672 of 8 warps, three an SM: 1.6 / 1.7 waves):
// `--variant onewave=NINFER_V4_MULTI_KS4_CAP=4,NINFER_V4_Q5_KS_CAP_MULTI=2`.
#define NINFER_V4_MULTI_KS4_CAP 8
// Whether a q5 residual add at one activation row without int8 activations from its producer runs
// the int8 stages on activations each warp quantizes itself (`ninfer_qgemv4e_q5_add_i8s`; 0: the
// bf16 entry). NINFER_GEMV_INT8=0 at run time turns it off too. Off: measured slower on the H200
// where it matters (down 28.49 -> 31.05 us, out 12.36 -> 11.51; the 27B step 6.729 -> 7.209 ms;
// docs/kernels/decode-gemv-v4.md "thirteenth pass"); `--variant self=NINFER_V4_SELF_I8=1` measures it.
#ifndef NINFER_V4_SELF_I8
#define NINFER_V4_SELF_I8 0
#endif
// The most activation rows at which the SwiGLU hands its output to the down projection as int8
// activations (`qgemv_swiglu_i8x` -> `qgemv_add_i8h`; above it both run on bf16). The handover's
// cross-block step pays at one row only: SwiGLU + down 60.29 -> 57.30 us at b = 1, 61.34 -> 62.92 at
// b = 2, 61.91 -> 62.75 at b = 4 (docs/kernels/decode-gemv-v4.md, "ninth pass"). Up to 4.
#ifndef NINFER_XQ_HANDOVER_ROWS
#define NINFER_XQ_HANDOVER_ROWS 1
#endif
// Measurement switch, the kernels' of the same name (the variant builds pass both): the SwiGLU's
// handover inside thread block clusters, one per 64-group of outputs (1: `v4_xq_out_cluster`, whose
// leader block holds the group's outputs past its ring; 2: clusters, the count-in handover kept).
#ifndef NINFER_V4_XQ_CLUSTER
#define NINFER_V4_XQ_CLUSTER 0
#endif
// Measurement switch, the kernels' of the same name (the variant builds pass both): the K split of a
// SwiGLU that writes its int8 output (`ninfer_qgemv_swiglu_i8x`, one row; 0: the launcher's, 4 on the
// 27B, so 4 blocks write each 64-group and count themselves in). 1: 8 warps of whole-K tiles, 4 output
// tiles a block, every block quantizes its own groups (no count, no fence). With the kernel feature
// `gemv_int8_mlp_kernel` off this replaces the quantize kernel: `--variant
// xqks1=-gemv_int8_mlp_kernel,NINFER_V4_SWIGLU_XQ_KS=1`.
#ifndef NINFER_V4_SWIGLU_XQ_KS
#define NINFER_V4_SWIGLU_XQ_KS 0
#endif
// The largest K split of a SwiGLU launch (a measurement knob: 4 keeps its blocks at 8 warps of 2
// gate / up pairs, 1,088 blocks on the 27B; 2 or 1: fewer, longer warps, e.g. `--variant
// swks2=NINFER_V4_SWIGLU_KS_CAP=2`).
#define NINFER_V4_SWIGLU_KS_CAP 4
constexpr uint32_t kXqClusterBytes = 4 * 64 * 2;  // qgemv_cuda.cu V4_XQC_BYTES

// v4 epilogues (V4Mode in qgemv_cuda.cu) and the kernel's by-value parameter `V4Epi`.
enum V4Mode : uint32_t { V4_PLAIN = 0, V4_ADD = 1, V4_SWIGLU = 2, V4_MULTI = 3 };
constexpr uint32_t V4_SEGS = 4;
struct V4Epi {
  const void* up_base;
  const void* up_high;
  const void* up_scales;
  const void* residual;
  uint32_t y_stride;
  uint32_t seg_end[V4_SEGS];
  uint32_t seg_stride[V4_SEGS];
  const void* seg_base[V4_SEGS];
  const void* seg_high[V4_SEGS];
  const void* seg_scales[V4_SEGS];
  void* seg_y[V4_SEGS];
  const void* x_scales;
  void* xq_out;
  const void* norm_w;
  void* norm_y;
  void* norm_xq;
  float norm_eps;
  float norm_offset;
  uint32_t norm_wbf16;
};

// The RMS norm a residual-add launch also computes of its output (`v4_add_norm`): weight (fp32, or
// bf16 when wbf16), eps, offset, the normalized rows `y` and, unless nullptr, rows 0..3 of them as
// int8 activations `xq`.
struct NormOut {
  const void* w;
  bool wbf16;
  float eps, offset;
  char* y;
  char* xq;
};

// The decode RMS norm whose output a SwiGLU / mixed multi launch reads (`ninfer_qgemv_norm_*`): its
// input x (bf16 rows), weight (fp32, or bf16 when wbf16), eps, offset, and where the normalized rows
// `y` and their int8 activations `xq` (rows 0..3) go. At one row the int8 entry computes it in its
// prologue (XQN: writes y, not xq); otherwise the norm kernel runs first (`norm_xq_launch`).
struct NormIn {
  const char* x;
  const void* w;
  bool wbf16;
  float eps, offset;
  char* y;
  char* xq;
};

// Dynamic shared memory of a v4 block: warps x stages x (16 rows x 4 groups of base, high, scales).
// `x_staged`: an int8 entry at one activation row, whose slots also hold 512 bytes of activations
// (`self_quantized`: and their 4 scales, 16 bytes).
uint32_t v4_smem(int bits, uint32_t warps, bool x_staged = false, bool self_quantized = false) {
  const uint32_t hb = bits == 5 ? 8 : bits == 6 ? 16 : 0;
  const uint32_t stages = bits == 4 ? NINFER_V4_STAGES_Q4 : bits == 5 ? NINFER_V4_STAGES_Q5 : NINFER_V4_STAGES_Q6;
  return warps * stages * (16 * 128 + 16 * 4 * hb + 16 * 8 + (x_staged ? 512 : 0) + (self_quantized ? 16 : 0));
}

int kernel_index(int bits, int batch, bool f32) {
  const int fmt = bits == 4 ? 0 : bits == 5 ? 1 : bits == 6 ? 2 : 3;
  const int bi = batch == 1 ? 0 : batch == 2 ? 1 : batch == 4 ? 2 : 3;
  return (f32 ? 16 : 0) + fmt * 4 + bi;
}

int v3_index(int bits) { return 32 + (bits - 4); }
int v4_index(int bits, uint32_t mode) { return 35 + 4 * (bits - 4) + static_cast<int>(mode); }

std::string kernel_name(int i) {
  if (i >= kI8Index) {
    const char* names[10] = {"ninfer_qgemv4e_q4_plain_i8", "ninfer_qgemv4e_q4_swiglu_i8", "ninfer_qgemv4e_q4_add_i8",
                             "ninfer_qgemv4e_q5_add_i8", "ninfer_qgemv4e_q45_multi_i8", "ninfer_qgemv4e_q5_add_i8s",
                             "ninfer_rms_norm_xq_wf32", "ninfer_rms_norm_xq_wbf16", "ninfer_qgemv4e_q4_swiglu_i8n",
                             "ninfer_qgemv4e_q45_multi_i8n"};
    return names[i - kI8Index];
  }
  if (i == kMulti45Index) return "ninfer_qgemv4e_q45_multi";
  if (i >= 35) {
    const char* modes[4] = {"plain", "add", "swiglu", "multi"};
    return "ninfer_qgemv4e_q" + std::to_string((i - 35) / 4 + 4) + "_" + modes[(i - 35) % 4];
  }
  if (i >= 32) return "ninfer_qgemv3_q" + std::to_string(i - 32 + 4) + "_ybf16";
  const int all_bits[4] = {4, 5, 6, 8};
  const int batches[4] = {1, 2, 4, 8};
  return "ninfer_qgemv_q" + std::to_string(all_bits[(i % 16) / 4]) + "_b" + std::to_string(batches[i % 4]) +
         (i >= 16 ? "_f32" : "_bf16");
}
#else
constexpr int kKernels = 4 + 4;  // batch 1, 2, 4, 8; the RMS norm with an fp32 / bf16 weight, without / with xq
constexpr int kNormIndex = 4;

int dense_index(int batch) { return batch == 1 ? 0 : batch == 2 ? 1 : batch <= 4 ? 2 : 3; }

std::string kernel_name(int i) {
  if (i >= kNormIndex) {
    const char* names[4] = {"ninfer_rms_norm_wf32", "ninfer_rms_norm_wbf16", "ninfer_rms_norm_xq_wf32",
                            "ninfer_rms_norm_xq_wbf16"};
    return names[i - kNormIndex];
  }
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
    if (i >= 35 && i != kNormXqIndex && i != kNormXqIndex + 1) {  // v4 asks for more than the 48 KB that need no opt-in
      const uint32_t xqn = static_cast<uint32_t>(kXqnMaxK / 256) * kXqnUnitBytes;
      rc = d.func_set_attribute(fn, 8 /* CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES */,
                                static_cast<int>(i == kSwigluI8nIndex    ? v4_smem(4, kV4MaxWarps) + xqn
                                                 : i == kMulti45I8nIndex ? std::max(v4_smem(4, kV4MaxWarps), v4_smem(5, kV4MaxWarps)) + xqn
                                                 : i == kSelfI8Index ? v4_smem(5, kV4MaxWarps, true, true)
                                                 : i == kMulti45I8Index
                                                     ? std::max(v4_smem(4, kV4MaxWarps, true), v4_smem(5, kV4MaxWarps, true))
                                                 : i >= kI8Index ? v4_smem(i == kI8Index + 3 ? 5 : 4, kV4MaxWarps, true) +
                                                                       (i == kI8Index + 1 && NINFER_V4_XQ_CLUSTER == 1 ? kXqClusterBytes : 0)
                                                 : i == kMulti45Index
                                                     ? std::max(v4_smem(4, kV4MaxWarps), v4_smem(5, kV4MaxWarps))
                                                     : v4_smem((i - 35) / 4 + 4, kV4MaxWarps)));
      TVM_FFI_ICHECK(rc == 0) << "ninfer_gemv: cuFuncSetAttribute failed with " << rc;
    }
#endif
    const int carveout = ninfer_launch::apply_smem_carveout(d, fn);
    TVM_FFI_ICHECK(carveout != ninfer_launch::kCarveoutInvalid)
        << "ninfer_gemv: NINFER_SMEM_CARVEOUT must be a percentage 0..100, not " << getenv("NINFER_SMEM_CARVEOUT");
    TVM_FFI_ICHECK(carveout == 0) << "ninfer_gemv: setting the shared memory carveout of " << name << " failed with " << carveout;
    entry.fn[i] = fn;
  }
  ++g_count;
  return entry.fn[index];
}

// Address of the first element (TVM's memory planner may hand out tensors with a byte offset).
char* address(const tvm::ffi::TensorView& t) {
  return static_cast<char*>(t.data_ptr()) + t.byte_offset();
}

// Programmatic Dependent Launch for every launch unless NINFER_PDL=0 (`ninfer_launch::pdl_enabled`;
// the 27B decode step on the H200: 8.65 -> 8.27 ms, docs/kernels/decode-gemv-v4.md "v4.2"). The
// kernels wait for the previous kernel before touching anything it may write (qgemv_cuda.cu, `pdl_wait`).
using ninfer_launch::pdl_enabled;

#ifndef NINFER_GEMV_DENSE_ONLY
// Whether a multi call merges the v4-capable weights of one format into one launch (the default;
// NINFER_GEMV_MERGE=0: one launch per weight, for measurements).
bool merge_enabled() {
  static const bool on = [] {
    const char* v = getenv("NINFER_GEMV_MERGE");
    return v == nullptr || v[0] != '0';
  }();
  return on;
}

// Whether q4 projections with int8 activations from the norm run the int8 entries (the default;
// NINFER_GEMV_INT8=0: the bf16 ones on the norm's bf16 output, for measurements).
bool int8_enabled() {
  static const bool on = [] {
    const char* v = getenv("NINFER_GEMV_INT8");
    return v == nullptr || v[0] != '0';
  }();
  return on;
}

// Whether q4 and q5 weights of one multi call share a launch (`run_multi45`; NINFER_GEMV_MERGE=2: not).
bool mixed_merge_enabled() {
  static const bool on = [] {
    const char* v = getenv("NINFER_GEMV_MERGE");
    return v == nullptr || v[0] != '2';
  }();
  return on;
}
#endif

// `cluster` > 1: the launch's blocks in clusters of that many (grid % cluster == 0).
void launch(CUfunction fn, uint32_t grid, uint32_t threads, uint32_t smem, CUstream stream, void** args,
            uint32_t cluster = 1) {
  LaunchAttr attrs[2];
  uint32_t n = 0;
  if (pdl_enabled()) attrs[n++] = ninfer_launch::programmatic_serialization();
  if (cluster > 1) attrs[n++] = ninfer_launch::cluster_dimension(cluster);
  LaunchConfig cfg{grid, 1, 1, threads, 1, 1, smem, stream, n ? attrs : nullptr, n};
  const CUresult rc = driver().launch_ex(&cfg, fn, args, nullptr);
  TVM_FFI_ICHECK(rc == 0) << "ninfer_gemv: launch failed with " << rc << " (blocks in clusters of " << cluster << ")";
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
// every 27B projection except the head (15,520 tiles: ks = 1). q5 over K <= 8,192: at most `q5_cap`.
uint32_t choose_ks_v4(int bits, uint32_t n_rows, uint32_t k, uint32_t q5_cap = NINFER_V4_Q5_KS_CAP) {
  const uint32_t tiles = n_rows / 16, units = k / 256;
  const uint32_t cap = bits == 5 && k <= 8192 ? q5_cap : kV4MaxWarps;
  uint32_t ks = 1;
  while (ks < cap && tiles * ks < 8192 && units >= 2 * ks) ks *= 2;
  return ks;
}

// One grouped-int weight's planes (rows x K).
struct Planes {
  const char* base;
  const char* high;
  const char* scales;
  int64_t n;
};

// The planes of a `bits`-bit weight over K = k (row_split_k128_v1: base K / 2 bytes per row, K for
// q8; q5 / q6 high 8 / 16 bytes and one scale per group of 64 lanes, 32 for q8), checked against k
// so that a mismatched weight is an error instead of reads past its rows.
Planes planes(const tvm::ffi::TensorView& base, const tvm::ffi::TensorView& high, const tvm::ffi::TensorView& scales,
              int64_t bits, int64_t k) {
  TVM_FFI_ICHECK(bits == 4 || bits == 5 || bits == 6 || bits == 8) << "ninfer_gemv: no kernel for " << bits << "-bit codes";
  const int64_t groups = k / (bits == 8 ? 32 : 64), hb = bits == 5 ? 8 : bits == 6 ? 16 : 0;
  TVM_FFI_ICHECK(base.ndim() == 2 && scales.ndim() == 2 && high.ndim() == 2 && scales.shape()[0] == base.shape()[0] &&
                 base.shape()[1] == (bits == 8 ? k : k / 2) && scales.shape()[1] == groups &&
                 (hb == 0 || (high.shape()[0] == base.shape()[0] && high.shape()[1] == groups * hb)))
      << "ninfer_gemv: " << bits << "-bit planes base " << base.shape() << ", high " << high.shape() << ", scales "
      << scales.shape() << " do not match K = " << k;
  return Planes{address(base), address(high), address(scales), base.shape()[0]};
}

// Whether a call with int8 activations (`has_xq`) runs an int8 entry: at most 4 rows, q4 plain /
// SwiGLU / add or q5 add, NINFER_GEMV_INT8 not 0. A SwiGLU writing xq for the next projection and
// that projection decide alike, so the xq they share is written whenever it is read.
bool i8_runs(bool has_xq, int64_t rows, int bits, uint32_t mode) {
  return has_xq && rows <= 4 && int8_enabled() &&
         ((bits == 4 && (mode == V4_PLAIN || mode == V4_SWIGLU || mode == V4_ADD)) || (bits == 5 && mode == V4_ADD));
}

// Whether v4 (cp.async ring) can run this weight: bf16 q4/q5/q6, 16-row tiles, K a multiple of its
// 256-lane stage, `high` 16-byte aligned.
bool v4_fits(bool f32, int bits, const Planes& w, int64_t k) {
  return !f32 && bits >= 4 && bits <= 6 && w.n % 16 == 0 && k % 256 == 0 &&
         reinterpret_cast<uintptr_t>(w.high) % 16 == 0;
}

// y[r, y_off + n] (row stride y_stride) for the `rows` activation rows at xp: plain, `residual + ...`
// (V4_ADD) or `silu(...) * (x up^T)` (V4_SWIGLU; `up` has w's shape). The epilogues run on v4 only.
// `xq`: x also as int8 activations (the norm's xq layout, rows <= 4), or nullptr.
// `xq_out` (SwiGLU with xq): y also as int8 activations there, written by the int8 entry (<= 4 rows).
// `norm` (V4_ADD): y's RMS norm too, computed by the launch's last block.
// `pre` (an int8 SwiGLU of one row, K <= kXqnMaxK): xp is pre's output, which the launch computes
// itself from pre's input (the XQN entry) instead of reading xq.
void run(const char* xp, bool f32, int64_t rows, int64_t k, int bits, const Planes& w, char* yp, int64_t y_stride,
         uint32_t mode, const Planes* up, const char* residual, CUstream stream, const char* xq = nullptr,
         char* xq_out = nullptr, const NormOut* norm = nullptr, const NormIn* pre = nullptr) {
  const int64_t n = w.n;
  TVM_FFI_ICHECK(bits == 4 || bits == 5 || bits == 6 || bits == 8) << "ninfer_gemv: no kernel for " << bits << "-bit codes";
  TVM_FFI_ICHECK(k % 128 == 0 && n % 4 == 0) << "ninfer_gemv: unsupported shape";
  // bf16 q4/q5/q6, as measured on the H200 (docs/kernels/decode-gemv-v4.md, b = 1..8):
  // * v4 from 16 Mi weights up (6144x5120 and larger: 8-27% faster than v2 / v3 at every batch);
  // * below that (2048x5120, 1024x5120): v2 at batch 1 (4.3-5.7 us vs v3 5.9-7.1, v4 6.5-7.2) and
  //   v3 from batch 2 (v2's cost grows with the batch; v4 is 5-10% slower there);
  // * v3 where v4 cannot run (K not a multiple of 256, `high` not 16-byte aligned).
  const bool v3_ok = !f32 && bits != 8 && n % 16 == 0;
  const bool small = n * k <= (int64_t{32} << 20);  // v2 at batch 1 (when v4 is not used)
  const bool v4_ok = v4_fits(f32, bits, w, k) && (up == nullptr || v4_fits(f32, bits, *up, k));
  const bool v4_size = n * k >= (int64_t{16} << 20);
  TVM_FFI_ICHECK(mode == V4_PLAIN || v4_ok)
      << "ninfer_gemv: the fused epilogues need bf16 q4/q5/q6 planes, rows % 16 == 0, K % 256 == 0 and 16-byte aligned high";
  const bool swiglu = mode == V4_SWIGLU;
  const uint32_t ks2 = choose_ks(static_cast<uint32_t>(n));
  const uint32_t grid2 = static_cast<uint32_t>((n + 4 * (8 / ks2) - 1) / (4 * (8 / ks2)));
  uint32_t ks4 = 0, grid4 = 0, warps4 = 0;
  if (v4_ok) {
    // SwiGLU: the gate and up tiles of an output tile are two slots of one block, so a launch has
    // twice the tiles; K split at most 4 ways keeps blocks at 8 warps (shared memory per block)
    const uint32_t tiles = static_cast<uint32_t>(n / 16) * (swiglu ? 2u : 1u);
    ks4 = choose_ks_v4(bits, tiles * 16u, static_cast<uint32_t>(k));
    if (swiglu && ks4 > NINFER_V4_SWIGLU_KS_CAP) ks4 = NINFER_V4_SWIGLU_KS_CAP;
    // (measurement knob) the SwiGLU writing its int8 output at the K split that gives each block whole
    // 64-groups (1: 4 output tiles a block), so that no block counts itself in (`v4_xq_out`, per == 1)
    if (swiglu && xq_out != nullptr && NINFER_V4_SWIGLU_XQ_KS > 0 && k / 256 >= NINFER_V4_SWIGLU_XQ_KS)
      ks4 = NINFER_V4_SWIGLU_XQ_KS;
    warps4 = swiglu ? kV4MaxWarps : (ks4 > 4 ? ks4 : 4);
    grid4 = (tiles + warps4 / ks4 - 1) / (warps4 / ks4);
  }
  uint32_t ks3 = 0, grid3 = 0, threads3 = 0;
  if (v3_ok) {
    ks3 = choose_ks_v3(static_cast<uint32_t>(n), static_cast<uint32_t>(k));
    const uint32_t warps = ks3 > 8 ? ks3 : 8, slots = warps / ks3;
    grid3 = static_cast<uint32_t>((n / 16 + slots - 1) / slots);
    threads3 = warps * 32;
  }
  const size_t esize = f32 ? 4 : 2;
  const void* bp = w.base;
  const void* hp = w.high;
  const void* sp = w.scales;
  TVM_FFI_ICHECK(reinterpret_cast<uintptr_t>(xp) % 16 == 0 && reinterpret_cast<uintptr_t>(bp) % 16 == 0 &&
                 reinterpret_cast<uintptr_t>(hp) % 8 == 0 && reinterpret_cast<uintptr_t>(sp) % 4 == 0)
      << "ninfer_gemv: x, base, high and scales must be 16/16/8/4-byte aligned";
  uint32_t n32 = static_cast<uint32_t>(n), k32 = static_cast<uint32_t>(k), ys = static_cast<uint32_t>(y_stride);
  for (int64_t r0 = 0; r0 < rows; r0 += 8) {
    uint32_t b = static_cast<uint32_t>(rows - r0 < 8 ? rows - r0 : 8);
    const int batch = b == 1 ? 1 : b == 2 ? 2 : b <= 4 ? 4 : 8;
    const bool v4 = v4_ok && (v4_size || mode != V4_PLAIN);
    const bool v3 = !v4 && v3_ok && !(b == 1 && small);
    // int8 activations: on v4 with at most 4 rows (all of x in the xq layout), q4 plain / SwiGLU / add, q5 add
    const bool i8 = v4 && i8_runs(xq != nullptr, rows, bits, mode);
    // ... or, for a q5 residual add of one row without them, quantized by the launch itself
    const bool self_i8 = v4 && !i8 && NINFER_V4_SELF_I8 && rows == 1 && bits == 5 && mode == V4_ADD && int8_enabled();
    const int i8_index = kI8Index + (bits == 5 ? 3 : mode == V4_SWIGLU ? 1 : mode == V4_ADD ? 2 : 0);
    const bool xqn = pre != nullptr;
    TVM_FFI_ICHECK(!xqn || (i8 && swiglu && rows == 1 && k <= kXqnMaxK && warps4 >= 4))
        << "ninfer_gemv: the norm in the SwiGLU's prologue needs its int8 entry at one row and K <= " << kXqnMaxK;
    CUfunction fn = lookup(xqn ? kSwigluI8nIndex
                           : self_i8 ? kSelfI8Index
                           : i8    ? i8_index
                           : v4    ? v4_index(bits, mode)
                           : v3    ? v3_index(bits)
                                   : kernel_index(bits, batch, f32));
    const void* xr = xqn ? static_cast<const void*>(pre->x)
                     : i8 ? static_cast<const void*>(xq)
                          : static_cast<const void*>(xp + r0 * k * esize);
    void* yr = yp + r0 * y_stride * esize;
    uint32_t ks = v4 ? ks4 : v3 ? ks3 : ks2, warps_v4 = warps4, grid_v4 = grid4;
    if (v4 && bits == 5 && !swiglu && b <= 2 && ks > NINFER_V4_Q5_KS_FEW_ROWS) {
      ks = NINFER_V4_Q5_KS_FEW_ROWS;
      warps_v4 = ks > 4 ? ks : 4;
      const uint32_t tiles = static_cast<uint32_t>(n / 16);
      grid_v4 = (tiles + warps_v4 / ks - 1) / (warps_v4 / ks);
    }
    V4Epi e{up ? up->base : nullptr, up ? up->high : nullptr, up ? up->scales : nullptr,
            residual ? residual + r0 * n * 2 : nullptr, ys, {}, {}, {}, {}, {}, {}, i8 ? xq + k * 8 : nullptr,
            i8 ? xq_out : nullptr, norm ? norm->w : nullptr, norm ? norm->y + r0 * n * 2 : nullptr,
            norm && r0 == 0 ? norm->xq : nullptr, norm ? norm->eps : 0.f, norm ? norm->offset : 0.f,
            norm && norm->wbf16 ? 1u : 0u};
    if (xqn) {  // (the norm's parameters where V4_ADD keeps its own norm's: the modes never meet)
      e.norm_w = pre->w;
      e.norm_y = pre->y;
      e.norm_eps = pre->eps;
      e.norm_offset = pre->offset;
      e.norm_wbf16 = pre->wbf16 ? 1u : 0u;
    }
    TVM_FFI_ICHECK(norm == nullptr || (v4 && mode == V4_ADD)) << "ninfer_gemv: add_norm runs on v4 residual adds only";
    void* args[] = {&xr, &bp, &hp, &sp, &yr, &n32, &k32, &b, &ks, v4 ? static_cast<void*>(&e) : static_cast<void*>(&ys)};
    const uint32_t grid = v4 ? grid_v4 : v3 ? grid3 : grid2, threads = v4 ? warps_v4 * 32 : v3 ? threads3 : 256;
    // the SwiGLU's handover in clusters: the blocks of one 64-group of outputs (`v4_xq_out_cluster`)
    const uint32_t outs16 = swiglu ? warps_v4 / ks / 2 * 16 : 0;
    const uint32_t cluster = NINFER_V4_XQ_CLUSTER && i8 && !xqn && swiglu && xq_out != nullptr && outs16 < 64 ? 64 / outs16 : 1;
    TVM_FFI_ICHECK(cluster == 1 || grid % cluster == 0) << "ninfer_gemv: the SwiGLU's cluster handover needs whole groups of blocks";
    const uint32_t smem = (v4 ? v4_smem(bits, warps_v4, !xqn && ((i8 && b == 1) || self_i8), self_i8) : 0) +
                          (cluster > 1 && NINFER_V4_XQ_CLUSTER == 1 ? kXqClusterBytes : 0) +
                          (xqn ? static_cast<uint32_t>(k / 256) * kXqnUnitBytes : 0u);
    launch(fn, grid, threads, smem, stream, args, cluster);
  }
}

// The segment table of a V4_MULTI launch over w[0 .. nseg) (unused entries repeat the last
// weight, ending where it ends); returns the launch's tiles.
uint32_t multi_segments(V4Epi& e, const Planes* w, const int64_t* stride, uint32_t nseg) {
  TVM_FFI_ICHECK(nseg >= 1 && nseg <= V4_SEGS) << "ninfer_gemv: 1.." << V4_SEGS << " weights per multi launch";
  uint32_t tiles = 0;
  for (uint32_t s = 0; s < V4_SEGS; ++s) {
    const uint32_t i = s < nseg ? s : nseg - 1;
    if (s < nseg) tiles += static_cast<uint32_t>(w[i].n / 16);
    e.seg_end[s] = tiles;
    e.seg_stride[s] = static_cast<uint32_t>(stride[i]);
    e.seg_base[s] = w[i].base;
    e.seg_high[s] = w[i].high;
    e.seg_scales[s] = w[i].scales;
  }
  return tiles;
}

// A V4_MULTI entry launched once per 8 activation rows at xp (bf16), each launch's outputs at its
// rows of y_s (row stride stride_s). `blocks4`, `ks5`: the mixed entry's last two parameters (the
// per-format entries take none past `e`; the driver reads only the parameters a kernel has).
// `xq`: an int8 entry's activations (all of x's <= 4 rows, one launch), read instead of xp.
void launch_multi(CUfunction fn, V4Epi& e, const char* xp, int64_t rows, int64_t k, const Planes* w, char* const* y,
                  const int64_t* stride, uint32_t nseg, uint32_t tiles, uint32_t ks, uint32_t grid, uint32_t warps,
                  uint32_t smem, CUstream stream, uint32_t blocks4 = 0, uint32_t ks5 = 0, const char* xq = nullptr) {
  TVM_FFI_ICHECK(reinterpret_cast<uintptr_t>(xp) % 16 == 0) << "ninfer_gemv: x must be 16-byte aligned";
  TVM_FFI_ICHECK(xq == nullptr || rows <= 4) << "ninfer_gemv: int8 activations hold at most 4 rows";
  const void* bp = w[0].base;
  const void* hp = w[0].high;
  const void* sp = w[0].scales;
  uint32_t n32 = tiles * 16u, k32 = static_cast<uint32_t>(k);
  for (int64_t r0 = 0; r0 < rows; r0 += 8) {
    uint32_t b = static_cast<uint32_t>(rows - r0 < 8 ? rows - r0 : 8);
    for (uint32_t s = 0; s < V4_SEGS; ++s) {
      const uint32_t i = s < nseg ? s : nseg - 1;
      e.seg_y[s] = y[i] + r0 * stride[i] * 2;
    }
    const void* xr = xq != nullptr ? static_cast<const void*>(xq) : static_cast<const void*>(xp + r0 * k * 2);
    void* yr = e.seg_y[0];
    void* args[] = {&xr, &bp, &hp, &sp, &yr, &n32, &k32, &b, &ks, &e, &blocks4, &ks5};
    launch(fn, grid, warps * 32, smem, stream, args);
  }
}

// One V4_MULTI launch over up to V4_SEGS weights of one format (each v4_fits): weight s writes
// y_s[r, 0 .. n_s) with row stride stride_s, for the `rows` activation rows at xp (bf16).
void run_multi(const char* xp, int64_t rows, int64_t k, int bits, const Planes* w, char* const* y,
               const int64_t* stride, uint32_t nseg, CUstream stream) {
  V4Epi e{nullptr, nullptr, nullptr, nullptr, 0, {}, {}, {}, {}, {}, {}, nullptr, nullptr, nullptr, nullptr, nullptr, 0.f, 0.f, 0u};
  const uint32_t tiles = multi_segments(e, w, stride, nseg);
  const uint32_t ks = choose_ks_v4(bits, tiles * 16u, static_cast<uint32_t>(k), NINFER_V4_Q5_KS_CAP_MULTI);
  const uint32_t warps = ks > 4 ? ks : 4, grid = (tiles + warps / ks - 1) / (warps / ks);
  launch_multi(lookup(v4_index(bits, V4_MULTI)), e, xp, rows, k, w, y, stride, nseg, tiles, ks, grid, warps,
               v4_smem(bits, warps), stream);
}

// One mixed-format V4_MULTI launch (`ninfer_qgemv4e_q45_multi`): w[0 .. n4) are q4 weights, w[n4
// .. nseg) q5 weights, each v4_fits. Each block runs one format: the q4 tiles at the q4 K split,
// then the q5 tiles at the q5 K split, in blocks of the same size. False (nothing launched) where
// there are not both formats or the q4 tiles do not fill whole blocks. `xq`: x also as the norm's int8
// activations, read by the int8 entry where it runs (<= 4 rows, NINFER_GEMV_INT8 not 0), or nullptr.
// `pre` (one row, the int8 entry running): xp is pre's output, which the launch computes from pre's
// input in its prologue (the XQN entry) instead of reading xq.
bool run_multi45(const char* xp, int64_t rows, int64_t k, const Planes* w, char* const* y, const int64_t* stride,
                 uint32_t n4, uint32_t nseg, CUstream stream, const char* xq = nullptr, const NormIn* pre = nullptr) {
  if (n4 == 0 || n4 >= nseg || nseg > V4_SEGS) return false;
  V4Epi e{nullptr, nullptr, nullptr, nullptr, 0, {}, {}, {}, {}, {}, {}, nullptr, nullptr, nullptr, nullptr, nullptr, 0.f, 0.f, 0u};
  const uint32_t tiles = multi_segments(e, w, stride, nseg), tiles4 = e.seg_end[n4 - 1], tiles5 = tiles - tiles4;
  const uint32_t k32 = static_cast<uint32_t>(k);
  const uint32_t ks4 = std::min(choose_ks_v4(4, tiles4 * 16u, k32), static_cast<uint32_t>(NINFER_V4_MULTI_KS4_CAP));
  const uint32_t ks5 = choose_ks_v4(5, tiles5 * 16u, k32, NINFER_V4_Q5_KS_CAP_MULTI);
  const uint32_t warps = std::max({4u, ks4, ks5});
  if (tiles4 % (warps / ks4) != 0) return false;
  const uint32_t blocks4 = tiles4 / (warps / ks4), blocks5 = (tiles5 + warps / ks5 - 1) / (warps / ks5);
  if (pre != nullptr) {
    TVM_FFI_ICHECK(rows == 1 && k <= kXqnMaxK && warps <= kV4MaxWarps && int8_enabled())
        << "ninfer_gemv: the norm in the multi launch's prologue needs one row and K <= " << kXqnMaxK;
    e.norm_w = pre->w;
    e.norm_y = pre->y;
    e.norm_eps = pre->eps;
    e.norm_offset = pre->offset;
    e.norm_wbf16 = pre->wbf16 ? 1u : 0u;
    launch_multi(lookup(kMulti45I8nIndex), e, pre->x, rows, k, w, y, stride, nseg, tiles, ks4, blocks4 + blocks5, warps,
                 std::max(v4_smem(4, warps), v4_smem(5, warps)) + static_cast<uint32_t>(k / 256) * kXqnUnitBytes, stream,
                 blocks4, ks5);
    return true;
  }
  const bool i8 = xq != nullptr && rows <= 4 && int8_enabled();
  if (i8) e.x_scales = xq + k * 8;
  const bool staged = i8 && rows == 1;  // (an int8 entry at one row stages its activations in the ring)
  launch_multi(lookup(i8 ? kMulti45I8Index : kMulti45Index), e, xp, rows, k, w, y, stride, nseg, tiles, ks4,
               blocks4 + blocks5, warps, std::max(v4_smem(4, warps, staged), v4_smem(5, warps, staged)), stream,
               blocks4, ks5, i8 ? xq : nullptr);
  return true;
}

int64_t k_of(const tvm::ffi::TensorView& x) { return x.shape()[x.ndim() - 1]; }

bool is_f32(const tvm::ffi::TensorView& x) {
  const bool f32 = x.dtype().code == kDLFloat && x.dtype().bits == 32;
  TVM_FFI_ICHECK(f32 || (x.dtype().code == kDLBfloat && x.dtype().bits == 16)) << "ninfer_gemv: x must be bf16 or fp32";
  return f32;
}

CUstream stream_of(const tvm::ffi::TensorView& x) {
  TVM_FFI_ICHECK(x.device().device_type == kDLCUDA) << "ninfer_gemv: x must be on a CUDA device";
  return TVMFFIEnvGetStream(kDLCUDA, x.device().device_id);
}

// y = x W^T
void qgemv(tvm::ffi::TensorView x, tvm::ffi::TensorView base, tvm::ffi::TensorView high,
           tvm::ffi::TensorView scales, int64_t bits, tvm::ffi::TensorView y) {
  const int64_t k = k_of(x), n = y.shape()[y.ndim() - 1];
  const Planes w = planes(base, high, scales, bits, k);
  TVM_FFI_ICHECK(w.n == n) << "ninfer_gemv: base has " << w.n << " rows, y " << n;
  run(address(x), is_f32(x), x.numel() / k, k, static_cast<int>(bits), w, address(y), n, V4_PLAIN, nullptr, nullptr,
      stream_of(x));
}

// The size in bytes of x's int8 activations (the norm's xq layout, `qgemv_cuda.cu` v4_stage_i8).
int64_t xq_bytes(int64_t k) { return k * 8 + k / 256 * 64; }

// The address of `xq` checked as the int8 activations of a K-wide input (uint8, `xq_bytes(k)`,
// 16-byte aligned); nullptr for none.
const char* xq_address(const tvm::ffi::TensorView* xq, int64_t k, const char* what) {
  if (xq == nullptr) return nullptr;
  TVM_FFI_ICHECK(k % 256 == 0 && xq->dtype().code == kDLUInt && xq->dtype().bits == 8 && xq->numel() == xq_bytes(k) &&
                 reinterpret_cast<uintptr_t>(address(*xq)) % 16 == 0)
      << "ninfer_gemv: " << what << " needs K % 256 == 0 and 16-byte aligned uint8 xq of " << xq_bytes(k) << " bytes";
  return address(*xq);
}

// y = residual + x W^T (bf16; one rounding); `xq`: x also as int8 activations (read at <= 4 rows);
// `norm`: y's RMS norm too
void add_run(const tvm::ffi::TensorView& x, const tvm::ffi::TensorView* xq, const tvm::ffi::TensorView& base,
             const tvm::ffi::TensorView& high, const tvm::ffi::TensorView& scales, int64_t bits,
             const tvm::ffi::TensorView& residual, const tvm::ffi::TensorView& y, const NormOut* norm = nullptr) {
  const int64_t k = k_of(x), n = y.shape()[y.ndim() - 1];
  const Planes w = planes(base, high, scales, bits, k);
  TVM_FFI_ICHECK(!is_f32(x) && w.n == n && residual.numel() == y.numel() && residual.dtype().code == kDLBfloat &&
                 residual.dtype().bits == 16)
      << "ninfer_gemv: add needs bf16 x and a bf16 residual shaped like y";
  const char* xqp = xq_address(xq, k, "add_i8");
  run(address(x), false, x.numel() / k, k, static_cast<int>(bits), w, address(y), n, V4_ADD, nullptr,
      address(residual), stream_of(x), xqp, nullptr, norm);
}

// y = residual + x W^T, then yn = y * rsqrt(mean(y^2) + eps) * (w + offset) as `ninfer_rms_norm`
// computes it; `yq`: rows 0..3 of yn also as int8 activations (`ninfer_rms_norm_xq`'s layout)
void add_norm_run(tvm::ffi::TensorView x, tvm::ffi::TensorView base, tvm::ffi::TensorView high,
                  tvm::ffi::TensorView scales, int64_t bits, tvm::ffi::TensorView residual, tvm::ffi::TensorView nw,
                  double eps, double offset, tvm::ffi::TensorView y, tvm::ffi::TensorView yn,
                  const tvm::ffi::TensorView* yq) {
  const int64_t n = y.shape()[y.ndim() - 1];
  const bool wf32 = nw.dtype().code == kDLFloat && nw.dtype().bits == 32;
  TVM_FFI_ICHECK((wf32 || (nw.dtype().code == kDLBfloat && nw.dtype().bits == 16)) && nw.numel() == n &&
                 yn.numel() == y.numel() && yn.dtype().code == kDLBfloat && yn.dtype().bits == 16 && n % 8 == 0 &&
                 reinterpret_cast<uintptr_t>(address(nw)) % 16 == 0 && reinterpret_cast<uintptr_t>(address(y)) % 16 == 0 &&
                 reinterpret_cast<uintptr_t>(address(yn)) % 16 == 0)
      << "ninfer_qgemv_add_norm: needs an fp32 or bf16 norm weight of y's " << n
      << " columns, a bf16 output shaped like y and 16-byte aligned y, output and weight";
  NormOut norm{address(nw), !wf32, static_cast<float>(eps), static_cast<float>(offset), address(yn),
               const_cast<char*>(xq_address(yq, n, "add_norm_xq's output"))};
  add_run(x, nullptr, base, high, scales, bits, residual, y, &norm);
}

void qgemv_add_norm(tvm::ffi::TensorView x, tvm::ffi::TensorView base, tvm::ffi::TensorView high,
                    tvm::ffi::TensorView scales, int64_t bits, tvm::ffi::TensorView residual, tvm::ffi::TensorView nw,
                    double eps, double offset, tvm::ffi::TensorView y, tvm::ffi::TensorView yn) {
  add_norm_run(x, base, high, scales, bits, residual, nw, eps, offset, y, yn, nullptr);
}

void qgemv_add_norm_xq(tvm::ffi::TensorView x, tvm::ffi::TensorView base, tvm::ffi::TensorView high,
                       tvm::ffi::TensorView scales, int64_t bits, tvm::ffi::TensorView residual, tvm::ffi::TensorView nw,
                       double eps, double offset, tvm::ffi::TensorView y, tvm::ffi::TensorView yn,
                       tvm::ffi::TensorView yq) {
  add_norm_run(x, base, high, scales, bits, residual, nw, eps, offset, y, yn, &yq);
}

// y = silu(x Wg^T) * (x Wu^T) (fp32 epilogue, one rounding); `xq`: x also as int8 activations (read
// at <= 4 rows); `yq`: y also written as int8 activations for the next projection (`qgemv_add_i8`),
// exactly when that projection reads them (`i8_runs`); `pre`: x is this norm's output, computed by
// the launch itself (`run`)
void swiglu_run(const tvm::ffi::TensorView& x, const tvm::ffi::TensorView* xq, int64_t bits,
                const tvm::ffi::TensorView& gb, const tvm::ffi::TensorView& gh, const tvm::ffi::TensorView& gs,
                const tvm::ffi::TensorView& ub, const tvm::ffi::TensorView& uh, const tvm::ffi::TensorView& us,
                const tvm::ffi::TensorView& y, const tvm::ffi::TensorView* yq, const NormIn* pre = nullptr) {
  const int64_t k = k_of(x), n = y.shape()[y.ndim() - 1];
  const Planes g = planes(gb, gh, gs, bits, k), u = planes(ub, uh, us, bits, k);
  TVM_FFI_ICHECK(!is_f32(x) && g.n == n && u.n == n) << "ninfer_gemv: swiglu needs bf16 x and gate/up of y's rows";
  const char* xqp = xq_address(xq, k, "swiglu_i8");
  char* yqp = const_cast<char*>(xq_address(yq, n, "swiglu_i8x's output"));
  if (x.numel() / k > NINFER_XQ_HANDOVER_ROWS) yqp = nullptr;  // (`qgemv_add_i8h` reads x then)
  if (yq != nullptr) {
    TVM_FFI_ICHECK(xq != nullptr && bits == 4) << "ninfer_gemv: swiglu_i8x runs q4 weights only, got " << bits << "-bit";
    TVM_FFI_ICHECK(n % 64 == 0 && n / 64 <= kXqGroups)
        << "ninfer_gemv: swiglu_i8x needs N % 64 == 0 and N <= " << 64 * kXqGroups << ", got " << n;
  }
  run(address(x), false, x.numel() / k, k, static_cast<int>(bits), g, address(y), n, V4_SWIGLU, &u, nullptr,
      stream_of(x), xqp, yqp, nullptr, pre);
}

void qgemv_add(tvm::ffi::TensorView x, tvm::ffi::TensorView base, tvm::ffi::TensorView high,
               tvm::ffi::TensorView scales, int64_t bits, tvm::ffi::TensorView residual, tvm::ffi::TensorView y) {
  add_run(x, nullptr, base, high, scales, bits, residual, y);
}

// `qgemv_add` where the previous kernel also wrote x as int8 activations `xq`
void qgemv_add_i8(tvm::ffi::TensorView x, tvm::ffi::TensorView xq, tvm::ffi::TensorView base, tvm::ffi::TensorView high,
                  tvm::ffi::TensorView scales, int64_t bits, tvm::ffi::TensorView residual, tvm::ffi::TensorView y) {
  add_run(x, &xq, base, high, scales, bits, residual, y);
}

// The same for the SwiGLU's handover (`qgemv_swiglu_i8x`): xq is there at <= NINFER_XQ_HANDOVER_ROWS rows
void qgemv_add_i8h(tvm::ffi::TensorView x, tvm::ffi::TensorView xq, tvm::ffi::TensorView base, tvm::ffi::TensorView high,
                   tvm::ffi::TensorView scales, int64_t bits, tvm::ffi::TensorView residual, tvm::ffi::TensorView y) {
  add_run(x, x.numel() / k_of(x) <= NINFER_XQ_HANDOVER_ROWS ? &xq : nullptr, base, high, scales, bits, residual, y);
}

void qgemv_swiglu(tvm::ffi::TensorView x, int64_t bits, tvm::ffi::TensorView gb, tvm::ffi::TensorView gh,
                  tvm::ffi::TensorView gs, tvm::ffi::TensorView ub, tvm::ffi::TensorView uh, tvm::ffi::TensorView us,
                  tvm::ffi::TensorView y) {
  swiglu_run(x, nullptr, bits, gb, gh, gs, ub, uh, us, y, nullptr);
}

// `qgemv_swiglu` where the norm also wrote x as int8 activations `xq`
void qgemv_swiglu_i8(tvm::ffi::TensorView x, tvm::ffi::TensorView xq, int64_t bits, tvm::ffi::TensorView gb,
                     tvm::ffi::TensorView gh, tvm::ffi::TensorView gs, tvm::ffi::TensorView ub, tvm::ffi::TensorView uh,
                     tvm::ffi::TensorView us, tvm::ffi::TensorView y) {
  swiglu_run(x, &xq, bits, gb, gh, gs, ub, uh, us, y, nullptr);
}

// The decode norm of `pre` as its own kernel (`rms_norm_body`: y, and xq at rows 0..3).
void norm_xq_launch(const NormIn& pre, int64_t rows, int64_t k, CUstream stream) {
  const void* xp = pre.x;
  const void* wp = pre.w;
  void* yp = pre.y;
  void* qp = pre.xq;
  uint32_t k32 = static_cast<uint32_t>(k);
  float eps = pre.eps, offset = pre.offset;
  void* args[] = {&xp, &wp, &yp, &k32, &eps, &offset, &qp};
  if (rows > 0) launch(lookup(kNormXqIndex + (pre.wbf16 ? 1 : 0)), static_cast<uint32_t>(rows), 256, 0, stream, args);
}

// `pre` checked as the decode norm of x (bf16 rows of K) with weight nw (fp32 or bf16, K), output y
// (bf16, x's shape) and int8 activations xq (`xq_bytes(K)`), all 16-byte aligned.
NormIn norm_in(const tvm::ffi::TensorView& x, const tvm::ffi::TensorView& nw, double eps, double offset,
               const tvm::ffi::TensorView& y, const tvm::ffi::TensorView& xq, const char* what) {
  const int64_t k = k_of(x);
  const bool wf32 = nw.dtype().code == kDLFloat && nw.dtype().bits == 32;
  const auto bf16 = [](const tvm::ffi::TensorView& t) { return t.dtype().code == kDLBfloat && t.dtype().bits == 16; };
  TVM_FFI_ICHECK(bf16(x) && bf16(y) && y.numel() == x.numel() && (wf32 || bf16(nw)) && nw.numel() == k &&
                 reinterpret_cast<uintptr_t>(address(x)) % 16 == 0 && reinterpret_cast<uintptr_t>(address(y)) % 16 == 0 &&
                 reinterpret_cast<uintptr_t>(address(nw)) % 16 == 0)
      << "ninfer_gemv: " << what << " needs bf16 x and norm output of one shape, an fp32 or bf16 norm weight of K = " << k
      << " and 16-byte aligned x, output and weight";
  return NormIn{address(x), address(nw), !wf32, static_cast<float>(eps), static_cast<float>(offset), address(y),
                const_cast<char*>(xq_address(&xq, k, what))};
}

// The SwiGLU of the decode norm of x (`ninfer_rms_norm_xq` + `qgemv_swiglu_i8x` in one call): at one
// row the int8 entry computes the norm in its prologue (yn written, xq not: only this call reads
// it); otherwise the norm kernel writes yn and xq, then the SwiGLU runs as `qgemv_swiglu_i8x`.
void qgemv_norm_swiglu_i8x(tvm::ffi::TensorView x, tvm::ffi::TensorView nw, double eps, double offset, int64_t bits,
                           tvm::ffi::TensorView gb, tvm::ffi::TensorView gh, tvm::ffi::TensorView gs,
                           tvm::ffi::TensorView ub, tvm::ffi::TensorView uh, tvm::ffi::TensorView us,
                           tvm::ffi::TensorView yn, tvm::ffi::TensorView xq, tvm::ffi::TensorView y,
                           tvm::ffi::TensorView yq) {
  const NormIn pre = norm_in(x, nw, eps, offset, yn, xq, "norm_swiglu_i8x");
  const int64_t k = k_of(x), rows = x.numel() / k;
  const bool in_prologue = (NINFER_V4_XQN_LAUNCHES & 2) && rows == 1 && k <= kXqnMaxK &&
                           i8_runs(true, rows, static_cast<int>(bits), V4_SWIGLU);
  if (!in_prologue) norm_xq_launch(pre, rows, k, stream_of(x));
  swiglu_run(yn, &xq, bits, gb, gh, gs, ub, uh, us, y, &yq, in_prologue ? &pre : nullptr);
}

// The same, y also written as int8 activations `yq` for `qgemv_add_i8`
void qgemv_swiglu_i8x(tvm::ffi::TensorView x, tvm::ffi::TensorView xq, int64_t bits, tvm::ffi::TensorView gb,
                      tvm::ffi::TensorView gh, tvm::ffi::TensorView gs, tvm::ffi::TensorView ub, tvm::ffi::TensorView uh,
                      tvm::ffi::TensorView us, tvm::ffi::TensorView y, tvm::ffi::TensorView yq) {
  swiglu_run(x, &xq, bits, gb, gh, gs, ub, uh, us, y, &yq);
}

}  // namespace

namespace {
// (x, n_out, n_0 .. n_{n_out-1}, then per weight: bits, base, high, scales, then y_0 .. y_{n_out-1}):
// output o is the concatenation (last axis) of x W^T over its n_o weights; the v4-capable weights
// share launches (the q4 and q5 ones one mixed launch), the others one launch each, all chained by
// PDL (no concatenation kernel). `with_xq`: x is followed by its int8 activations (the norm's xq),
// which the mixed launch reads instead of x where its int8 entry runs. `pre`: x and xq are the
// outputs of this decode norm, computed here first (by the mixed launch's prologue at one row,
// else by the norm kernel).
void multi_call(const tvm::ffi::AnyView* args, int32_t num_args, bool with_xq, const NormIn* pre = nullptr) {
  using tvm::ffi::TensorView;
  TVM_FFI_ICHECK(num_args >= (with_xq ? 3 : 2)) << "ninfer_qgemv_multi: too few arguments";
  const TensorView x = args[0].cast<TensorView>();
  const TensorView xq_view = with_xq ? args[1].cast<TensorView>() : x;
  const tvm::ffi::AnyView* a = args + (with_xq ? 1 : 0);  // a[0] stands for x, a[1] is n_out
  num_args -= with_xq ? 1 : 0;
  const int64_t nout = a[1].cast<int64_t>();
  TVM_FFI_ICHECK(nout >= 1 && num_args >= 2 + nout) << "ninfer_qgemv_multi: bad n_out";
  int64_t nw = 0;
  for (int64_t o = 0; o < nout; ++o) nw += a[2 + o].cast<int64_t>();
  const int64_t first = 2 + nout;
  TVM_FFI_ICHECK(num_args == first + 4 * nw + nout)
      << "ninfer_qgemv_multi: expected " << first + 4 * nw + nout << " arguments, got " << num_args;
  const int64_t k = k_of(x), rows = x.numel() / k;
  const bool f32 = is_f32(x);
  const CUstream stream = stream_of(x);
  // every weight with its slice of its output; v4-capable ones of one format share launches
  struct Item {
    int bits;
    Planes w;
    char* y;
    int64_t stride;
  };
  std::vector<Item> items;
  int64_t i = first;
  for (int64_t o = 0; o < nout; ++o) {
    const TensorView y = a[first + 4 * nw + o].cast<TensorView>();
    const int64_t total = y.shape()[y.ndim() - 1];
    TVM_FFI_ICHECK(y.numel() == rows * total && y.dtype() == x.dtype()) << "ninfer_qgemv_multi: bad output " << o;
    int64_t off = 0;
    for (int64_t j = 0, n = a[2 + o].cast<int64_t>(); j < n; ++j, i += 4) {
      const Planes w = planes(a[i + 1].cast<TensorView>(), a[i + 2].cast<TensorView>(), a[i + 3].cast<TensorView>(),
                              a[i].cast<int64_t>(), k);
      TVM_FFI_ICHECK(off + w.n <= total) << "ninfer_qgemv_multi: output " << o << " is narrower than its weights";
      items.push_back({static_cast<int>(a[i].cast<int64_t>()), w, address(y) + off * (f32 ? 4 : 2), total});
      off += w.n;
    }
    TVM_FFI_ICHECK(off == total) << "ninfer_qgemv_multi: output " << o << " has " << total << " columns, its weights " << off;
  }
  std::vector<bool> done(items.size(), false);
  bool normed = pre == nullptr;  // (x and xq hold the norm's output)
  // q4 and q5 weights that v4 takes, at most V4_SEGS: one mixed launch (NINFER_GEMV_MERGE=2 keeps
  // one launch per format, for measurements)
  if (merge_enabled() && mixed_merge_enabled() && !f32) {
    Planes w[V4_SEGS];
    char* ys[V4_SEGS];
    int64_t strides[V4_SEGS];
    size_t picked[V4_SEGS];
    uint32_t nseg = 0, n4 = 0;
    for (int bits : {4, 5})
      for (size_t q = 0; q < items.size(); ++q) {
        if (items[q].bits != bits || nseg == V4_SEGS || !v4_fits(f32, bits, items[q].w, k)) continue;
        w[nseg] = items[q].w;
        ys[nseg] = items[q].y;
        strides[nseg] = items[q].stride;
        picked[nseg++] = q;
        n4 += bits == 4 ? 1u : 0u;
      }
    const char* xq = with_xq ? xq_address(&xq_view, k, "ninfer_qgemv_multi_i8") : nullptr;
    bool ran = false;
    if (!normed && (NINFER_V4_XQN_LAUNCHES & 1) && rows == 1 && k <= kXqnMaxK && int8_enabled())
      ran = normed = run_multi45(address(x), rows, k, w, ys, strides, n4, nseg, stream, nullptr, pre);
    if (!ran && !normed) {
      norm_xq_launch(*pre, rows, k, stream);
      normed = true;
    }
    if (!ran) ran = run_multi45(address(x), rows, k, w, ys, strides, n4, nseg, stream, xq);
    if (ran)
      for (uint32_t s = 0; s < nseg; ++s) done[picked[s]] = true;
  }
  if (!normed) norm_xq_launch(*pre, rows, k, stream);
  for (size_t p = 0; p < items.size(); ++p) {
    if (done[p]) continue;
    if (!merge_enabled() || !v4_fits(f32, items[p].bits, items[p].w, k)) {
      run(address(x), f32, rows, k, items[p].bits, items[p].w, items[p].y, items[p].stride, V4_PLAIN, nullptr,
          nullptr, stream);
      done[p] = true;
      continue;
    }
    Planes w[V4_SEGS];
    char* ys[V4_SEGS];
    int64_t strides[V4_SEGS];
    uint32_t nseg = 0;
    for (size_t q = p; q < items.size() && nseg < V4_SEGS; ++q) {
      if (done[q] || items[q].bits != items[p].bits || !v4_fits(f32, items[q].bits, items[q].w, k)) continue;
      w[nseg] = items[q].w;
      ys[nseg] = items[q].y;
      strides[nseg++] = items[q].stride;
      done[q] = true;
    }
    run_multi(address(x), rows, k, items[p].bits, w, ys, strides, nseg, stream);
  }
}
}  // namespace

extern "C" TVM_FFI_DLL_EXPORT int __tvm_ffi_ninfer_qgemv_multi(void*, const TVMFFIAny* packed, int32_t num_args,
                                                             TVMFFIAny* result) {
  TVM_FFI_SAFE_CALL_BEGIN();
  multi_call(reinterpret_cast<const tvm::ffi::AnyView*>(packed), num_args, false);
  reinterpret_cast<tvm::ffi::Any*>(result)->operator=(nullptr);
  TVM_FFI_SAFE_CALL_END();
}

// (x, xq, n_out, ...): the same, with x's int8 activations
extern "C" TVM_FFI_DLL_EXPORT int __tvm_ffi_ninfer_qgemv_multi_i8(void*, const TVMFFIAny* packed, int32_t num_args,
                                                                TVMFFIAny* result) {
  TVM_FFI_SAFE_CALL_BEGIN();
  multi_call(reinterpret_cast<const tvm::ffi::AnyView*>(packed), num_args, true);
  reinterpret_cast<tvm::ffi::Any*>(result)->operator=(nullptr);
  TVM_FFI_SAFE_CALL_END();
}

// (x, nw, eps, offset, n_out, n_0 .., per weight: bits, base, high, scales, then yn, xq, y_0 ..): the
// multi_i8 call on the decode norm of x (`ninfer_rms_norm_xq` + `ninfer_qgemv_multi_i8` in one call),
// whose output yn and int8 activations xq come first among the outputs; at one row the mixed launch
// computes the norm in its prologue (yn written, xq not: only this call reads it).
extern "C" TVM_FFI_DLL_EXPORT int __tvm_ffi_ninfer_qgemv_norm_multi_i8(void*, const TVMFFIAny* packed, int32_t num_args,
                                                                     TVMFFIAny* result) {
  TVM_FFI_SAFE_CALL_BEGIN();
  using tvm::ffi::AnyView;
  using tvm::ffi::TensorView;
  const AnyView* a = reinterpret_cast<const AnyView*>(packed);
  TVM_FFI_ICHECK(num_args >= 8) << "ninfer_qgemv_norm_multi_i8: too few arguments";
  const int64_t nout = a[4].cast<int64_t>();
  TVM_FFI_ICHECK(nout >= 1 && num_args >= 7 + nout) << "ninfer_qgemv_norm_multi_i8: bad n_out";
  const int32_t yn_at = num_args - static_cast<int32_t>(nout) - 2;
  const TensorView x = a[0].cast<TensorView>();
  const NormIn pre = norm_in(x, a[1].cast<TensorView>(), a[2].cast<double>(), a[3].cast<double>(),
                             a[yn_at].cast<TensorView>(), a[yn_at + 1].cast<TensorView>(), "norm_multi_i8");
  // multi_i8's arguments: (yn, xq, n_out, ..weights.., y_0 ..)
  std::vector<AnyView> m;
  m.push_back(a[yn_at]);
  m.push_back(a[yn_at + 1]);
  for (int32_t i = 4; i < yn_at; ++i) m.push_back(a[i]);
  for (int32_t i = yn_at + 2; i < num_args; ++i) m.push_back(a[i]);
  multi_call(m.data(), static_cast<int32_t>(m.size()), true, &pre);
  reinterpret_cast<tvm::ffi::Any*>(result)->operator=(nullptr);
  TVM_FFI_SAFE_CALL_END();
}

TVM_FFI_DLL_EXPORT_TYPED_FUNC(ninfer_qgemv, qgemv);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(ninfer_qgemv_add, qgemv_add);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(ninfer_qgemv_swiglu, qgemv_swiglu);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(ninfer_qgemv_swiglu_i8, qgemv_swiglu_i8);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(ninfer_qgemv_swiglu_i8x, qgemv_swiglu_i8x);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(ninfer_qgemv_add_i8, qgemv_add_i8);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(ninfer_qgemv_add_i8h, qgemv_add_i8h);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(ninfer_qgemv_add_norm, qgemv_add_norm);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(ninfer_qgemv_add_norm_xq, qgemv_add_norm_xq);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(ninfer_qgemv_norm_swiglu_i8x, qgemv_norm_swiglu_i8x);
#else
// bf16 weights: `y[b, n] = sum_k x[b, k] * w[n, k]`, one block of 256 threads per row; with `w2`,
// the rows of a second weight into `y2` in the same launch.
void dense_run(const tvm::ffi::TensorView& x, const tvm::ffi::TensorView& w, const tvm::ffi::TensorView& y,
               const tvm::ffi::TensorView* w2, const tvm::ffi::TensorView* y2) {
  const int64_t k = x.shape()[x.ndim() - 1];
  const int64_t rows = x.numel() / k;
  const auto is_bf16 = [](const tvm::ffi::TensorView& t) { return t.dtype().code == kDLBfloat && t.dtype().bits == 16; };
  const auto check = [&](const tvm::ffi::TensorView& wt, const tvm::ffi::TensorView& yt) {
    const int64_t n = yt.shape()[yt.ndim() - 1];
    TVM_FFI_ICHECK(is_bf16(x) && is_bf16(wt) && is_bf16(yt)) << "ninfer_gemv: dense needs bf16 x, w and y";
    TVM_FFI_ICHECK(k % 8 == 0 && wt.shape()[0] == n && wt.shape()[1] == k && yt.numel() == rows * n)
        << "ninfer_gemv: unsupported dense shape";
    TVM_FFI_ICHECK(reinterpret_cast<uintptr_t>(address(wt)) % 16 == 0) << "ninfer_gemv: w must be 16-byte aligned";
    return n;
  };
  const int64_t n = check(w, y), n2 = w2 ? check(*w2, *y2) : 0;
  CUstream stream = TVMFFIEnvGetStream(kDLCUDA, x.device().device_id);
  const char* xp = address(x);
  char* yp = address(y);
  char* y2p = y2 ? address(*y2) : yp;
  const void* wp = address(w);
  const void* w2p = w2 ? address(*w2) : wp;
  TVM_FFI_ICHECK(reinterpret_cast<uintptr_t>(xp) % 16 == 0) << "ninfer_gemv: x must be 16-byte aligned";
  uint32_t n32 = static_cast<uint32_t>(n), k32 = static_cast<uint32_t>(k);
  for (int64_t r0 = 0; r0 < rows; r0 += 8) {
    uint32_t b = static_cast<uint32_t>(rows - r0 < 8 ? rows - r0 : 8);
    CUfunction fn = lookup(dense_index(static_cast<int>(b)));
    const void* xr = xp + r0 * k * 2;
    void* yr = yp + r0 * n * 2;
    void* y2r = y2p + r0 * n2 * 2;
    void* args[] = {&xr, &wp, &yr, &n32, &k32, &b, &w2p, &y2r};
    launch(fn, static_cast<uint32_t>(n + n2), 256, 0, stream, args);
  }
}

void dense_gemv(tvm::ffi::TensorView x, tvm::ffi::TensorView w, tvm::ffi::TensorView y) {
  dense_run(x, w, y, nullptr, nullptr);
}

void dense_gemv_pair(tvm::ffi::TensorView x, tvm::ffi::TensorView w, tvm::ffi::TensorView w2, tvm::ffi::TensorView y,
                     tvm::ffi::TensorView y2) {
  dense_run(x, w, y, &w2, &y2);
}

// y = x * rsqrt(mean(x^2) + eps) * (w + offset) over the last axis (bf16 x and y, fp32 or bf16 w)
void rms_norm_run(const tvm::ffi::TensorView& x, const tvm::ffi::TensorView& w, double eps, double offset,
                  const tvm::ffi::TensorView& y, const tvm::ffi::TensorView* xq) {
  const int64_t k = x.shape()[x.ndim() - 1];
  const bool wf32 = w.dtype().code == kDLFloat && w.dtype().bits == 32;
  const auto is_bf16 = [](const tvm::ffi::TensorView& t) { return t.dtype().code == kDLBfloat && t.dtype().bits == 16; };
  TVM_FFI_ICHECK(x.device().device_type == kDLCUDA) << "ninfer_rms_norm: x must be on a CUDA device";
  TVM_FFI_ICHECK(is_bf16(x) && is_bf16(y) && y.numel() == x.numel() && w.numel() == k && k % 8 == 0 &&
                 (wf32 || (w.dtype().code == kDLBfloat && w.dtype().bits == 16)))
      << "ninfer_rms_norm: needs bf16 x and y of one shape, K % 8 == 0 and an fp32 or bf16 weight of K";
  const void* xp = address(x);
  const void* wp = address(w);
  void* yp = address(y);
  TVM_FFI_ICHECK(reinterpret_cast<uintptr_t>(xp) % 16 == 0 && reinterpret_cast<uintptr_t>(yp) % 16 == 0)
      << "ninfer_rms_norm: x and y must be 16-byte aligned";
  void* qp = nullptr;
  if (xq != nullptr) {
    qp = address(*xq);
    TVM_FFI_ICHECK(k % 256 == 0 && xq->dtype().code == kDLUInt && xq->dtype().bits == 8 &&
                   xq->numel() == k * 8 + k / 256 * 64 && reinterpret_cast<uintptr_t>(qp) % 16 == 0)
        << "ninfer_rms_norm_xq: needs K % 256 == 0 and 16-byte aligned uint8 xq of " << k * 8 + k / 256 * 64 << " bytes";
  }
  uint32_t k32 = static_cast<uint32_t>(k);
  float e = static_cast<float>(eps), off = static_cast<float>(offset);
  void* args[] = {&xp, &wp, &yp, &k32, &e, &off, &qp};
  const int64_t rows = x.numel() / k;
  if (rows > 0) launch(lookup(kNormIndex + (wf32 ? 0 : 1) + (xq != nullptr ? 2 : 0)), static_cast<uint32_t>(rows), 256,
                         0, TVMFFIEnvGetStream(kDLCUDA, x.device().device_id), args);
}

void rms_norm(tvm::ffi::TensorView x, tvm::ffi::TensorView w, double eps, double offset, tvm::ffi::TensorView y) {
  rms_norm_run(x, w, eps, offset, y, nullptr);
}

// The same, rows 0..3 of y also written as int8 activations into xq (for `ninfer_qgemv_swiglu_i8`)
void rms_norm_xq(tvm::ffi::TensorView x, tvm::ffi::TensorView w, double eps, double offset, tvm::ffi::TensorView y,
                 tvm::ffi::TensorView xq) {
  rms_norm_run(x, w, eps, offset, y, &xq);
}

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(ninfer_dense_gemv_pair, dense_gemv_pair);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(ninfer_rms_norm, rms_norm);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(ninfer_rms_norm_xq, rms_norm_xq);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(ninfer_dense_gemv, dense_gemv);
#endif
