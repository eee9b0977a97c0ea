"""The GDN short convolution for one decode token per sequence: a PDL-chained Triton kernel.

Why: at decode the convolution is `C` channels x `K` taps per sequence, a few KB of work. The
thread-bound TIR kernel (ops/conv1d_gpu.py) takes ~6 us per layer on the H200 for it (each thread
walks a 64-token tile of which one token exists), and a kernel launched by TVM cannot overlap its
neighbours: the decode GEMV before it and the GDN step after it are chained by Programmatic
Dependent Launch, which a plain launch breaks. Here one program covers `BLOCK` channels of one
sequence and is launched with PDL (it waits for the previous kernel before touching memory).

Semantics and rounding are those of ops/conv1d.py for T = 1 (fp32 products summed in tap order):
    y = silu(sum_j w[j] * (history[j] for j < K - 1, x for j = K - 1))
    history <- (history[1:], x)      (history read as zeros when seq_lens[b] == 0)
"""

from __future__ import annotations

import triton
import triton.language as tl
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import op

from .common import dtype_tag, tuned_cuda_kernels
from .cuda_extern import current_arch, extern, fill_launcher, inplace_call
from .pdl import pdl_enter, pdl_mode
from .triton_aot import KernelImage, compile_kernel

SYMBOL = "ninfer_conv1d_decode"
BLOCK = 256  # channels per program: 40 programs per sequence for the 27B's 10,240 channels
MAX_TAPS = 8


@triton.jit
def conv1d_decode_kernel(x, w, state, slots, lens, y, layer, num_slots,
                         C: tl.constexpr, K: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """Program (cb, b): channels cb * BLOCK .. of sequence b; its history rows are its own.

    The history and the taps are read before the wait (no kernel of the step writes them: the
    history was last written by this kernel in the previous step), so under PDL those loads
    overlap the previous kernel; `x` is read and everything is written after it."""
    cb = tl.program_id(0)
    b = tl.program_id(1)
    c = cb * BLOCK + tl.arange(0, BLOCK)
    ok = c < C
    keep = ok & (c * 0 + tl.load(lens + b) > 0)  # history rows to read (zeros for a fresh sequence)
    slot = tl.load(slots + b).to(tl.int64)
    hist = state + ((layer.to(tl.int64) * num_slots + slot) * (K - 1)) * C + c
    acc = tl.zeros([BLOCK], tl.float32)
    for j in tl.static_range(K - 1):
        acc += tl.load(w + j * C + c, mask=ok, other=0.0).to(tl.float32) * \
            tl.load(hist + j * C, mask=keep, other=0.0).to(tl.float32)
    w_last = tl.load(w + (K - 1) * C + c, mask=ok, other=0.0).to(tl.float32)
    if PDL:  # launched with PDL (ninfer_cuda::launch): wait for the previous kernel, let the next one start
        pdl_enter(PDL)
    xv = tl.load(x + b.to(tl.int64) * C + c, mask=ok, other=0.0)
    acc += w_last * xv.to(tl.float32)
    for j in tl.static_range(1, K - 1):  # shift the history by one row (rows read above)
        tl.store(hist + (j - 1) * C, tl.load(hist + j * C, mask=keep, other=0.0), mask=ok)
    tl.store(hist + (K - 2) * C, xv, mask=ok)
    out = acc * (1.0 / (1.0 + tl.exp(-acc)))
    tl.store(y + b.to(tl.int64) * C + c, out.to(y.dtype.element_ty), mask=ok)


def image(channels: int, taps: int, w_dtype: str, arch: str) -> KernelImage:
    """The kernel for one channel count, tap count and weight dtype (bf16 activations and history)."""
    wt = {"bfloat16": "bf16", "float32": "fp32", "float16": "fp16"}
    return compile_kernel(
        conv1d_decode_kernel,
        signature={"x": "*bf16", "w": f"*{wt[w_dtype]}", "state": "*bf16", "slots": "*i32", "lens": "*i32",
                   "y": "*bf16", "layer": "i32", "num_slots": "i32"},
        constants={"C": channels, "K": taps, "BLOCK": BLOCK, "PDL": pdl_mode()},
        arch=arch, num_warps=2, num_stages=1,
    )


LAUNCHER = r"""
#include "ninfer_cuda.h"
namespace {
using tvm::ffi::TensorView;
// In place: `state` and `y` are both written; the function returns them (call_inplace_packed).
tvm::ffi::Tuple<tvm::ffi::Tensor, tvm::ffi::Tensor> conv1d_decode(
    TensorView x, TensorView w, TensorView slots, TensorView lens, int64_t layer, tvm::ffi::Tensor y,
    tvm::ffi::Tensor state) {
  const int64_t batch = x.shape()[0];
  TVM_FFI_ICHECK(x.ndim() == 3 && x.shape()[1] == 1 && x.shape()[2] == @C@ && y.numel() == batch * @C@)
      << "ninfer_conv1d_decode: x / y shapes";
  TVM_FFI_ICHECK(state.ndim() == 4 && state.shape()[2] == @K@ - 1 && state.shape()[3] == @C@ &&
                 w.ndim() == 2 && w.shape()[0] == @K@ && w.shape()[1] == @C@)
      << "ninfer_conv1d_decode: state / weight shapes";
  TVM_FFI_ICHECK(slots.numel() == batch && lens.numel() == batch) << "ninfer_conv1d_decode: slots / lens";
  TVM_FFI_ICHECK(layer >= 0 && layer < state.shape()[0]) << "ninfer_conv1d_decode: layer out of range";
  uint64_t p[6] = {ninfer_cuda::pointer(x, "x"), ninfer_cuda::pointer(w, "w"), ninfer_cuda::pointer(state, "state"),
                   reinterpret_cast<uint64_t>(ninfer_cuda::address(slots)),
                   reinterpret_cast<uint64_t>(ninfer_cuda::address(lens)), ninfer_cuda::pointer(y, "y")};
  int32_t layer32 = static_cast<int32_t>(layer), num_slots = static_cast<int32_t>(state.shape()[1]);
  ninfer_cuda::launch(@KERNEL@, (@C@ + @BLOCK@ - 1) / @BLOCK@, static_cast<unsigned>(batch), 1,
                      {&p[0], &p[1], &p[2], &p[3], &p[4], &p[5], &layer32, &num_slots}, x.device().device_id,
                      /*pdl=*/true);
  return tvm::ffi::Tuple<tvm::ffi::Tensor, tvm::ffi::Tensor>(y, state);
}
}  // namespace
TVM_FFI_DLL_EXPORT_TYPED_FUNC(@SYMBOL@, conv1d_decode);
"""


def supported(x: nn.Tensor, weight: nn.Tensor, conv_state: nn.Tensor) -> bool:
    """Tuned CUDA kernels on, one token per sequence (static), bf16 activations and history."""
    if not tuned_cuda_kernels():
        return False
    t, channels, taps = x.shape[1], x.shape[-1], weight.shape[0]
    return (len(x.shape) == 3 and isinstance(t, int) and t == 1 and isinstance(channels, int)
            and isinstance(taps, int) and 2 <= taps <= MAX_TAPS and str(x.dtype) == "bfloat16"
            and str(conv_state.dtype) == "bfloat16" and str(weight.dtype) in ("bfloat16", "float32", "float16"))


def conv1d_decode(x: nn.Tensor, weight: nn.Tensor, conv_state: nn.Tensor, slot_ids: nn.Tensor,
                  seq_lens: nn.Tensor, layer: int) -> tuple[nn.Tensor, nn.Tensor]:
    """`(silu(conv(x)) [B, 1, C], conv_state)` with `conv_state[layer]` updated in place."""
    channels, taps = int(x.shape[-1]), int(weight.shape[0])
    img = image(channels, taps, str(weight.dtype), current_arch())
    symbol = f"{SYMBOL}_c{channels}_k{taps}_{dtype_tag(str(weight.dtype))}"
    launcher = fill_launcher(LAUNCHER, {"C": channels, "K": taps, "BLOCK": BLOCK, "KERNEL": f'"{img.name}"',
                                        "SYMBOL": symbol})
    extern(symbol, {symbol: lambda *args: args[-1]}, launcher, [img])
    y = op.empty([x.shape[0], 1, channels], "bfloat16", name="conv1d_decode_out")
    result = inplace_call(symbol, [x, weight, slot_ids, seq_lens, layer], [y, conv_state])
    return result[0], result[1]
