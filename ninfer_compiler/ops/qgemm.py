"""Prefill projections over grouped-int planes on tensor cores (`qgemm_triton.py`) as an extern.

Why: dlight's SIMT `Matmul` runs the quantized prefill projections at ~20 TFLOP/s, 2.3% of the
H200's bf16 rate (docs/kernel-notes.md, "Prefill"). Each projection shape `(N, K, bits)` gets its
own extern: one or two Triton images compiled ahead of time for the target's arch (`triton_aot`)
and a small C++ launcher (`cuda_extern`) that picks the image from the token count at run time
(the wide-M tile where it fills the GPU, the narrow one for short chunks) and launches it on
TVM's stream, with no host synchronisation.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import tvm
from tvm.relax.frontend import nn

from .row_split import grouped_format

ARCHS = ("sm_90a", "sm_120a", "sm_121a")
GROUP_M = 8
MIN_TOKENS = 9  # fewer tokens than this is decode-shaped (`ops/qgemv.py`)
WIDE_MIN_TILES = 128  # wide tiles needed to prefer them (H200: 132 SMs, one tile per SM)
SIGNATURE = {"x_ptr": "*bf16", "base_ptr": "*u8", "high_ptr": "*u8", "scales_ptr": "*fp16",
             "y_ptr": "*bf16", "M": "i32"}


@dataclass(frozen=True)
class Config:
    """One compiled tile shape (TRANS form: W tile on the left of the dot, from registers)."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


def configs(arch: str, bits: int) -> tuple[Config, Config | None]:
    """`(narrow, wide)` tile configs for `arch`; wide is None where one config serves all M.

    Measured on the H200 (docs/kernels/prefill-gemm.md): 256 tokens x 128 rows is best once the
    grid fills the GPU (3 stages for q4/q8, 4 for q5/q6), 128 x 128 with 4 stages below that.
    sm_120/121 have ~100 KB of shared memory per block, so they get 128 x 128 with 3 stages only
    (not measured on those GPUs).
    """
    if arch == "sm_90a":
        return Config(128, 128, 8, 4), Config(256, 128, 8, 3 if bits in (4, 8) else 4)
    return Config(128, 128, 8, 3), None


def _triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def supported(x: nn.Tensor, rows: int, in_features: int) -> bool:
    """A prefill-shaped call on a CUDA target this kernel is built for.

    bf16 activations `[b, s, K]` with `s` symbolic or more than 8 tokens, `K` the logical
    input width and a multiple of 128 (so the planes carry no padding), any `N`.
    """
    target = tvm.target.Target.current(allow_none=True)
    if target is None or target.kind.name != "cuda" or str(target.arch) not in ARCHS:
        return False
    shape = x.shape
    if str(x.dtype) != "bfloat16" or len(shape) != 3 or rows < 1:
        return False
    if not isinstance(shape[2], int) or shape[2] != in_features or in_features % 128 != 0:
        return False
    tokens = shape[1]
    if isinstance(tokens, int) and tokens < MIN_TOKENS:
        return False
    return _triton_available()


def kernel_name(bits: int, n: int, k: int, cfg: Config) -> str:
    """The entry symbol `qgemm_triton.kernel_name` gives this specialization."""
    return f"ninfer_qgemm_q{bits}_n{n}_k{k}_t{cfg.block_m}x{cfg.block_n}g{GROUP_M}"


def image(arch: str, bits: int, n: int, k: int, cfg: Config):
    """The AOT image of one config (cached on disk by `triton_aot`)."""
    from .qgemm_triton import qgemm_kernel
    from .triton_aot import compile_kernel

    constants = dict(N=n, K=k, BITS=bits, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, GROUP_M=GROUP_M,
                     TRANS=True)
    img = compile_kernel(qgemm_kernel, signature=SIGNATURE, constants=constants, arch=arch,
                         num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    expected = kernel_name(bits, n, k, cfg)
    if img.name != expected:
        raise RuntimeError(f"qgemm image is named {img.name!r}, expected {expected!r} (stale kernel cache?)")
    return img


LAUNCHER = r"""
#include "ninfer_cuda.h"
namespace {
// y[M, N] = x[M, K] @ W^T over grouped-int planes; M = all leading dims of x, read at run time.
void @FN@(tvm::ffi::TensorView x, tvm::ffi::TensorView base, tvm::ffi::TensorView high,
          tvm::ffi::TensorView scales, tvm::ffi::TensorView y) {
  constexpr int64_t kN = @N@, kK = @K@, kBlockN = @BLOCK_N@;
  TVM_FFI_ICHECK(x.ndim() >= 1 && x.shape()[x.ndim() - 1] == kK && y.shape()[y.ndim() - 1] == kN &&
                 base.ndim() == 2 && base.shape()[0] == kN)
      << "@SYMBOL@: unexpected shapes";
  TVM_FFI_ICHECK(x.dtype().code == kDLBfloat && x.dtype().bits == 16 && y.dtype().code == kDLBfloat &&
                 y.dtype().bits == 16) << "@SYMBOL@: x and y must be bf16";
  const int64_t m = x.numel() / kK;
  TVM_FFI_ICHECK(m == y.numel() / kN && m < (int64_t{1} << 31)) << "@SYMBOL@: bad token count";
  if (m == 0) return;
  uint64_t xp = ninfer_cuda::pointer(x, "x"), bp = ninfer_cuda::pointer(base, "base");
  uint64_t hp = ninfer_cuda::pointer(high, "high"), sp = ninfer_cuda::pointer(scales, "scales");
  uint64_t yp = ninfer_cuda::pointer(y, "y");
  int32_t m32 = static_cast<int32_t>(m);
  constexpr int64_t kNarrowBM = @NARROW_BM@, kWideBM = @WIDE_BM@;  // kWideBM == 0: one image
  const int64_t n_tiles = (kN + kBlockN - 1) / kBlockN;
  int64_t grid = (m + kNarrowBM - 1) / kNarrowBM * n_tiles;
  const char* name = "@NARROW@";
  if constexpr (kWideBM > 0) {
    // the wide-M tile once its grid fills the GPU; short chunks keep more, narrower tiles
    const int64_t wide_tiles = (m + kWideBM - 1) / kWideBM * n_tiles;
    if (wide_tiles >= @WIDE_MIN_TILES@) {
      grid = wide_tiles;
      name = "@WIDE@";
    }
  }
  ninfer_cuda::launch(name, static_cast<unsigned>(grid), 1, 1, {&xp, &bp, &hp, &sp, &yp, &m32},
                      x.device().device_id);
}
}  // namespace
TVM_FFI_DLL_EXPORT_TYPED_FUNC(@SYMBOL@, @FN@);
"""


def launcher_source(symbol: str, bits: int, n: int, k: int, narrow: Config, wide: Config | None) -> str:
    """C++ of the extern `symbol` for one projection shape."""
    if wide is not None and wide.block_n != narrow.block_n:
        raise ValueError("the two tile configs must share BLOCK_N")
    subs = {
        "@FN@": f"{symbol}_launch", "@SYMBOL@": symbol, "@N@": str(n), "@K@": str(k),
        "@BLOCK_N@": str(narrow.block_n), "@NARROW_BM@": str(narrow.block_m),
        "@NARROW@": kernel_name(bits, n, k, narrow), "@WIDE_MIN_TILES@": str(WIDE_MIN_TILES),
        "@WIDE_BM@": str(wide.block_m if wide else 0),
        "@WIDE@": kernel_name(bits, n, k, wide) if wide else kernel_name(bits, n, k, narrow),
    }
    from .cuda_extern import fill_launcher

    return fill_launcher(LAUNCHER, subs)


def qgemm(x: nn.Tensor, base: nn.Tensor, high: nn.Tensor | None, scales: nn.Tensor, fmt: str) -> nn.Tensor:
    """`y[b, s, n] = sum_k x[b, s, k] * W[n, k]` on tensor cores (fp32 accumulation, bf16 out).

    The weight is dequantized per 64-lane tile with its group scale folded in (one bf16 rounding
    of `scale * code`), see `qgemm_triton.py`.
    """
    from .cuda_extern import current_arch, extern

    bits = grouped_format(fmt).bits
    n, k = int(base.shape[0]), int(x.shape[-1])
    arch = current_arch()
    narrow, wide = configs(arch, bits)
    images = [image(arch, bits, n, k, narrow)] + ([image(arch, bits, n, k, wide)] if wide else [])
    symbol = f"ninfer_qgemm_q{bits}_{n}x{k}"

    def infer(x: nn.Tensor, base: nn.Tensor, high: nn.Tensor, scales: nn.Tensor) -> nn.Tensor:
        return nn.Tensor.placeholder([*x.shape[:-1], base.shape[0]], x.dtype)

    module = extern(f"qgemm_q{bits}_{n}x{k}", {symbol: infer},
                    launcher_source(symbol, bits, n, k, narrow, wide), images)
    return module[symbol](x, base, base if high is None else high, scales)
