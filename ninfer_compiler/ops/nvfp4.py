"""`y = x @ W^T` over nvfp4 weights (artifact spec 3.3), consumed as their stored planes.

Parameters of an `[N, K]` matrix (`plane_shapes`): `codes` uint8 `[N, K/2]` (the code plane as
stored: even k in the low nibble), `block_scales` uint8 `[N, K/16]` (E4M3FN words, natural order:
`runtime/weights.py` un-swizzles the 128x4 tiles at load time, because bindings address row
ranges of packed parents that need not start on a 128-row tile) and `divisor` fp32 `[1]`.

On CUDA targets with bf16 activations, decode-shaped calls (`[b, 1, K]`, N % 16 == 0, K % 128 == 0)
run the tensor-core GEMV of `nvfp4_gemv_cuda.cu` (nvcc, SASS only, extern `ninfer_nvfp4_gemv_tc`);
other calls run the Triton kernels of `ops/nvfp4_triton.py` (a tensor-core GEMM, and a GEMV for
decode shapes the CUDA kernel does not take), compiled ahead of time and launched from the
package's host library. Elsewhere (the `cpu` target) one TE op dequantizes
`W[n, k] = e2m1 * e4m3 / d` in fp32, as the artifact's decoder does, and accumulates in fp32.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import tvm
from tvm import te, tirx
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import op

from ..codegen.toolchain import nvcc_fatbin
from .common import dtype_tag, tuned_cuda_kernels
from .cuda_extern import current_arch, extern
from .triton_aot import KernelImage, compile_kernel

PLANES = ("codes", "block_scales", "divisor")
GEMM_SYMBOL, GEMV_SYMBOL = "ninfer_nvfp4_gemm", "ninfer_nvfp4_gemv"
TC_SYMBOL = "ninfer_nvfp4_gemv_tc"
TC_SOURCE = Path(__file__).resolve().parent / "nvfp4_gemv_cuda.cu"


def plane_shapes(rows: int, cols: int) -> dict[str, tuple[tuple[int, ...], str]]:
    """`{plane: (shape, dtype)}` of the parameters of a `[rows, cols]` nvfp4 matrix."""
    if cols % 64:
        raise ValueError(f"nvfp4 needs K % 64 == 0 (block_scale_k16_m128x4_v1), got K = {cols}")
    return {"codes": ((rows, cols // 2), "uint8"), "block_scales": ((rows, cols // 16), "uint8"),
            "divisor": ((1,), "float32")}


def _i32(x: tirx.PrimExpr) -> tirx.PrimExpr:
    return x.astype("int32")


def dequant_element(codes: te.Tensor, scales: te.Tensor, divisor: te.Tensor):
    """`(n, k) -> fp32 W[n, k]`: `e2m1(c) * e4m3fn(s) / d`, the product exact before the divide."""

    def element(n: tirx.PrimExpr, k: tirx.PrimExpr) -> tirx.PrimExpr:
        u = (_i32(codes[n, k // 2]) >> (_i32(k % 2) * 4)) & 0xF
        mag, e = u & 7, (u & 7) >> 1
        mant = mag & 1
        # e >= 1: (1 + m/2) * 2^(e-1) = ((2 + m) << e) / 4; e = 0: m / 2
        val = tirx.Select(e == 0, mant.astype("float32") * 0.5, ((2 + mant) << e).astype("float32") * 0.25)
        val = tirx.Select(u >= 8, -val, val)
        s = _i32(scales[n, k // 16])
        se, sm = s >> 3, s & 7
        # se >= 1: (1 + m/8) * 2^(se-7) = ((8 + m) << se) * 2^-10; se = 0: m * 2^-9
        scale = tirx.Select(se == 0, sm.astype("float32") * (2.0**-9),
                            ((8 + sm) << se).astype("float32") * (2.0**-10))
        return val * scale / divisor[0]

    return element


def _te_matmul(x: nn.Tensor, codes: nn.Tensor, scales: nn.Tensor, divisor: nn.Tensor, in_features: int) -> nn.Tensor:
    out_dtype = x.dtype
    rows = int(codes.shape[0])

    def compute(x: te.Tensor, c: te.Tensor, s: te.Tensor, d: te.Tensor) -> te.Tensor:
        w = te.compute((rows, in_features), dequant_element(c, s, d), name="dequantize")
        k = te.reduce_axis((0, in_features), name="k")
        acc = te.compute(
            (*x.shape[:-1], rows),
            lambda *i: te.sum(x[(*i[:-1], k)].astype("float32") * w[i[-1], k], axis=k),
            name="matmul",
        )
        if out_dtype == "float32":
            return acc
        return te.compute(acc.shape, lambda *i: acc[i].astype(out_dtype), name="cast")

    return op.tensor_expr_op(compute, f"nvfp4_matmul_{dtype_tag(out_dtype)}", [x, codes, scales, divisor])


# ---- CUDA: the Triton kernels, ahead of time ------------------------------------------------------

def _images(arch: str) -> dict[str, KernelImage]:
    from . import nvfp4_triton as nt

    planes = {"x_ptr": "*bf16", "codes_ptr": "*u8", "scales_ptr": "*u8", "divisor_ptr": "*fp32"}
    gemm = compile_kernel(
        nt.nvfp4_gemm_kernel,
        signature={**planes, "y_ptr": "*bf16", "M": "i32", "N": "i32", "K64": "i32"},
        constants={"BLOCK_M": nt.GEMM_BLOCK_M, "BLOCK_N": nt.GEMM_BLOCK_N, "BLOCK_K": nt.GEMM_BLOCK_K,
                   "GROUP_M": nt.GEMM_GROUP_M, "TRANS": False, "F32_DOT": False},
        arch=arch, num_warps=nt.GEMM_WARPS, num_stages=nt.GEMM_STAGES,
    )
    gemv = compile_kernel(
        nt.nvfp4_gemv_kernel,
        signature={**planes, "part_ptr": "*fp32", "M": "i32", "N": "i32", "K64": "i32", "STEPS": "i32"},
        constants={"BLOCK_M": nt.GEMV_BLOCK_M, "BLOCK_N": nt.GEMV_BLOCK_N, "BLOCK_K": nt.GEMV_BLOCK_K,
                   "F32_DOT": False},
        arch=arch, num_warps=nt.GEMV_WARPS, num_stages=nt.GEMV_STAGES,
    )
    return {"nvfp4_gemm": gemm, "nvfp4_gemv": gemv}


LAUNCHER = r"""
#include "ninfer_cuda.h"
namespace {
struct Shape { int32_t m, n, k64; };

Shape check(tvm::ffi::TensorView x, tvm::ffi::TensorView codes, tvm::ffi::TensorView scales,
            tvm::ffi::TensorView divisor, const char* what) {
  const int64_t k = x.shape()[x.ndim() - 1];
  const int64_t m = x.numel() / k;
  const int64_t n = codes.shape()[0];
  TVM_FFI_ICHECK(x.dtype().code == kDLBfloat && x.dtype().bits == 16) << what << ": x must be bf16";
  TVM_FFI_ICHECK(codes.shape()[1] * 2 == k && k % 64 == 0) << what << ": codes do not match K = " << k;
  TVM_FFI_ICHECK(scales.shape()[0] == n && scales.shape()[1] * 16 == k) << what << ": block scales do not match";
  TVM_FFI_ICHECK(divisor.numel() == 1) << what << ": one divisor per matrix";
  TVM_FFI_ICHECK(m < (int64_t(1) << 31) && n < (int64_t(1) << 31)) << what << ": too large";
  return Shape{static_cast<int32_t>(m), static_cast<int32_t>(n), static_cast<int32_t>(k / 64)};
}

void gemm(tvm::ffi::TensorView x, tvm::ffi::TensorView codes, tvm::ffi::TensorView scales,
          tvm::ffi::TensorView divisor, tvm::ffi::TensorView y) {
  Shape s = check(x, codes, scales, divisor, "ninfer_nvfp4_gemm");
  TVM_FFI_ICHECK(y.numel() == int64_t(s.m) * s.n) << "ninfer_nvfp4_gemm: output shape";
  uint64_t xp = ninfer_cuda::pointer(x, "x"), cp = ninfer_cuda::pointer(codes, "codes"),
           sp = ninfer_cuda::pointer(scales, "block_scales"), dp = ninfer_cuda::pointer(divisor, "divisor"),
           yp = ninfer_cuda::pointer(y, "y");
  const unsigned programs = static_cast<unsigned>(((s.m + GEMM_BM - 1) / GEMM_BM) * ((s.n + GEMM_BN - 1) / GEMM_BN));
  ninfer_cuda::launch("nvfp4_gemm", programs, 1, 1, {&xp, &cp, &sp, &dp, &yp, &s.m, &s.n, &s.k64},
                      x.device().device_id);
}

void gemv(tvm::ffi::TensorView x, tvm::ffi::TensorView codes, tvm::ffi::TensorView scales,
          tvm::ffi::TensorView divisor, int64_t split_count, tvm::ffi::TensorView part) {
  Shape s = check(x, codes, scales, divisor, "ninfer_nvfp4_gemv");
  const int32_t splits = static_cast<int32_t>(part.shape()[0]);
  TVM_FFI_ICHECK(splits == split_count && part.numel() == int64_t(splits) * s.m * s.n)
      << "ninfer_nvfp4_gemv: partials shape";
  const int32_t steps_total = (s.k64 * 64 + GEMV_BK - 1) / GEMV_BK;
  int32_t steps = (steps_total + splits - 1) / splits;
  uint64_t xp = ninfer_cuda::pointer(x, "x"), cp = ninfer_cuda::pointer(codes, "codes"),
           sp = ninfer_cuda::pointer(scales, "block_scales"), dp = ninfer_cuda::pointer(divisor, "divisor"),
           pp = ninfer_cuda::pointer(part, "partials");
  ninfer_cuda::launch("nvfp4_gemv", static_cast<unsigned>((s.n + GEMV_BN - 1) / GEMV_BN),
                      static_cast<unsigned>(splits), static_cast<unsigned>((s.m + GEMV_BM - 1) / GEMV_BM),
                      {&xp, &cp, &sp, &dp, &pp, &s.m, &s.n, &s.k64, &steps}, x.device().device_id);
}
}  // namespace
TVM_FFI_DLL_EXPORT_TYPED_FUNC(ninfer_nvfp4_gemm, gemm);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(ninfer_nvfp4_gemv, gemv);
"""


def _launcher() -> str:
    from . import nvfp4_triton as nt

    consts = {"GEMM_BM": nt.GEMM_BLOCK_M, "GEMM_BN": nt.GEMM_BLOCK_N, "GEMV_BM": nt.GEMV_BLOCK_M,
              "GEMV_BN": nt.GEMV_BLOCK_N, "GEMV_BK": nt.GEMV_BLOCK_K}
    src = LAUNCHER
    for name, value in consts.items():
        src = src.replace(name, str(value))
    return src


def _module() -> nn.SourceModule:
    def gemm_shape(x, codes, scales, divisor):
        return nn.Tensor.placeholder([*x.shape[:-1], codes.shape[0]], x.dtype)

    def gemv_shape(x, codes, scales, divisor, splits):
        return nn.Tensor.placeholder([splits, *x.shape[:-1], codes.shape[0]], "float32")

    arch = current_arch()
    return extern(f"nvfp4_{arch}", {GEMM_SYMBOL: gemm_shape, GEMV_SYMBOL: gemv_shape}, _launcher(), _images(arch))


def cuda_supported(x: nn.Tensor, in_features: int) -> bool:
    """A CUDA target and bf16 activations (the Triton kernels' operand type)."""
    target = tvm.target.Target.current(allow_none=True)
    return (target is not None and target.kind.name == "cuda" and tuned_cuda_kernels() and str(x.dtype) == "bfloat16"
            and in_features % 64 == 0)


def _decode_shaped(x: nn.Tensor) -> bool:
    """`[b, 1, K]`: one new token per sequence (decode), at most a few rows."""
    shape = x.shape
    return len(shape) == 3 and isinstance(shape[1], int) and shape[1] == 1


# ---- CUDA: the tensor-core decode GEMV (nvcc) ----------------------------------------------------

@dataclass(frozen=True)
class CudaImage:
    """An nvcc fatbin launched by entry `name` with `threads` per block (`cuda_extern.Image`)."""

    name: str
    fatbin: bytes
    threads: int
    shared: int = 0


def tc_fatbin(arch: str) -> bytes:
    """nvcc's fatbin of `nvfp4_gemv_cuda.cu` for `arch` (SASS only, cached)."""
    return nvcc_fatbin(TC_SOURCE, arch, tag="nvfp4-gemv")


SMS = {"sm_90a": 132, "sm_120a": 170, "sm_121a": 48}  # H200 / H100 SXM, RTX 5090, GB10
WARPS_PER_SM = 16  # the kernel's 128 registers per thread
KS_CHOICES = (1, 2, 4, 5, 8, 10, 16)


def tc_plan(rows: int, k: int, sms: int) -> tuple[int, int, int]:
    """`(ks, warps per block, grid)` of a launch: warps splitting K per 16-row tile, block size and
    (persistent) grid. Why: blocks loop over row groups, so the cost is the rounds of groups per
    block times the chunks per warp (plus one for the per-group reduction), stretched when fewer
    than ~12 warps per SM are busy. The launcher (`TC_LAUNCHER`) computes the same."""
    tiles, chunks = rows // 16, k // 128
    if tiles == 0:
        return 1, 8, 0
    best: tuple[float, int, int, int] | None = None
    for ks in KS_CHOICES:
        if ks > chunks:
            continue
        slots = max(1, 8 // ks)
        warps = ks * slots
        groups = -(-tiles // slots)
        grid = min(groups, (WARPS_PER_SM // warps) * sms)
        rounds = -(-groups // grid)
        occupancy = min(1.0, grid * warps / (sms * 12.0))
        cost = rounds * (-(-chunks // ks) + 1) / occupancy
        if best is None or cost < best[0] - 1e-9:
            best = (cost, ks, warps, grid)
    assert best is not None
    return best[1], best[2], best[3]


TC_LAUNCHER = r"""
#include "ninfer_cuda.h"
namespace {
void gemv_tc(tvm::ffi::TensorView x, tvm::ffi::TensorView codes, tvm::ffi::TensorView scales,
             tvm::ffi::TensorView divisor, tvm::ffi::TensorView y) {
  const int64_t k = x.shape()[x.ndim() - 1];
  const int64_t m = x.numel() / k;
  const int64_t n = codes.shape()[0];
  TVM_FFI_ICHECK(x.dtype().code == kDLBfloat && x.dtype().bits == 16) << "ninfer_nvfp4_gemv_tc: x must be bf16";
  TVM_FFI_ICHECK(y.dtype().code == kDLBfloat && y.numel() == m * n) << "ninfer_nvfp4_gemv_tc: output";
  TVM_FFI_ICHECK(codes.shape()[1] * 2 == k && k % 128 == 0 && n % 16 == 0)
      << "ninfer_nvfp4_gemv_tc: needs N % 16 == 0 and K % 128 == 0 (N = " << n << ", K = " << k << ")";
  TVM_FFI_ICHECK(scales.shape()[0] == n && scales.shape()[1] * 16 == k) << "ninfer_nvfp4_gemv_tc: block scales";
  TVM_FFI_ICHECK(divisor.numel() == 1) << "ninfer_nvfp4_gemv_tc: one divisor per matrix";
  TVM_FFI_ICHECK(n * k / 2 < (int64_t(1) << 32) && m * k < (int64_t(1) << 31)) << "ninfer_nvfp4_gemv_tc: too large";
  // launch plan (tc_plan in ops/nvfp4.py): K split, warps per block, persistent grid
  const int64_t tiles = n / 16, chunks = k / 128;
  if (tiles == 0 || m == 0) return;
  static const int kChoices[] = {1, 2, 4, 5, 8, 10, 16};
  double best = -1.0;
  uint32_t ks = 1, warps = 8, grid = 1;
  for (int ks_c : kChoices) {
    if (ks_c > chunks) continue;
    const int64_t slots = ks_c <= 8 ? 8 / ks_c : 1, w = ks_c * slots;
    const int64_t groups = (tiles + slots - 1) / slots;
    const int64_t res = (WARPS_PER_SM / w) * SMS, g = groups < res ? groups : res;
    const int64_t rounds = (groups + g - 1) / g;
    double occupancy = double(g * w) / (SMS * 12.0);
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
  uint64_t cp = ninfer_cuda::pointer(codes, "codes"), sp = ninfer_cuda::pointer(scales, "block_scales"),
           dp = ninfer_cuda::pointer(divisor, "divisor");
  const uint64_t x0 = ninfer_cuda::pointer(x, "x"), y0 = ninfer_cuda::pointer(y, "y");
  uint32_t nn = static_cast<uint32_t>(n), kk = static_cast<uint32_t>(k);
  for (int64_t b0 = 0; b0 < m; b0 += 8) {  // 8 batch rows per weight read
    uint64_t xp = x0 + static_cast<uint64_t>(b0 * k * 2), yp = y0 + static_cast<uint64_t>(b0 * n * 2);
    uint32_t rows = static_cast<uint32_t>(m - b0 < 8 ? m - b0 : 8);
    ninfer_cuda::launch(key, grid, 1, 1, {&xp, &cp, &sp, &dp, &yp, &nn, &kk, &rows, &ks}, x.device().device_id);
  }
}
}  // namespace
TVM_FFI_DLL_EXPORT_TYPED_FUNC(ninfer_nvfp4_gemv_tc, gemv_tc);
"""


def _tc_module() -> nn.SourceModule:
    def shape(x, codes, scales, divisor):
        return nn.Tensor.placeholder([*x.shape[:-1], codes.shape[0]], x.dtype)

    arch = current_arch()
    data = tc_fatbin(arch)
    images = {f"gemv_w{w}": CudaImage("ninfer_nvfp4_gemv_ybf16", data, 32 * w) for w in (5, 8, 10, 16)}
    launcher = (TC_LAUNCHER.replace("WARPS_PER_SM", str(WARPS_PER_SM))
                .replace("SMS", str(SMS.get(arch, 132))))
    return extern(f"nvfp4_gemv_tc_{arch}", {TC_SYMBOL: shape}, launcher, images)


def tc_supported(x: nn.Tensor, rows: int, in_features: int) -> bool:
    """Decode-shaped, and the shapes the tensor-core GEMV takes (16-row tiles, 128-k chunks)."""
    return _decode_shaped(x) and rows % 16 == 0 and in_features % 128 == 0


def nvfp4_matmul(x: nn.Tensor, codes: nn.Tensor, scales: nn.Tensor, divisor: nn.Tensor, in_features: int) -> nn.Tensor:
    """`y[..., n] = sum_k x[..., k] * W[n, k]`, fp32 accumulation, y in x's dtype."""
    if not cuda_supported(x, in_features):
        return _te_matmul(x, codes, scales, divisor, in_features)
    rows = int(codes.shape[0])
    if tc_supported(x, rows, in_features):
        return _tc_module()[TC_SYMBOL](x, codes, scales, divisor)
    from .nvfp4_triton import gemv_split

    module = _module()
    if _decode_shaped(x):
        splits, _ = gemv_split(rows, in_features)
        # shape inference gets the split count; the launcher derives the steps from it
        part = module[GEMV_SYMBOL](x, codes, scales, divisor, splits)
        return op.sum(part, axis=0).astype(x.dtype)
    return module[GEMM_SYMBOL](x, codes, scales, divisor)
