"""Paged causal GQA attention for prefill on CUDA targets: a Triton flash-attention kernel.

Why: the TIR kernel of `paged_attention_gpu` scores one query per block with SIMT fp32 and runs
causal 1,024 x 1,024 at ~1.4 TFLOP/s on the H200; prefill of long prompts is then dominated by
attention. This kernel is FlashAttention-2 shaped: a program owns `BLOCK_M` query rows of one
query head of one sequence, walks the keys in blocks of `BLOCK_N` gathered through the page table,
scores and accumulates with `tl.dot` on tensor cores (bf16 operands, fp32 accumulators) and keeps
an fp32 online softmax (exp2 with the scale folded in). Keys strictly before the block's first
query need no mask; only the diagonal blocks are masked, and nothing past the last query's
position is visited.

Semantics are those of `paged_attention.paged_attention`: query `t` of sequence `b` sits at
position `seq_lens[b] + t` and attends to positions `0..seq_lens[b] + t` of its sequence (this
chunk's K/V were appended to the pool before the call).

The kernel is compiled ahead of time per target arch (`triton_aot`) and launched from a small C++
function linked into the package (`cuda_extern`); the grid comes from the static head count and
the runtime token count `T`, so a launch needs no host synchronisation.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import triton
import triton.language as tl

if TYPE_CHECKING:  # the device check imports this module without TVM
    from tvm.relax.frontend import nn

    from .triton_aot import KernelImage

LOG2E = 1.4426950408889634
SYMBOL = "ninfer_attention_prefill"
ARCHS = ("sm_90a", "sm_120a", "sm_121a")
# Tile shape (BLOCK_M, BLOCK_N, num_warps, num_stages) per head dim. Hopper (wgmma, 227 KiB of
# shared memory per block) and the sm_12x parts (mma.sync, ~99 KiB) differ. On the H200 at head dim
# 256, 128x64 with 8 warps and 2 stages (192 KiB) beat 128x32/8/3, 64x32/4/3 and 64x64/4/2 in every
# case measured (docs/kernels/attention-prefill.md); the other head dims and the sm_12x tiles
# are only sized to fit, not measured.
CONFIGS_SM90: dict[int, tuple[int, int, int, int]] = {
    64: (128, 64, 4, 3),
    128: (128, 64, 8, 3),
    256: (128, 64, 8, 2),
}
CONFIGS_SM12X: dict[int, tuple[int, int, int, int]] = {
    64: (64, 64, 4, 2),
    128: (64, 64, 4, 2),
    256: (64, 32, 4, 2),
}


def config(arch: str, head_dim: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) for `arch` and `head_dim`."""
    return (CONFIGS_SM90 if arch == "sm_90a" else CONFIGS_SM12X)[head_dim]


@triton.jit
def prefill_kernel(
    q_ptr,  # [B, T, HQ, D]
    kv_ptr,  # kv_pool[layer]: [num_pages, 2, HKV, PS, D]
    pages_ptr,  # [B, P] int32
    lens_ptr,  # [B] int32
    o_ptr,  # [B, T, HQ, D]
    T,  # tokens per sequence in this call
    P,  # page-table width
    qk_scale,  # sm_scale * log2(e)
    HQ: tl.constexpr,
    HKV: tl.constexpr,
    D: tl.constexpr,
    PS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    F32_DOT: tl.constexpr = False,
):
    """One program: `BLOCK_M` queries of head `program_id(0)` of sequence `program_id(2)`.

    `F32_DOT` widens the dot operands to fp32: only for Triton's CPU interpreter, whose bf16 dot
    is wrong; on the GPU the operands stay bf16.
    """
    h = tl.program_id(0)
    num_m = (T + BLOCK_M - 1) // BLOCK_M
    m_block = num_m - 1 - tl.program_id(1)  # longest causal rows first
    b = tl.program_id(2)
    kvh = h // (HQ // HKV)

    ctx = tl.load(lens_ptr + b)
    m_start = m_block * BLOCK_M
    offs_m = m_start + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    offs_n = tl.arange(0, BLOCK_N)
    row_ok = offs_m < T

    q_base = q_ptr + b.to(tl.int64) * T * (HQ * D) + h * D
    q = tl.load(q_base + offs_m[:, None] * (HQ * D) + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    if F32_DOT:
        q = q.to(tl.float32)

    page_stride: tl.constexpr = 2 * HKV * PS * D
    kv_head = kv_ptr + kvh * (PS * D)
    page_row = pages_ptr + b.to(tl.int64) * P

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.full([BLOCK_M], 0.0, tl.float32)
    acc = tl.full([BLOCK_M, D], 0.0, tl.float32)

    # Keys before the block's first query position are visible to every row: no mask.
    unmasked_end = ((ctx + m_start) // BLOCK_N) * BLOCK_N
    for n in range(0, unmasked_end, BLOCK_N):
        keys = n + offs_n
        page = tl.load(page_row + keys // PS).to(tl.int64)
        row_off = page * page_stride + (keys % PS) * D
        k = tl.load(kv_head + row_off[:, None] + offs_d[None, :])
        if F32_DOT:
            k = k.to(tl.float32)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(kv_head + HKV * PS * D + row_off[:, None] + offs_d[None, :])
        if F32_DOT:
            v = v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    # Diagonal blocks: key j is visible to query row t when j <= ctx + t.
    total = ctx + T
    masked_end = ctx + tl.minimum(m_start + BLOCK_M, T)
    pos = ctx + offs_m
    for n in range(unmasked_end, masked_end, BLOCK_N):
        keys = n + offs_n
        key_ok = keys < total
        page = tl.load(page_row + keys // PS, mask=key_ok, other=0).to(tl.int64)
        row_off = page * page_stride + (keys % PS) * D
        k = tl.load(kv_head + row_off[:, None] + offs_d[None, :], mask=key_ok[:, None], other=0.0)
        if F32_DOT:
            k = k.to(tl.float32)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        s = tl.where(keys[None, :] <= pos[:, None], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(kv_head + HKV * PS * D + row_off[:, None] + offs_d[None, :], mask=key_ok[:, None],
                    other=0.0)
        if F32_DOT:
            v = v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    out = acc / l_i[:, None]
    o_base = o_ptr + b.to(tl.int64) * T * (HQ * D) + h * D
    tl.store(o_base + offs_m[:, None] * (HQ * D) + offs_d[None, :], out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])


def qk_scale(head_dim: int, sm_scale: float | None) -> float:
    """The factor applied to `q . k` before exp2: the softmax scale times log2(e)."""
    scale = 1.0 / math.sqrt(head_dim) if sm_scale is None else float(sm_scale)
    return scale * LOG2E


def check_shapes(hq: int, hkv: int, d: int, page_size: int) -> None:
    """Raise `ValueError` for shapes the kernel does not handle."""
    if hq % hkv:
        raise ValueError(f"attention_prefill: {hq} query heads are not a multiple of {hkv} KV heads")
    if d not in CONFIGS_SM90:
        raise ValueError(f"attention_prefill: head_dim {d} is not one of {sorted(CONFIGS_SM90)}")
    if page_size < 1:
        raise ValueError(f"attention_prefill: page size {page_size} is not positive")


def images(arch: str, hq: int, hkv: int, d: int, page_size: int) -> list[KernelImage]:
    """The AOT image of the kernel for one shape and arch (cached on disk by `triton_aot`)."""
    from .triton_aot import compile_kernel

    check_shapes(hq, hkv, d, page_size)
    block_m, block_n, num_warps, num_stages = config(arch, d)
    image = compile_kernel(
        prefill_kernel,
        signature={"q_ptr": "*bf16", "kv_ptr": "*bf16", "pages_ptr": "*i32", "lens_ptr": "*i32", "o_ptr": "*bf16",
                   "T": "i32", "P": "i32", "qk_scale": "fp32"},
        constants={"HQ": hq, "HKV": hkv, "D": d, "PS": page_size, "BLOCK_M": block_m,
                   "BLOCK_N": block_n, "F32_DOT": False},
        arch=arch, num_warps=num_warps, num_stages=num_stages)
    return [image]


HOST_SOURCE = r"""
#include "ninfer_cuda.h"
// Launcher of the prefill attention kernel (ops/attention_prefill.py). The grid is
// (query heads, query blocks of the runtime token count, sequences): shapes only, so no host sync;
// the context lengths are read by the kernel.
namespace {

void attention_prefill(tvm::ffi::TensorView q, tvm::ffi::TensorView pool, tvm::ffi::TensorView pages,
                       tvm::ffi::TensorView lens, int64_t layer, tvm::ffi::TensorView o) {
  TVM_FFI_ICHECK(q.ndim() == 4 && pool.ndim() == 6 && pages.ndim() == 2 && lens.ndim() == 1)
      << "attention_prefill: unexpected ranks";
  const int64_t b = q.shape()[0], t = q.shape()[1];
  TVM_FFI_ICHECK(q.shape()[2] == @HQ@ && q.shape()[3] == @D@ && pool.shape()[3] == @HKV@ &&
                 pool.shape()[4] == @PS@ && pool.shape()[5] == @D@ && pool.shape()[2] == 2)
      << "attention_prefill: shapes differ from the compiled kernel";
  TVM_FFI_ICHECK(layer >= 0 && layer < pool.shape()[0]) << "attention_prefill: layer out of range";
  TVM_FFI_ICHECK(t < (int64_t(1) << 31) && pages.shape()[1] < (int64_t(1) << 31))
      << "attention_prefill: token count or page table too large";
  const uint64_t layer_bytes = static_cast<uint64_t>(pool.shape()[1]) * (2ull * @HKV@ * @PS@ * @D@ * 2ull);
  uint64_t qp = ninfer_cuda::pointer(q, "q");
  uint64_t kv = ninfer_cuda::pointer(pool, "kv_pool") + static_cast<uint64_t>(layer) * layer_bytes;
  uint64_t pp = ninfer_cuda::pointer(pages, "page_table");
  uint64_t lp = ninfer_cuda::pointer(lens, "seq_lens");
  uint64_t op = ninfer_cuda::pointer(o, "output");
  int32_t t32 = static_cast<int32_t>(t);
  int32_t p32 = static_cast<int32_t>(pages.shape()[1]);
  float scale = @SCALE@f;
  const unsigned blocks = static_cast<unsigned>((t + @BLOCK_M@ - 1) / @BLOCK_M@);
  ninfer_cuda::launch("@KERNEL@", @HQ@u, blocks, static_cast<unsigned>(b),
                      {&qp, &kv, &pp, &lp, &op, &t32, &p32, &scale}, q.device().device_id);
}

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(@SYMBOL@, attention_prefill);
"""


def host_source(kernel_name: str, arch: str, hq: int, hkv: int, d: int, page_size: int,
                scale_log2: float) -> str:
    """The C++ launcher for the image `kernel_name`, with the shape, tile and scale filled in."""
    values = {"@SYMBOL@": SYMBOL, "@KERNEL@": kernel_name, "@HQ@": str(hq), "@HKV@": str(hkv),
              "@D@": str(d), "@PS@": str(page_size), "@BLOCK_M@": str(config(arch, d)[0]),
              "@SCALE@": repr(float(scale_log2))}
    from .cuda_extern import fill_launcher

    return fill_launcher(HOST_SOURCE, values)


def supported(q: nn.Tensor, kv_pool: nn.Tensor, page_size: int) -> bool:
    """A CUDA target we build for, bf16 `q [B, T, Hq, D]` and pool, `T` not statically 1, known shapes."""
    import tvm

    target = tvm.target.Target.current(allow_none=True)
    if target is None or target.kind.name != "cuda" or str(target.arch) not in ARCHS:
        return False
    if str(q.dtype) != "bfloat16" or str(kv_pool.dtype) != "bfloat16" or len(q.shape) != 4:
        return False
    t, hq, d, hkv = q.shape[1], q.shape[2], q.shape[3], kv_pool.shape[3]
    if not all(isinstance(x, int) for x in (hq, d, hkv)) or (isinstance(t, int) and t == 1):
        return False
    try:
        check_shapes(hq, hkv, d, page_size)
    except ValueError:
        return False
    return True


def paged_attention_prefill(q: nn.Tensor, kv_pool: nn.Tensor, page_table: nn.Tensor, seq_lens: nn.Tensor,
                            layer: int, page_size: int, sm_scale: float | None = None) -> nn.Tensor:
    """`paged_attention` for `q [B, T, Hq, D]` (bf16) through the Triton kernel; `[B, T, Hq, D]`."""
    from tvm.relax.frontend import nn

    from .cuda_extern import current_arch, extern

    hq, d = int(q.shape[2]), int(q.shape[3])
    hkv = int(kv_pool.shape[3])
    scale_log2 = qk_scale(d, sm_scale)
    arch = current_arch()
    (image,) = images(arch, hq, hkv, d, page_size)

    def infer(q, pool, pages, lens, layer):
        return nn.Tensor.placeholder(q.shape, q.dtype)

    module = extern(
        f"attention_prefill_{arch}_q{hq}_kv{hkv}_d{d}_p{page_size}_s{scale_log2!r}",
        {SYMBOL: infer},
        host_source(image.name, arch, hq, hkv, d, page_size, scale_log2),
        [image],
    )
    return module[SYMBOL](q, kv_pool, page_table, seq_lens, int(layer))


def run_torch(q, kv_layer, page_table, seq_lens, sm_scale: float | None = None, *, out=None,
              block: tuple[int, int, int, int] | None = None, kernel=None, f32_dot: bool = False):
    """Launch the kernel on torch tensors (`kv_layer = kv_pool[layer]`): device checks and CPU tests.

    `kernel` replaces the JIT function (e.g. `triton_aot.interpreted(prefill_kernel)`); `block`
    overrides (BLOCK_M, BLOCK_N, num_warps, num_stages).
    """
    b, t, hq, d = q.shape
    hkv, ps = kv_layer.shape[2], kv_layer.shape[3]
    block_m, block_n, num_warps, num_stages = block or CONFIGS_SM90[d]
    o = torch_empty_like(q) if out is None else out
    fn = prefill_kernel if kernel is None else kernel
    fn[(hq, triton.cdiv(t, block_m), b)](
        q, kv_layer, page_table, seq_lens, o, t, page_table.shape[1], qk_scale(d, sm_scale),
        HQ=hq, HKV=hkv, D=d, PS=ps, BLOCK_M=block_m, BLOCK_N=block_n, F32_DOT=f32_dot,
        num_warps=num_warps, num_stages=num_stages)
    return o


def torch_empty_like(x):
    """`torch.empty_like` without importing torch at module import (the compiler does not need it)."""
    import torch

    return torch.empty_like(x)
