"""Dense `x @ W^T` for many tokens on CUDA targets: a Triton tensor-core GEMM, compiled ahead of time.

Why: the bf16 weights that stay unquantized (the GDN decay and write-strength projections,
48 x 5120 on the 27B) are matmuls of a whole prefill chunk. dlight's SIMT Matmul gives them 32
blocks and 0.3-0.5 ms per 1,024 tokens (docs/kernel-notes.md), 96 launches per chunk. This
kernel tiles M (tokens) and N and uses the tensor cores; fp32 accumulation, the result in the
activation dtype.
"""

from __future__ import annotations

import triton
import triton.language as tl
import tvm
from tvm.relax.frontend import nn

from .cuda_extern import current_arch, extern
from .triton_aot import KernelImage, compile_kernel

SYMBOL = "ninfer_dense_nt"
BLOCK_M, BLOCK_N, BLOCK_K = 64, 64, 64
TYPES = {"bfloat16": "bf16", "float16": "fp16"}


@triton.jit
def dense_nt_kernel(x, w, y, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr):
    """One `BLOCK_M x BLOCK_N` tile of `y = x @ w^T`; `x [M, K]`, `w [N, K]`, row-major."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        a = tl.load(x + rm[:, None].to(tl.int64) * K + kk[None, :],
                    mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        b = tl.load(w + rn[:, None].to(tl.int64) * K + kk[None, :],
                    mask=(rn[:, None] < N) & (kk[None, :] < K), other=0.0)
        acc = tl.dot(a, tl.trans(b), acc)
    out = y + rm[:, None].to(tl.int64) * N + rn[None, :]
    tl.store(out, acc.to(y.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


def image(dtype: str, arch: str) -> KernelImage:
    """The kernel for activations and weights of `dtype` on `arch`."""
    t = TYPES[dtype]
    return compile_kernel(
        dense_nt_kernel,
        signature={"x": f"*{t}", "w": f"*{t}", "y": f"*{t}", "M": "i32", "N": "i32", "K": "i32"},
        constants={"BLOCK_M": BLOCK_M, "BLOCK_N": BLOCK_N, "BLOCK_K": BLOCK_K},
        arch=arch, num_warps=4, num_stages=3,
    )


LAUNCHER = r"""
#include "ninfer_cuda.h"
namespace {
void dense_nt(tvm::ffi::TensorView x, tvm::ffi::TensorView w, tvm::ffi::TensorView y) {
  const int64_t k = x.shape()[x.ndim() - 1];
  const int64_t m = x.numel() / k;
  const int64_t n = w.shape()[0];
  TVM_FFI_ICHECK(w.shape()[1] == k && y.numel() == m * n) << "ninfer_dense_nt: shape mismatch";
  TVM_FFI_ICHECK(m < (int64_t(1) << 31) && n < (int64_t(1) << 31)) << "ninfer_dense_nt: too large";
  uint64_t xp = ninfer_cuda::pointer(x, "x"), wp = ninfer_cuda::pointer(w, "w"), yp = ninfer_cuda::pointer(y, "y");
  int32_t m32 = static_cast<int32_t>(m), n32 = static_cast<int32_t>(n), k32 = static_cast<int32_t>(k);
  const char* name = x.dtype().code == kDLBfloat ? "dense_nt_kernel_bf16" : "dense_nt_kernel_fp16";
  ninfer_cuda::launch(name, static_cast<unsigned>((m + BLOCK_M - 1) / BLOCK_M),
                      static_cast<unsigned>((n + BLOCK_N - 1) / BLOCK_N), 1,
                      {&xp, &wp, &yp, &m32, &n32, &k32}, x.device().device_id);
}
}  // namespace
TVM_FFI_DLL_EXPORT_TYPED_FUNC(ninfer_dense_nt, dense_nt);
"""


def supported(x: nn.Tensor, weight: nn.Tensor) -> bool:
    """A CUDA target, same 16-bit float dtype for both, K a multiple of 8 (16-byte rows)."""
    target = tvm.target.Target.current(allow_none=True)
    if target is None or target.kind.name != "cuda":
        return False
    if str(x.dtype) not in TYPES or str(weight.dtype) != str(x.dtype):
        return False
    k = weight.shape[-1]
    return isinstance(k, int) and k % 8 == 0 and len(weight.shape) == 2


def dense_nt(x: nn.Tensor, weight: nn.Tensor) -> nn.Tensor:
    """`y[..., n] = sum_k x[..., k] * weight[n, k]` through the Triton GEMM."""
    arch = current_arch()
    images = {f"dense_nt_kernel_{tag}": image(dtype, arch) for dtype, tag in TYPES.items()}
    launcher = LAUNCHER.replace("BLOCK_M", str(BLOCK_M)).replace("BLOCK_N", str(BLOCK_N))
    mod = extern(
        "dense_nt",
        {SYMBOL: lambda x, w: nn.Tensor.placeholder([*x.shape[:-1], w.shape[0]], x.dtype)},
        launcher,
        images,
    )
    return mod[SYMBOL](x, weight)
