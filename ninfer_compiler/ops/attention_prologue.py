"""The query/key side of gated attention in one kernel on CUDA targets: q/k RMS norms, MRoPE, and
the K/V append into the paged pool.

Why: between the projections and the attention kernel, each attention layer ran five small kernels
(two offset RMS norms over the head dim, two MRoPE rotations, the KV append), each launching,
reading and writing the heads once more. At decode that is 80 launches per step for a few KB each;
in prefill, four extra passes over `[T, heads, 256]` activations. Here one program per (token,
head) reads the projected row once, normalises it, rotates its first `rotary_dim` features and
writes either the query (`q_out`) or the key and value rows into their page of the pool.

Semantics and roundings are those of the unfused ops (`norm.rms_norm` with `offset=True`, then
`rope.apply_mrope`, then `paged_attention.kv_append`): the normalised value is rounded to the
activation dtype before the rotation, which is computed in fp32 and rounded once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import triton
import triton.language as tl

from .pdl import pdl_enter, pdl_mode

if TYPE_CHECKING:
    from tvm.relax.frontend import nn

    from .triton_aot import KernelImage

SYMBOL = "ninfer_attention_prologue"
ARCHS = ("sm_90a", "sm_120a", "sm_121a")


@triton.jit
def prologue_kernel(q_raw, k_raw, v_raw, q_w, k_w, pos, inv_freq, pool, pages, lens, q_out,
                    layer, n_tok, batch, max_pages, num_pages, eps,
                    HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, PS: tl.constexpr,
                    R: tl.constexpr, S_H: tl.constexpr, S_W: tl.constexpr, PDL: tl.constexpr = False):
    """Program (i, h): token i of the `[B, T]` block; head h < HQ is a query head, else a KV head."""
    if PDL:  # launched with PDL (ninfer_cuda::launch): wait for the previous kernel, let the next one start
        pdl_enter(PDL)
    i = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    b = i // n_tok
    t = i % n_tok
    HALF: tl.constexpr = R // 2
    d = tl.arange(0, D)
    rot = d < R
    partner = tl.where(d < HALF, d + HALF, tl.where(rot, d - HALF, d))
    is_q = h < HQ
    kh = h - HQ
    # every load first, so their latencies overlap (the norm's reduction is a block-wide barrier,
    # which no later load would be issued across); a query head's V row is masked off
    j = d % HALF
    p_t = tl.load(pos + b * n_tok + t)
    p_h = tl.load(pos + (batch + b) * n_tok + t)
    p_w = tl.load(pos + (2 * batch + b) * n_tok + t)
    freq = tl.load(inv_freq + j, mask=rot, other=0.0)
    kv_h = tl.maximum(kh, 0)
    v = tl.load(v_raw + (i * HKV + kv_h) * D + d, mask=d < tl.where(is_q, 0, D), other=0.0)
    position = tl.load(lens + b).to(tl.int64) + t
    page = tl.load(pages + b * max_pages + position // PS).to(tl.int64)
    slot = ((layer.to(tl.int64) * num_pages + page) * 2 * HKV + kv_h) * PS + position % PS
    if is_q:
        src = q_raw + (i * HQ + h) * D
        x = tl.load(src + d).to(tl.float32)
        xp = tl.load(src + partner).to(tl.float32)
        w = tl.load(q_w + d).to(tl.float32)
        wp = tl.load(q_w + partner).to(tl.float32)
    else:
        src = k_raw + (i * HKV + kh) * D
        x = tl.load(src + d).to(tl.float32)
        xp = tl.load(src + partner).to(tl.float32)
        w = tl.load(k_w + d).to(tl.float32)
        wp = tl.load(k_w + partner).to(tl.float32)
    inv = tl.math.rsqrt(tl.sum(x * x, 0) / D + eps)
    n = (x * inv * (w + 1.0)).to(tl.bfloat16).to(tl.float32)
    n_p = (xp * inv * (wp + 1.0)).to(tl.bfloat16).to(tl.float32)
    # frequency pair j of the rotary features follows position row T, H or W (spec 1.2)
    use_h = ((j % 3) == 1) & (j < 3 * S_H)
    use_w = ((j % 3) == 2) & (j < 3 * S_W)
    row = tl.where(use_h, 1, tl.where(use_w, 2, 0))
    p = tl.where(row == 1, p_h, tl.where(row == 2, p_w, p_t)).to(tl.float32)
    angle = p * freq
    sign = tl.where(d < HALF, -1.0, 1.0)
    y = tl.where(rot, n * tl.cos(angle) + sign * n_p * tl.sin(angle), n).to(tl.bfloat16)
    if is_q:
        tl.store(q_out + (i * HQ + h) * D + d, y)
    else:
        tl.store(pool + slot * D + d, y)
        tl.store(pool + (slot + HKV * PS) * D + d, v)


def image(hq: int, hkv: int, d: int, page_size: int, rotary_dim: int, sections: tuple[int, int, int],
          q_w_dtype: str, k_w_dtype: str, arch: str) -> KernelImage:
    """The kernel for one attention geometry and norm-weight dtypes."""
    from .triton_aot import compile_kernel

    wt = {"bfloat16": "bf16", "float32": "fp32", "float16": "fp16"}
    return compile_kernel(
        prologue_kernel,
        signature={"q_raw": "*bf16", "k_raw": "*bf16", "v_raw": "*bf16", "q_w": f"*{wt[q_w_dtype]}",
                   "k_w": f"*{wt[k_w_dtype]}", "pos": "*i32", "inv_freq": "*fp32", "pool": "*bf16",
                   "pages": "*i32", "lens": "*i32", "q_out": "*bf16", "layer": "i32", "n_tok": "i32",
                   "batch": "i32", "max_pages": "i32", "num_pages": "i32", "eps": "fp32"},
        constants={"HQ": hq, "HKV": hkv, "D": d, "PS": page_size, "R": rotary_dim, "S_H": sections[1],
                   "S_W": sections[2], "PDL": pdl_mode()},
        arch=arch, num_warps=2 if d <= 128 else 4, num_stages=1,
    )


LAUNCHER = r"""
#include "ninfer_cuda.h"
namespace {
using tvm::ffi::TensorView;
// q_out and the pool are written; the pool in place, so (call_inplace_packed) both are returned.
tvm::ffi::Tuple<tvm::ffi::Tensor, tvm::ffi::Tensor> prologue(
    TensorView q, TensorView k, TensorView v, TensorView q_w, TensorView k_w, TensorView pos,
    TensorView inv_freq, TensorView pages, TensorView lens, int64_t layer, double eps,
    tvm::ffi::Tensor q_out, tvm::ffi::Tensor pool) {
  TVM_FFI_ICHECK(q.ndim() == 3 && k.ndim() == 3 && v.ndim() == 3 && pos.ndim() == 3 && pages.ndim() == 2)
      << "@SYMBOL@: unexpected ranks";
  const int64_t batch = q.shape()[0], n_tok = q.shape()[1];
  TVM_FFI_ICHECK(q.shape()[2] == @HQ@ * @D@ && k.shape()[2] == @HKV@ * @D@ && v.shape()[2] == @HKV@ * @D@ &&
                 pos.shape()[0] == 3 && pos.shape()[1] == batch && pos.shape()[2] == n_tok &&
                 q_out.numel() == q.numel() && k.numel() == batch * n_tok * @HKV@ * @D@)
      << "@SYMBOL@: unexpected shapes";
  TVM_FFI_ICHECK(pool.ndim() == 6 && pool.shape()[2] == 2 && pool.shape()[3] == @HKV@ && pool.shape()[4] == @PS@ &&
                 pool.shape()[5] == @D@) << "@SYMBOL@: unexpected pool shape";
  uint64_t p[11] = {ninfer_cuda::pointer(q, "q"), ninfer_cuda::pointer(k, "k"), ninfer_cuda::pointer(v, "v"),
                    reinterpret_cast<uint64_t>(ninfer_cuda::address(q_w)),
                    reinterpret_cast<uint64_t>(ninfer_cuda::address(k_w)),
                    reinterpret_cast<uint64_t>(ninfer_cuda::address(pos)),
                    reinterpret_cast<uint64_t>(ninfer_cuda::address(inv_freq)), ninfer_cuda::pointer(pool, "pool"),
                    reinterpret_cast<uint64_t>(ninfer_cuda::address(pages)),
                    reinterpret_cast<uint64_t>(ninfer_cuda::address(lens)), ninfer_cuda::pointer(q_out, "q_out")};
  int32_t layer32 = static_cast<int32_t>(layer), n32 = static_cast<int32_t>(n_tok);
  int32_t b32 = static_cast<int32_t>(batch), max_pages = static_cast<int32_t>(pages.shape()[1]);
  int32_t num_pages = static_cast<int32_t>(pool.shape()[1]);
  float eps32 = static_cast<float>(eps);
  ninfer_cuda::launch(@KERNEL@, static_cast<unsigned>(batch * n_tok), @HQ@ + @HKV@, 1,
                      {&p[0], &p[1], &p[2], &p[3], &p[4], &p[5], &p[6], &p[7], &p[8], &p[9], &p[10],
                       &layer32, &n32, &b32, &max_pages, &num_pages, &eps32},
                      q.device().device_id, /*pdl=*/true);
  return tvm::ffi::Tuple<tvm::ffi::Tensor, tvm::ffi::Tensor>(q_out, pool);
}
}  // namespace
TVM_FFI_DLL_EXPORT_TYPED_FUNC(@SYMBOL@, prologue);
"""


def supported(q: nn.Tensor, kv_pool: nn.Tensor, head_dim: int, rotary_dim: int) -> bool:
    """Tuned CUDA kernels on, bf16 activations and pool, power-of-two head dim, even rotary width."""
    from .common import tuned_cuda_kernels

    if not tuned_cuda_kernels():
        return False
    import tvm

    if str(tvm.target.Target.current().arch) not in ARCHS:
        return False
    pow2 = head_dim & (head_dim - 1) == 0
    return (str(q.dtype) == "bfloat16" and str(kv_pool.dtype) == "bfloat16" and pow2 and 16 <= head_dim <= 512
            and rotary_dim % 2 == 0 and 0 < rotary_dim <= head_dim)


def attention_prologue(
    q: nn.Tensor, k: nn.Tensor, v: nn.Tensor, q_norm_w: nn.Tensor, k_norm_w: nn.Tensor, positions: nn.Tensor,
    kv_pool: nn.Tensor, page_table: nn.Tensor, seq_lens: nn.Tensor, layer: int, eps: float, *,
    num_heads: int, num_kv_heads: int, head_dim: int, page_size: int, rotary_dim: int, theta: float,
    sections: tuple[int, int, int],
) -> tuple[nn.Tensor, nn.Tensor]:
    """`(q [B, T, Hq, D] normed and rotated, kv_pool with this block's K/V appended)` from the
    projections `q [B, T, Hq*D]`, `k`, `v [B, T, Hkv*D]`."""
    from tvm.relax.frontend import nn
    from tvm.relax.frontend.nn import op

    from .cuda_extern import current_arch, extern, fill_launcher, inplace_call
    from .rope import rope_inv_freq

    if sum(sections) != rotary_dim // 2:
        raise ValueError(f"mrope_section {list(sections)} must sum to rotary_dim/2 = {rotary_dim // 2}")
    arch = current_arch()
    img = image(num_heads, num_kv_heads, head_dim, page_size, rotary_dim, sections, str(q_norm_w.dtype),
                str(k_norm_w.dtype), arch)
    tag = (f"q{num_heads}_kv{num_kv_heads}_d{head_dim}_p{page_size}_r{rotary_dim}_"
           f"s{'x'.join(map(str, sections))}_{q_norm_w.dtype}_{k_norm_w.dtype}")
    symbol = f"{SYMBOL}_{tag}"
    launcher = fill_launcher(LAUNCHER, {"HQ": num_heads, "HKV": num_kv_heads, "D": head_dim, "PS": page_size,
                                        "KERNEL": f'"{img.name}"', "SYMBOL": symbol})
    extern(f"attention_prologue_{arch}_{tag}", {symbol: lambda *args: args[-1]}, launcher, [img])
    inv = nn.Tensor.from_const(np.ascontiguousarray(rope_inv_freq(rotary_dim, theta)))
    b, t = q.shape[0], q.shape[1]
    q_out = op.empty([b, t, num_heads, head_dim], "bfloat16", name="attention_q")
    result = inplace_call(symbol, [q, k, v, q_norm_w, k_norm_w, positions, inv, page_table, seq_lens, int(layer),
                                   float(eps)], [q_out, kv_pool])
    return result[0], result[1]
