"""Dense `x @ W^T` for many tokens on CUDA targets: a Triton tensor-core GEMM, compiled ahead of time.

Why: the bf16 weights that stay unquantized (the GDN decay and write-strength projections,
48 x 5120 on the 27B) are matmuls of a whole prefill chunk, 96 launches per chunk. dlight's SIMT
Matmul gave them 0.3-0.5 ms per 1,024 tokens; a first tensor-core kernel with runtime `N`/`K`
still took 116-160 us (16-120 programs, and its unaligned rows kept the loads scalar). This one
is specialized per weight shape (`N`, `K` compile-time: rows are known multiples of 16 bytes,
loads vectorize, no K masks), computes `acc[n, m] = W_tile @ x_tile^T` so the 48 weight rows fill
one 64-row MMA side while the token side can be narrow, and the launcher picks the token tile
from `M` at run time: narrow tiles for short chunks (more programs reach the SMs), wide ones once
there are enough (each program streams the whole weight from L2, so fewer, wider programs read
less of it): 15-32 us at 1,024-7,680 tokens on the H200. fp32 accumulation, the result in the activation dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import triton
import triton.language as tl
import tvm
from tvm.relax.frontend import nn

from .cuda_extern import current_arch, extern, fill_launcher
from .triton_aot import KernelImage, compile_kernel

TYPES = {"bfloat16": "bf16", "float16": "fp16"}
BLOCK_N = 64  # weight rows per program (one 64-row MMA side)
WIDE_MIN_PROGRAMS = 32  # wide-token programs from which they beat the narrow ones (H200, measured)


@dataclass(frozen=True)
class Config:
    """One compiled tile: tokens per program, K per step, warps, pipeline stages."""

    block_m: int
    block_k: int
    num_warps: int
    num_stages: int


def configs(arch: str) -> tuple[Config, Config]:
    """`(narrow, wide)` token tiles for `arch` (docs/kernels/prefill-gemm.md, "dense").

    H200, 48 x 5120: 32 tokens x 128 lanes is fastest at 1,024 tokens (14.8 us), 64 x 128 from
    2,048 on (17.4 us; 31.7 us at 7,680). sm_120/121 (~100 KB of shared memory per block) get
    64-lane K steps and 3 stages (not measured on those GPUs).
    """
    if arch == "sm_90a":
        return Config(32, 128, 4, 4), Config(64, 128, 4, 4)
    return Config(32, 64, 4, 3), Config(64, 64, 4, 3)


def kernel_name(spec) -> str:
    """Entry symbol per specialization (one launcher embeds several images)."""
    c = spec.constants
    t = str(spec.signature["x"]).removeprefix("*")
    return f"ninfer_dense_nt_{t}_n{c['N']}_k{c['K']}_t{c['BLOCK_M']}x{c['BLOCK_N']}k{c['BLOCK_K']}"


@triton.jit(repr=kernel_name)
def dense_nt_kernel(x, w, y, M, N: tl.constexpr, K: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One `BLOCK_M x BLOCK_N` tile of `y = x @ w^T`; `x [M, K]`, `w [N, K]`, row-major (entry
    symbol `ninfer_dense_nt_<dtype>_n<N>_k<K>_t<BLOCK_M>x<BLOCK_N>k<BLOCK_K>`).

    Rows past `M` or `N` read a clamped row and are not stored; K steps past `K` are masked only
    when `BLOCK_K` does not divide `K`.
    """
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    x_rows = x + tl.minimum(rm, M - 1)[:, None].to(tl.int64) * K
    w_rows = w + tl.minimum(rn, N - 1)[:, None].to(tl.int64) * K
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        if K % BLOCK_K == 0:
            a = tl.load(x_rows + kk[None, :])
            b = tl.load(w_rows + kk[None, :])
        else:
            a = tl.load(x_rows + kk[None, :], mask=(kk < K)[None, :], other=0.0)
            b = tl.load(w_rows + kk[None, :], mask=(kk < K)[None, :], other=0.0)
        acc = tl.dot(b, tl.trans(a), acc)
    out = y + rm[:, None].to(tl.int64) * N + rn[None, :]
    tl.store(out, tl.trans(acc).to(y.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


def image(dtype: str, arch: str, n: int, k: int, cfg: Config) -> KernelImage:
    """The kernel for `[*, k] @ [n, k]^T` in `dtype` on `arch` with the token tile `cfg`."""
    t = TYPES[dtype]
    return compile_kernel(
        dense_nt_kernel,
        signature={"x": f"*{t}", "w": f"*{t}", "y": f"*{t}", "M": "i32"},
        constants={"N": n, "K": k, "BLOCK_M": cfg.block_m, "BLOCK_N": BLOCK_N, "BLOCK_K": cfg.block_k},
        arch=arch, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )


LAUNCHER = r"""
#include "ninfer_cuda.h"
namespace {
// y[M, N] = x[M, K] @ w[N, K]^T (@DTYPE@); M = all leading dims of x, read at run time.
void @FN@(tvm::ffi::TensorView x, tvm::ffi::TensorView w, tvm::ffi::TensorView y) {
  constexpr int64_t kN = @N@, kK = @K@, kBlockN = @BLOCK_N@;
  TVM_FFI_ICHECK(x.ndim() >= 1 && x.shape()[x.ndim() - 1] == kK && w.ndim() == 2 && w.shape()[0] == kN &&
                 w.shape()[1] == kK && y.shape()[y.ndim() - 1] == kN) << "@SYMBOL@: unexpected shapes";
  const int64_t m = x.numel() / kK;
  TVM_FFI_ICHECK(m == y.numel() / kN && m < (int64_t{1} << 31)) << "@SYMBOL@: bad token count";
  if (m == 0) return;
  uint64_t xp = ninfer_cuda::pointer(x, "x"), wp = ninfer_cuda::pointer(w, "w"), yp = ninfer_cuda::pointer(y, "y");
  int32_t m32 = static_cast<int32_t>(m);
  constexpr int64_t kNarrowBM = @NARROW_BM@, kWideBM = @WIDE_BM@;
  const unsigned grid_n = static_cast<unsigned>((kN + kBlockN - 1) / kBlockN);
  int64_t grid_m = (m + kWideBM - 1) / kWideBM;
  const char* name = "@WIDE@";
  if (grid_m * grid_n < @WIDE_MIN@) {  // short chunks: narrower token tiles, more programs
    grid_m = (m + kNarrowBM - 1) / kNarrowBM;
    name = "@NARROW@";
  }
  ninfer_cuda::launch(name, static_cast<unsigned>(grid_m), grid_n, 1, {&xp, &wp, &yp, &m32},
                      x.device().device_id);
}
}  // namespace
TVM_FFI_DLL_EXPORT_TYPED_FUNC(@SYMBOL@, @FN@);
"""


def launcher_source(symbol: str, dtype: str, n: int, k: int, narrow: KernelImage, wide: KernelImage,
                    cfgs: tuple[Config, Config]) -> str:
    """C++ of the extern `symbol` for one weight shape."""
    return fill_launcher(LAUNCHER, {
        "DTYPE": dtype, "FN": f"{symbol}_launch", "SYMBOL": symbol, "N": n, "K": k, "BLOCK_N": BLOCK_N,
        "NARROW_BM": cfgs[0].block_m, "WIDE_BM": cfgs[1].block_m, "WIDE_MIN": WIDE_MIN_PROGRAMS,
        "NARROW": narrow.name, "WIDE": wide.name,
    })


def supported(x: nn.Tensor, weight: nn.Tensor) -> bool:
    """A CUDA target, same 16-bit float dtype for both, a static `[N, K]` weight with K a
    multiple of 8 (16-byte rows) that `x`'s last axis matches."""
    target = tvm.target.Target.current(allow_none=True)
    if target is None or target.kind.name != "cuda":
        return False
    if str(x.dtype) not in TYPES or str(weight.dtype) != str(x.dtype) or len(weight.shape) != 2:
        return False
    n, k = weight.shape
    if not (isinstance(n, int) and isinstance(k, int)) or k % 8 != 0:
        return False
    return isinstance(x.shape[-1], int) and x.shape[-1] == k


def dense_nt(x: nn.Tensor, weight: nn.Tensor) -> nn.Tensor:
    """`y[..., n] = sum_k x[..., k] * weight[n, k]` through the Triton GEMM."""
    arch = current_arch()
    dtype = str(x.dtype)
    n, k = (int(d) for d in weight.shape)
    cfgs = configs(arch)
    narrow, wide = (image(dtype, arch, n, k, c) for c in cfgs)
    symbol = f"ninfer_dense_nt_{TYPES[dtype]}_{n}x{k}"
    mod = extern(
        symbol.removeprefix("ninfer_"),
        {symbol: lambda x, w: nn.Tensor.placeholder([*x.shape[:-1], w.shape[0]], x.dtype)},
        launcher_source(symbol, dtype, n, k, narrow, wide, cfgs),
        [narrow, wide],
    )
    return mod[symbol](x, weight)
