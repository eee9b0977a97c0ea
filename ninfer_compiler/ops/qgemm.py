"""Prefill projections over grouped-int planes on tensor cores (`qgemm_triton.py`) as an extern.

Why: dlight's SIMT `Matmul` runs the quantized prefill projections at ~20 TFLOP/s, 2.3% of the
H200's bf16 rate (docs/kernel-notes.md, "Prefill"). Each projection shape `(N, K, bits)` gets its
own extern: one or two Triton images compiled ahead of time for the target's arch (`triton_aot`)
and a small C++ launcher (`cuda_extern`) that picks the image from the token count at run time
(the wide-M tile where it fills the GPU, the narrow one for short chunks) and launches it on
TVM's stream, with no host synchronisation.

The fused forms for `ops/fused_linear.py`: `qgemm_swiglu` (gate and up in one launch, SiLU*up
from the two fp32 sums) and `qgemm_add` (the residual added before the output's one rounding);
`fused_supported` says when they apply.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass

import tvm
from tvm.relax.frontend import nn

from .linear_weight import LinearWeight
from .row_split import grouped_format

ARCHS = ("sm_90a", "sm_120a", "sm_121a")
GROUP_M = 8
MIN_TOKENS = 9  # fewer tokens than this is decode-shaped (`ops/qgemv.py`)
WIDE_MIN_TILES = 128  # wide tiles needed to prefer them (H200: 132 SMs, one tile per SM)
SIGNATURE = {"x_ptr": "*bf16", "base_ptr": "*u8", "high_ptr": "*u8", "scales_ptr": "*fp16",
             "base2_ptr": "*u8", "high2_ptr": "*u8", "scales2_ptr": "*fp16", "res_ptr": "*bf16",
             "y_ptr": "*bf16", "M": "i32"}
PLAIN, ADD, SWIGLU = 0, 1, 2  # `qgemm_triton` epilogues


@dataclass(frozen=True)
class Config:
    """One compiled tile shape (W tile on the left of the dot, from registers)."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


def configs(arch: str, bits: int, epilogue: int = PLAIN) -> tuple[Config, Config | None]:
    """`(narrow, wide)` tile configs for `arch`; wide is None where one config serves all M.

    Measured on the H200 (docs/kernels/prefill-gemm.md, v2): 256 tokens x 128 rows with 4 stages
    is the fastest config at 7,680 tokens for every format and shape, and within 4% of the
    fastest wherever its grid fills the GPU (the launcher's rule); 3 stages for SwiGLU, which
    streams two weights. 128 x 128 with 4 stages below that. sm_120/121 have ~100 KB of shared
    memory per block, so they get 128 x 128 with 3 stages only (not measured on those GPUs).
    `bits` is part of the key for formats that may need their own tiles; none does today.
    """
    del bits
    if arch == "sm_90a":
        return Config(128, 128, 8, 4), Config(256, 128, 8, 3 if epilogue == SWIGLU else 4)
    return Config(128, 128, 8, 3), None


def _triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def _cuda_arch_ok() -> bool:
    target = tvm.target.Target.current(allow_none=True)
    return target is not None and target.kind.name == "cuda" and str(target.arch) in ARCHS


def supported(x: nn.Tensor, rows: int, in_features: int) -> bool:
    """A prefill-shaped call on a CUDA target this kernel is built for.

    bf16 activations `[b, s, K]` with `s` symbolic or more than 8 tokens, `K` the logical
    input width and a multiple of 128 (so the planes carry no padding), any `N`.
    """
    if not _cuda_arch_ok():
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


def kernel_name(bits: int, n: int, k: int, cfg: Config, epilogue: int = PLAIN) -> str:
    """The entry symbol `qgemm_triton.kernel_name` gives this specialization."""
    from .qgemm_triton import EPILOGUES

    return f"ninfer_qgemm_q{bits}_n{n}_k{k}_t{cfg.block_m}x{cfg.block_n}g{GROUP_M}{EPILOGUES[epilogue]}"


def image(arch: str, bits: int, n: int, k: int, cfg: Config, epilogue: int = PLAIN):
    """The AOT image of one config (cached on disk by `triton_aot`)."""
    from .qgemm_triton import qgemm_kernel
    from .triton_aot import compile_kernel

    constants = dict(N=n, K=k, BITS=bits, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, GROUP_M=GROUP_M,
                     EPILOGUE=epilogue, ASM=True)
    img = compile_kernel(qgemm_kernel, signature=SIGNATURE, constants=constants, arch=arch,
                         num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    expected = kernel_name(bits, n, k, cfg, epilogue)
    if img.name != expected:
        raise RuntimeError(f"qgemm image is named {img.name!r}, expected {expected!r} (stale kernel cache?)")
    return img


LAUNCHER = r"""
#include "ninfer_cuda.h"
namespace {
// @DOC@; M = all leading dims of x, read at run time.
void @FN@(@PARAMS@) {
  constexpr int64_t kN = @N@, kK = @K@, kOutN = @OUT_N@;  // kOutN: output features per program
  TVM_FFI_ICHECK(x.ndim() >= 1 && x.shape()[x.ndim() - 1] == kK && y.shape()[y.ndim() - 1] == kN &&
                 base.ndim() == 2 && base.shape()[0] == kN)
      << "@SYMBOL@: unexpected shapes";
  TVM_FFI_ICHECK(x.dtype().code == kDLBfloat && x.dtype().bits == 16 && y.dtype().code == kDLBfloat &&
                 y.dtype().bits == 16) << "@SYMBOL@: x and y must be bf16";
  const int64_t m = x.numel() / kK;
  TVM_FFI_ICHECK(m == y.numel() / kN && m < (int64_t{1} << 31)) << "@SYMBOL@: bad token count";@CHECKS@
  if (m == 0) return;
  uint64_t xp = ninfer_cuda::pointer(x, "x"), bp = ninfer_cuda::pointer(base, "base");
  uint64_t hp = ninfer_cuda::pointer(high, "high"), sp = ninfer_cuda::pointer(scales, "scales");
  uint64_t yp = ninfer_cuda::pointer(y, "y");
  @SECOND@
  int32_t m32 = static_cast<int32_t>(m);
  constexpr int64_t kNarrowBM = @NARROW_BM@, kWideBM = @WIDE_BM@;  // kWideBM == 0: one image
  const int64_t n_tiles = (kN + kOutN - 1) / kOutN;
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
  ninfer_cuda::launch(name, static_cast<unsigned>(grid), 1, 1,
                      {&xp, &bp, &hp, &sp, &b2p, &h2p, &s2p, &rp, &yp, &m32}, x.device().device_id);
}
}  // namespace
TVM_FFI_DLL_EXPORT_TYPED_FUNC(@SYMBOL@, @FN@);
"""

_VIEW = "tvm::ffi::TensorView"
_EPILOGUE_CPP = {  # (doc, parameters after x, extra checks, second-weight and residual pointers)
    PLAIN: ("y[M, N] = x[M, K] @ W^T over grouped-int planes",
            ["base", "high", "scales"], "",
            "uint64_t b2p = bp, h2p = hp, s2p = sp, rp = yp;  // unused by this epilogue"),
    ADD: ("y[M, N] = residual[M, N] + x[M, K] @ W^T over grouped-int planes",
          ["base", "high", "scales", "residual"],
          "\n  TVM_FFI_ICHECK(residual.numel() == y.numel() && residual.dtype().code == kDLBfloat &&\n"
          "                 residual.dtype().bits == 16) << \"@SYMBOL@: residual must be bf16 like y\";",
          "uint64_t b2p = bp, h2p = hp, s2p = sp, rp = ninfer_cuda::pointer(residual, \"residual\");"),
    SWIGLU: ("y[M, N] = silu(x @ Wgate^T) * (x @ Wup^T), both weights [N, K] in grouped-int planes",
             ["base", "high", "scales", "base2", "high2", "scales2"],
             "\n  TVM_FFI_ICHECK(base2.ndim() == 2 && base2.shape()[0] == kN && base2.shape()[1] == base.shape()[1])\n"
             "      << \"@SYMBOL@: gate and up must have one shape\";",
             "uint64_t b2p = ninfer_cuda::pointer(base2, \"base2\"), h2p = ninfer_cuda::pointer(high2, \"high2\");\n"
             "  uint64_t s2p = ninfer_cuda::pointer(scales2, \"scales2\"), rp = yp;  // rp unused"),
}


def launcher_source(symbol: str, bits: int, n: int, k: int, narrow: Config, wide: Config | None,
                    epilogue: int = PLAIN) -> str:
    """C++ of the extern `symbol` for one projection shape and epilogue."""
    if wide is not None and wide.block_n != narrow.block_n:
        raise ValueError("the two tile configs must share BLOCK_N")
    doc, params, checks, second = _EPILOGUE_CPP[epilogue]
    out_n = narrow.block_n // 2 if epilogue == SWIGLU else narrow.block_n
    subs = {
        "@DOC@": doc, "@PARAMS@": ", ".join(f"{_VIEW} {p}" for p in ["x", *params, "y"]),
        "@CHECKS@": checks.replace("@SYMBOL@", symbol), "@SECOND@": second,
        "@FN@": f"{symbol}_launch", "@SYMBOL@": symbol, "@N@": str(n), "@K@": str(k),
        "@OUT_N@": str(out_n), "@NARROW_BM@": str(narrow.block_m),
        "@NARROW@": kernel_name(bits, n, k, narrow, epilogue), "@WIDE_MIN_TILES@": str(WIDE_MIN_TILES),
        "@WIDE_BM@": str(wide.block_m if wide else 0),
        "@WIDE@": kernel_name(bits, n, k, wide if wide else narrow, epilogue),
    }
    from .cuda_extern import fill_launcher

    return fill_launcher(LAUNCHER, subs)


def _extern(bits: int, n: int, k: int, epilogue: int):
    """The extern module of one projection shape and epilogue, and its symbol."""
    from .cuda_extern import current_arch, extern
    from .qgemm_triton import EPILOGUES

    arch = current_arch()
    narrow, wide = configs(arch, bits, epilogue)
    images = [image(arch, bits, n, k, narrow, epilogue)]
    if wide is not None:
        images.append(image(arch, bits, n, k, wide, epilogue))
    symbol = f"ninfer_qgemm_q{bits}_{n}x{k}{EPILOGUES[epilogue]}"

    def infer(x: nn.Tensor, base: nn.Tensor, *rest: nn.Tensor) -> nn.Tensor:
        return nn.Tensor.placeholder([*x.shape[:-1], base.shape[0]], x.dtype)

    module = extern(symbol.removeprefix("ninfer_"), {symbol: infer},
                    launcher_source(symbol, bits, n, k, narrow, wide, epilogue), images)
    return module[symbol]


def qgemm(x: nn.Tensor, base: nn.Tensor, high: nn.Tensor | None, scales: nn.Tensor, fmt: str) -> nn.Tensor:
    """`y[b, s, n] = sum_k x[b, s, k] * W[n, k]` on tensor cores (fp32 accumulation, bf16 out).

    The weight is dequantized per 64-lane tile with its group scale folded in (one bf16 rounding
    of `scale * code`), see `qgemm_triton.py`.
    """
    bits = grouped_format(fmt).bits
    n, k = int(base.shape[0]), int(x.shape[-1])
    return _extern(bits, n, k, PLAIN)(x, base, base if high is None else high, scales)


def fused_supported(x: nn.Tensor, weights: Sequence[LinearWeight]) -> bool:
    """Whether `qgemm_add` (one weight) or `qgemm_swiglu` (two) take `x` and these weights here.

    A prefill-shaped bf16 `x` (see `supported`) on a CUDA target this kernel is built for, and
    grouped-int weights reading all of `x`; SwiGLU's gate and up must share format and shape.
    """
    if len(weights) not in (1, 2) or not all(w.grouped for w in weights):
        return False
    first = weights[0]
    if any((w.fmt, w.rows, w.cols) != (first.fmt, first.rows, first.cols) for w in weights):
        return False
    return supported(x, first.rows, first.cols)


def _planes(w: LinearWeight) -> list[nn.Tensor]:
    return [w.base, w.base if w.high is None else w.high, w.scales]


def qgemm_swiglu(x: nn.Tensor, gate: LinearWeight, up: LinearWeight) -> nn.Tensor:
    """`silu(x @ gate^T) * (x @ up^T)` in one launch: both sums in fp32 in the same thread, one
    bf16 rounding of the product (`x [b, s, K]` bf16, gate and up `[N, K]`, see `fused_supported`)."""
    bits, n, k = gate.bits, gate.rows, gate.cols
    return _extern(bits, n, k, SWIGLU)(x, *_planes(gate), *_planes(up))


def qgemm_add(x: nn.Tensor, weight: LinearWeight, residual: nn.Tensor) -> nn.Tensor:
    """`residual + x @ weight^T` in one launch, the fp32 sum rounded once to bf16 (`residual`
    bf16 of the output's shape `[b, s, N]`)."""
    if str(residual.dtype) != "bfloat16":
        raise ValueError(f"qgemm_add: residual must be bfloat16, not {residual.dtype}")
    bits, n, k = weight.bits, weight.rows, weight.cols
    return _extern(bits, n, k, ADD)(x, *_planes(weight), residual)
