"""A decode activation row quantized to the int8 GEMVs' layout by a kernel of its own.

Why: at one request the q4 SwiGLU hands its output to the q5 down projection as int8 activations
(the down projection ~8 us faster a layer), but inside the SwiGLU that handover is a cross-block
step: a 64-group's 64 outputs come from 4 blocks, so every block fences and counts itself in and
the group's last block reloads and quantizes it, ~4.7 us on every launch wave's tail. Here the
SwiGLU writes bf16 only and this kernel, PDL-chained between the two launches, quantizes the row:
its programs own whole groups (256 outputs, 4 groups each), so no program waits for another.

The codes are `norm_xq8`'s for the same bf16 values but at exact ties, which round half up here
(`xq_triton.xq_store`; layout in ops/qgemv_cuda.cu `v4_stage_i8`). Written at up to `max_rows` rows
(at most 4, what the layout holds; the MLP: the rows its down projection reads int8 at); above that
nothing is launched and the GEMV reads the bf16 row.
"""

from __future__ import annotations

import triton
import triton.language as tl
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import op

from .cuda_extern import current_arch, extern, fill_launcher, inplace_call
from .pdl import pdl_enter, pdl_mode
from .triton_aot import KernelImage, compile_kernel
from .xq_triton import xq_store

SYMBOL = "ninfer_xq_quantize"
WIDTH = 256  # outputs per program: 4 groups of 64, one unit of the int8 stages
MAX_ROWS = 4  # rows the int8 layout holds


@triton.jit
def xq_quantize_kernel(y, xq, xs, K: tl.constexpr, W: tl.constexpr, PDL: tl.constexpr = False):
    """Program (c, r): elements c * W .. of row r of `y` [rows, K] (bf16) into the xq bytes / scales."""
    c = tl.program_id(0)
    r = tl.program_id(1)
    if PDL:  # launched with PDL (ninfer_cuda::launch): wait for the previous kernel, let the next one start
        pdl_enter(PDL)
    v = tl.load(y + r.to(tl.int64) * K + c * W + tl.arange(0, W)).to(tl.float32)
    xq_store(v, xq, xs, r, c * W, W)


def image(k: int, arch: str) -> KernelImage:
    """The kernel for rows of `k` elements."""
    return compile_kernel(
        xq_quantize_kernel, signature={"y": "*bf16", "xq": "*i8", "xs": "*fp32"},
        constants={"K": k, "W": WIDTH, "PDL": pdl_mode()}, arch=arch, num_warps=2, num_stages=1,
    )


LAUNCHER = r"""
#include "ninfer_cuda.h"
namespace {
using tvm::ffi::TensorView;
// In place on `xq` (uint8, K * 8 + K / 256 * 64 bytes: rows 0..3, then the scales), which it returns;
// written at <= @MAX_ROWS@ rows.
tvm::ffi::Tensor xq_quantize(TensorView y, tvm::ffi::Tensor xq) {
  const int64_t rows = y.shape()[0];
  TVM_FFI_ICHECK(y.ndim() == 3 && y.shape()[1] == 1 && y.shape()[2] == @K@) << "@SYMBOL@: y shape";
  TVM_FFI_ICHECK(xq.numel() == @K@ * 8 + @K@ / 256 * 64 && xq.dtype().bits == 8) << "@SYMBOL@: xq size";
  if (rows <= @MAX_ROWS@) {  // (more rows: the GEMV reads y, nothing to write)
    uint64_t p[3] = {ninfer_cuda::pointer(y, "y"), ninfer_cuda::pointer(xq, "xq"), 0};
    p[2] = p[1] + @K@ * 8;
    ninfer_cuda::launch(@KERNEL@, @K@ / @W@, static_cast<unsigned>(rows), 1, {&p[0], &p[1], &p[2]},
                        y.device().device_id, /*pdl=*/true);
  }
  return xq;
}
}  // namespace
TVM_FFI_DLL_EXPORT_TYPED_FUNC(@SYMBOL@, xq_quantize);
"""


def supported(y: nn.Tensor) -> bool:
    """A bf16 decode row `[B, 1, K]` with a static K of whole 256-element units."""
    k = y.shape[-1]
    return (len(y.shape) == 3 and isinstance(y.shape[1], int) and y.shape[1] == 1 and isinstance(k, int)
            and k % WIDTH == 0 and str(y.dtype) == "bfloat16")


def xq_quantize(y: nn.Tensor, max_rows: int = MAX_ROWS) -> nn.Tensor:
    """`y [B, 1, K]` as int8 activations (uint8 `[K * 8 + K / 256 * 64]`, written at <= `max_rows` rows)."""
    if not supported(y):
        raise ValueError(f"xq_quantize: needs bf16 [B, 1, K] with K % {WIDTH} == 0, got {y.dtype} {list(y.shape)}")
    if not 1 <= max_rows <= MAX_ROWS:
        raise ValueError(f"xq_quantize: max_rows must be 1..{MAX_ROWS}, got {max_rows}")
    k = int(y.shape[-1])
    img = image(k, current_arch())
    symbol = f"{SYMBOL}_k{k}_r{max_rows}"
    launcher = fill_launcher(LAUNCHER, {"K": k, "W": WIDTH, "MAX_ROWS": max_rows, "KERNEL": f'"{img.name}"',
                                        "SYMBOL": symbol})
    extern(symbol, {symbol: lambda *args: args[-1]}, launcher, [img])
    xq = op.empty([k * 8 + k // 256 * 64], "uint8", name="xq_quantize_out")
    return inplace_call(symbol, [y], [xq])
