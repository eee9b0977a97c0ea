"""`y = x @ W^T` and embedding rows over fp8_e4m3fn_row_bf16 weights (artifact spec 3.4, 4.5), as stored.

Parameters of an `[N, K]` matrix (`plane_shapes`): `codes` uint8 `[N, K]` (the `row_scale_v1` code
plane, one E4M3FN word per weight) and `row_scales` bf16 `[N]` (the scale plane's words, one
multiplier per row). Both are the artifact's bytes: a binding's row range of a packed parent is
its code rows plus its scale words, two spans (`runtime/weights.py`).

`W[n, k] = f32(e4m3fn(c[n, k])) * f32(s[n])`. Everywhere the row scale is applied to the fp32 sum of
exact products `x * e4m3fn(c)` rather than folded into the weights: code values are exact in bf16
(4 significant bits) while `code * scale` (up to 12) is not.

* CPU (and the CUDA reference kernels): one TE op, a dequantize block and an fp32 reduction (the
  two-block shape of `dequant_matmul`); the embedding is a TE gather of decoded rows.
* CUDA with bf16 activations, opt-in until a device run validates them (`ops.common.kernel_feature`;
  `NINFER_KERNELS=+fp8_row_triton,+fp8_row_gemv_tc`): prefill-shaped calls run the Triton
  tensor-core GEMM of `fp8_row_triton.py`; decode-shaped ones (`[b, 1, K]`) the tensor-core GEMV of
  `fp8_row_gemv_cuda.cu` (nvcc, SASS only, N % 16 == 0, K % 128 == 0) or else the Triton GEMV (fp32
  K-split partials, summed and scaled by TVM). The Triton GEMV needs K % 16 == 0, the GEMM (a
  narrow and a wide tile, chosen per launch by the token count) K % 64 == 0; other shapes keep the
  TE op. All are compiled ahead of time and launched from the package's host library (`cuda_extern`).
"""

from __future__ import annotations

from pathlib import Path

import tvm
from tvm import te, tirx
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import op

from ..codegen.toolchain import nvcc_fatbin
from . import common
from .common import dtype_tag
from .cuda_extern import current_arch, extern, fill_launcher
from .nvfp4 import SMS, WARPS_PER_SM, CudaImage
from .triton_aot import KernelImage, compile_kernel

FORMAT = "fp8_e4m3fn_row_bf16"
PLANES = ("codes", "row_scales")
GEMM_SYMBOL, GEMV_SYMBOL = "ninfer_fp8_row_gemm", "ninfer_fp8_row_gemv"
TC_SYMBOL = "ninfer_fp8_row_gemv_tc"
TC_SOURCE = Path(__file__).resolve().parent / "fp8_row_gemv_cuda.cu"
# opt-in kernels (`common.KERNEL_FEATURES`): the Triton GEMM + GEMV, and the CUDA C++ decode GEMV
TRITON_FEATURE, TC_FEATURE = "fp8_row_triton", "fp8_row_gemv_tc"


def plane_shapes(rows: int, cols: int) -> dict[str, tuple[tuple[int, ...], str]]:
    """`{plane: (shape, dtype)}` of the parameters of a `[rows, cols]` fp8-row matrix."""
    if rows < 1 or cols < 1:
        raise ValueError(f"fp8 row weights need positive dimensions, got [{rows}, {cols}]")
    return {"codes": ((rows, cols), "uint8"), "row_scales": ((rows,), "bfloat16")}


def _i32(x: tirx.PrimExpr) -> tirx.PrimExpr:
    return x.astype("int32")


def e4m3fn_value(word: tirx.PrimExpr) -> tirx.PrimExpr:
    """fp32 value of an E4M3FN word (spec 3.3 table), NaN for 0x7F / 0xFF; exact integer arithmetic."""
    u = _i32(word)
    e, m = (u >> 3) & 15, u & 7
    # e >= 1: (1 + m/8) * 2^(e-7) = ((8 + m) << e) * 2^-10; e = 0: m * 2^-9
    mag = tirx.Select(e == 0, m.astype("float32") * (2.0**-9), ((8 + m) << e).astype("float32") * (2.0**-10))
    val = tirx.Select(u >= 128, -mag, mag)
    return tirx.Select((u & 0x7F) == 0x7F, tirx.const(float("nan"), "float32"), val)


def dequant_element(codes: te.Tensor, scales: te.Tensor):
    """`(n, k) -> fp32 W[n, k]`: `e4m3fn(c) * s`, the product exact in fp32 (4 x 8 significant bits)."""

    def element(n: tirx.PrimExpr, k: tirx.PrimExpr) -> tirx.PrimExpr:
        return e4m3fn_value(codes[n, k]) * scales[n].astype("float32")

    return element


def _te_matmul(x: nn.Tensor, codes: nn.Tensor, scales: nn.Tensor, in_features: int) -> nn.Tensor:
    out_dtype = x.dtype
    rows = int(codes.shape[0])

    def compute(x: te.Tensor, c: te.Tensor, s: te.Tensor) -> te.Tensor:
        w = te.compute((rows, in_features), dequant_element(c, s), name="dequantize")
        k = te.reduce_axis((0, in_features), name="k")
        acc = te.compute(
            (*x.shape[:-1], rows),
            lambda *i: te.sum(x[(*i[:-1], k)].astype("float32") * w[i[-1], k], axis=k),
            name="matmul",
        )
        if out_dtype == "float32":
            return acc
        return te.compute(acc.shape, lambda *i: acc[i].astype(out_dtype), name="cast")

    return op.tensor_expr_op(compute, f"fp8_row_matmul_{dtype_tag(out_dtype)}", [x, codes, scales])


def fp8_row_embedding(ids: nn.Tensor, codes: nn.Tensor, scales: nn.Tensor, dim: int, out_dtype: str) -> nn.Tensor:
    """Rows `ids` (int32, any shape) of an fp8-row table `[V, dim]`, decoded to `out_dtype`."""

    def compute(ids: te.Tensor, c: te.Tensor, s: te.Tensor) -> te.Tensor:
        element = dequant_element(c, s)
        return te.compute((*ids.shape, dim), lambda *i: element(ids[i[:-1]], i[-1]).astype(out_dtype),
                          name="embedding")

    return op.tensor_expr_op(compute, f"fp8_row_embedding_{dtype_tag(out_dtype)}", [ids, codes, scales])


# ---- CUDA: the Triton kernels, ahead of time ------------------------------------------------------

def _images(arch: str) -> dict[str, KernelImage]:
    from . import fp8_row_triton as ft

    dequant = ft.DEQUANT.get(arch, 0)
    images = {}
    for name, (bm, bn, warps, stages, trans) in _gemm_configs(arch).items():
        images["fp8_row_gemm" if name == "narrow" else f"fp8_row_gemm_{name}"] = compile_kernel(
            ft.fp8_row_gemm_kernel,
            signature={"x_ptr": "*bf16", "codes_ptr": "*u8", "scales_ptr": "*bf16", "y_ptr": "*bf16",
                       "M": "i32", "N": "i32", "K64": "i32"},
            constants={"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": ft.GEMM_BLOCK_K, "GROUP_M": ft.GEMM_GROUP_M,
                       "TRANS": trans, "DEQUANT": dequant, "F32_DOT": False},
            arch=arch, num_warps=warps, num_stages=stages,
        )
    gemv = compile_kernel(
        ft.fp8_row_gemv_kernel,
        signature={"x_ptr": "*bf16", "codes_ptr": "*u8", "part_ptr": "*fp32", "M": "i32", "N": "i32",
                   "K16": "i32", "STEPS": "i32"},
        constants={"BLOCK_M": ft.GEMV_BLOCK_M, "BLOCK_N": ft.GEMV_BLOCK_N, "BLOCK_K": ft.GEMV_BLOCK_K,
                   "DEQUANT": dequant, "F32_DOT": False},
        arch=arch, num_warps=ft.GEMV_WARPS, num_stages=ft.GEMV_STAGES,
    )
    return {**images, "fp8_row_gemv": gemv}


def _gemm_configs(arch: str) -> dict[str, tuple[int, int, int, int, bool]]:
    from . import fp8_row_triton as ft

    return ft.GEMM_CONFIGS.get(arch, ft.GEMM_CONFIGS["sm_120a"])


LAUNCHER = r"""
#include "ninfer_cuda.h"
namespace {
struct Shape { int32_t m, n, k16; };

// x [..., K] bf16 and codes [N, K]; K % 16 == 0 (the GEMM checks K % 64 itself)
Shape check(tvm::ffi::TensorView x, tvm::ffi::TensorView codes, const char* what) {
  const int64_t k = x.shape()[x.ndim() - 1];
  const int64_t m = x.numel() / k;
  const int64_t n = codes.shape()[0];
  TVM_FFI_ICHECK(x.dtype().code == kDLBfloat && x.dtype().bits == 16) << what << ": x must be bf16";
  TVM_FFI_ICHECK(codes.ndim() == 2 && codes.shape()[1] == k && k % 16 == 0)
      << what << ": codes do not match K = " << k << " (K % 16 == 0 needed)";
  TVM_FFI_ICHECK(m < (int64_t(1) << 31) && n < (int64_t(1) << 31)) << what << ": too large";
  return Shape{static_cast<int32_t>(m), static_cast<int32_t>(n), static_cast<int32_t>(k / 16)};
}

void gemm(tvm::ffi::TensorView x, tvm::ffi::TensorView codes, tvm::ffi::TensorView scales,
          tvm::ffi::TensorView y) {
  Shape s = check(x, codes, "ninfer_fp8_row_gemm");
  TVM_FFI_ICHECK(scales.numel() == s.n && scales.dtype().code == kDLBfloat && scales.dtype().bits == 16)
      << "ninfer_fp8_row_gemm: one bf16 scale per row";
  TVM_FFI_ICHECK(y.numel() == int64_t(s.m) * s.n) << "ninfer_fp8_row_gemm: output shape";
  TVM_FFI_ICHECK(s.k16 % 4 == 0) << "ninfer_fp8_row_gemm: needs K % 64 == 0";
  if (s.m == 0) return;
  uint64_t xp = ninfer_cuda::pointer(x, "x"), cp = ninfer_cuda::pointer(codes, "codes"),
           sp = ninfer_cuda::pointer(scales, "row_scales"), yp = ninfer_cuda::pointer(y, "y");
  int32_t k64 = s.k16 / 4;
  // the wide-M tile once its grid fills the GPU; short chunks keep more, narrower tiles
  // (fp8_row_triton.gemm_config is the same rule)
  constexpr int64_t kNarrowBM = @NARROW_BM@, kWideBM = @WIDE_BM@, kBN = @GEMM_BN@;  // kWideBM == 0: one image
  const int64_t n_tiles = (s.n + kBN - 1) / kBN;
  int64_t programs = (s.m + kNarrowBM - 1) / kNarrowBM * n_tiles;
  const char* name = "fp8_row_gemm";
  if constexpr (kWideBM > 0) {
    const int64_t wide = (s.m + kWideBM - 1) / kWideBM * n_tiles;
    if (wide >= @WIDE_MIN_TILES@) {
      programs = wide;
      name = "fp8_row_gemm_wide";
    }
  }
  ninfer_cuda::launch(name, static_cast<unsigned>(programs), 1, 1, {&xp, &cp, &sp, &yp, &s.m, &s.n, &k64},
                      x.device().device_id);
}

void gemv(tvm::ffi::TensorView x, tvm::ffi::TensorView codes, int64_t split_count, tvm::ffi::TensorView part) {
  Shape s = check(x, codes, "ninfer_fp8_row_gemv");
  const int32_t splits = static_cast<int32_t>(part.shape()[0]);
  TVM_FFI_ICHECK(splits == split_count && part.numel() == int64_t(splits) * s.m * s.n)
      << "ninfer_fp8_row_gemv: partials shape";
  const int32_t steps_total = (s.k16 * 16 + @GEMV_BK@ - 1) / @GEMV_BK@;
  int32_t steps = (steps_total + splits - 1) / splits;
  uint64_t xp = ninfer_cuda::pointer(x, "x"), cp = ninfer_cuda::pointer(codes, "codes"),
           pp = ninfer_cuda::pointer(part, "partials");
  ninfer_cuda::launch("fp8_row_gemv", static_cast<unsigned>((s.n + @GEMV_BN@ - 1) / @GEMV_BN@),
                      static_cast<unsigned>(splits), static_cast<unsigned>((s.m + @GEMV_BM@ - 1) / @GEMV_BM@),
                      {&xp, &cp, &pp, &s.m, &s.n, &s.k16, &steps}, x.device().device_id);
}
}  // namespace
TVM_FFI_DLL_EXPORT_TYPED_FUNC(ninfer_fp8_row_gemm, gemm);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(ninfer_fp8_row_gemv, gemv);
"""


def _launcher(arch: str) -> str:
    from . import fp8_row_triton as ft

    configs = _gemm_configs(arch)
    narrow, wide = configs["narrow"], configs.get("wide")
    if wide is not None and wide[1] != narrow[1]:
        raise ValueError("the two GEMM tile configs must share BLOCK_N")
    return fill_launcher(LAUNCHER, {"NARROW_BM": narrow[0], "WIDE_BM": wide[0] if wide else 0,
                                    "GEMM_BN": narrow[1], "WIDE_MIN_TILES": ft.WIDE_MIN_TILES,
                                    "GEMV_BM": ft.GEMV_BLOCK_M, "GEMV_BN": ft.GEMV_BLOCK_N,
                                    "GEMV_BK": ft.GEMV_BLOCK_K})


def _module() -> nn.SourceModule:
    def gemm_shape(x, codes, scales):
        return nn.Tensor.placeholder([*x.shape[:-1], codes.shape[0]], x.dtype)

    def gemv_shape(x, codes, splits):
        return nn.Tensor.placeholder([splits, *x.shape[:-1], codes.shape[0]], "float32")

    arch = current_arch()
    return extern(f"fp8_row_{arch}", {GEMM_SYMBOL: gemm_shape, GEMV_SYMBOL: gemv_shape}, _launcher(arch),
                  _images(arch))


def _cuda_bf16(x: nn.Tensor) -> bool:
    target = tvm.target.Target.current(allow_none=True)
    return target is not None and target.kind.name == "cuda" and str(x.dtype) == "bfloat16"


def triton_supported(x: nn.Tensor, in_features: int) -> bool:
    """A CUDA target, bf16 activations, K % 16 == 0, and the Triton kernels switched on."""
    return _cuda_bf16(x) and in_features % 16 == 0 and common.kernel_feature(TRITON_FEATURE)


def _decode_shaped(x: nn.Tensor) -> bool:
    """`[b, 1, K]`: one new token per sequence (decode), at most a few rows."""
    shape = x.shape
    return len(shape) == 3 and isinstance(shape[1], int) and shape[1] == 1


# ---- CUDA: the tensor-core decode GEMV (nvcc) ----------------------------------------------------

def tc_fatbin(arch: str) -> bytes:
    """nvcc's fatbin of `fp8_row_gemv_cuda.cu` for `arch` (SASS only, cached)."""
    return nvcc_fatbin(TC_SOURCE, arch, tag="fp8-row-gemv")


# The launch plan is the nvfp4 GEMV's (`nvfp4.tc_plan`, same 16-row tiles and 128-k chunks, the same
# 128-register budget): K split `ks` per tile, blocks of ks * slots warps, a persistent grid.
TC_LAUNCHER = r"""
#include "ninfer_cuda.h"
namespace {
void gemv_tc(tvm::ffi::TensorView x, tvm::ffi::TensorView codes, tvm::ffi::TensorView scales,
             tvm::ffi::TensorView y) {
  const int64_t k = x.shape()[x.ndim() - 1];
  const int64_t m = x.numel() / k;
  const int64_t n = codes.shape()[0];
  TVM_FFI_ICHECK(x.dtype().code == kDLBfloat && x.dtype().bits == 16) << "ninfer_fp8_row_gemv_tc: x must be bf16";
  TVM_FFI_ICHECK(y.dtype().code == kDLBfloat && y.numel() == m * n) << "ninfer_fp8_row_gemv_tc: output";
  TVM_FFI_ICHECK(codes.ndim() == 2 && codes.shape()[1] == k && k % 128 == 0 && n % 16 == 0)
      << "ninfer_fp8_row_gemv_tc: needs N % 16 == 0 and K % 128 == 0 (N = " << n << ", K = " << k << ")";
  TVM_FFI_ICHECK(scales.numel() == n && scales.dtype().code == kDLBfloat && scales.dtype().bits == 16)
      << "ninfer_fp8_row_gemv_tc: one bf16 scale per row";
  TVM_FFI_ICHECK(n * k < (int64_t(1) << 40) && m * k < (int64_t(1) << 31)) << "ninfer_fp8_row_gemv_tc: too large";
  const int64_t tiles = n / 16, chunks = k / 128;
  if (tiles == 0 || m == 0) return;
  static const int kChoices[] = {1, 2, 4, 5, 8, 10, 16};
  double best = -1.0;
  uint32_t ks = 1, warps = 8, grid = 1;
  for (int ks_c : kChoices) {
    if (ks_c > chunks) continue;
    const int64_t slots = ks_c <= 8 ? 8 / ks_c : 1, w = ks_c * slots;
    const int64_t groups = (tiles + slots - 1) / slots;
    const int64_t res = (@WARPS_PER_SM@ / w) * @SMS@, g = groups < res ? groups : res;
    const int64_t rounds = (groups + g - 1) / g;
    double occupancy = double(g * w) / (@SMS@ * 12.0);
    if (occupancy > 1.0) occupancy = 1.0;
    const double cost = double(rounds * ((chunks + ks_c - 1) / ks_c + 1)) / occupancy;
    if (best < 0.0 || cost < best - 1e-9) {
      best = cost;
      ks = static_cast<uint32_t>(ks_c);
      warps = static_cast<uint32_t>(w);
      grid = static_cast<uint32_t>(g);
    }
  }
  const char* key = warps == 5 ? "gemv_w5" : warps == 8 ? "gemv_w8" : warps == 10 ? "gemv_w10" : "gemv_w16";
  uint64_t cp = ninfer_cuda::pointer(codes, "codes"), sp = ninfer_cuda::pointer(scales, "row_scales");
  const uint64_t x0 = ninfer_cuda::pointer(x, "x"), y0 = ninfer_cuda::pointer(y, "y");
  uint32_t nn = static_cast<uint32_t>(n), kk = static_cast<uint32_t>(k);
  for (int64_t b0 = 0; b0 < m; b0 += 8) {  // 8 batch rows per weight read
    uint64_t xp = x0 + static_cast<uint64_t>(b0 * k * 2), yp = y0 + static_cast<uint64_t>(b0 * n * 2);
    uint32_t rows = static_cast<uint32_t>(m - b0 < 8 ? m - b0 : 8);
    ninfer_cuda::launch(key, grid, 1, 1, {&xp, &cp, &sp, &yp, &nn, &kk, &rows, &ks}, x.device().device_id);
  }
}
}  // namespace
TVM_FFI_DLL_EXPORT_TYPED_FUNC(ninfer_fp8_row_gemv_tc, gemv_tc);
"""


def _tc_module() -> nn.SourceModule:
    def shape(x, codes, scales):
        return nn.Tensor.placeholder([*x.shape[:-1], codes.shape[0]], x.dtype)

    arch = current_arch()
    data = tc_fatbin(arch)
    images = {f"gemv_w{w}": CudaImage("ninfer_fp8_row_gemv_ybf16", data, 32 * w) for w in (5, 8, 10, 16)}
    launcher = fill_launcher(TC_LAUNCHER, {"WARPS_PER_SM": WARPS_PER_SM, "SMS": SMS.get(arch, 132)})
    return extern(f"fp8_row_gemv_tc_{arch}", {TC_SYMBOL: shape}, launcher, images)


def tc_supported(x: nn.Tensor, rows: int, in_features: int) -> bool:
    """Decode-shaped bf16 on CUDA, the shapes the tensor-core GEMV takes, and its feature on."""
    return (_cuda_bf16(x) and _decode_shaped(x) and rows % 16 == 0 and in_features % 128 == 0
            and common.kernel_feature(TC_FEATURE))


def fp8_row_matmul(x: nn.Tensor, codes: nn.Tensor, scales: nn.Tensor, in_features: int) -> nn.Tensor:
    """`y[..., n] = s[n] * sum_k x[..., k] * e4m3fn(c[n, k])`, fp32 accumulation, y in x's dtype."""
    rows = int(codes.shape[0])
    if tc_supported(x, rows, in_features):
        return _tc_module()[TC_SYMBOL](x, codes, scales)
    if not triton_supported(x, in_features):
        return _te_matmul(x, codes, scales, in_features)
    module = _module()
    if _decode_shaped(x):
        from .fp8_row_triton import gemv_split

        splits, _ = gemv_split(rows, in_features)
        # shape inference gets the split count; the launcher derives the steps from it
        part = module[GEMV_SYMBOL](x, codes, splits)
        return (op.sum(part, axis=0) * scales.astype("float32")).astype(x.dtype)
    if in_features % 64:
        return _te_matmul(x, codes, scales, in_features)  # the GEMM's K loop has no masks
    return module[GEMM_SYMBOL](x, codes, scales)
