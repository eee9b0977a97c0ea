"""Decode attention over the paged KV pool on CUDA targets: split-KV ("flash decoding") in Triton.

Why: the TIR GPU kernel (`paged_attention_gpu`) runs one block per query head and walks the whole
context serially, so at batch 1 it uses 24 of 132 SMs and its time grows with the context
(docs/kernel-notes.md: 131 us per layer at 64 tokens). Here the context of each (sequence, KV head)
is cut into up to `MAX_SPLITS` contiguous splits that run as separate programs; a split's size
is chosen on the device from the whole batch's lengths so that about `TARGET` programs read keys
(short contexts use few splits, one long sequence in a batch of short ones gets many):

1. `_split_kernel`, grid `(MAX_SPLITS, Hkv, B)`: the `G = Hq / Hkv` query heads sharing a KV head
   are one tile (padded to 16 rows so both products run on tensor cores); the program walks its
   split's keys `BLOCK_N` at a time through the page table with an online softmax (fp32) and
   writes the normalised partial output and its log2-sum-exp to the workspace. Programs past the
   last used split of their sequence return at once and write nothing.
2. `_combine_kernel`, grid `(Hq, B)`: weights the used splits' partials by their sum-exps.

Semantics are those of `paged_attention` with `T = 1`: token `b` attends to positions
`0..seq_lens[b]` (its own K/V was appended before the call). The grids depend only on tensor
shapes (fixed per decode graph) and every length is read on the device, so the two launches
need no host sync and are CUDA-graph safe. The
workspace (`[B, Hq * MAX_SPLITS * (D + 1)]` fp32: partial outputs, then sum-exps) is the output of
the first extern call, so the Relax memory planner owns it.

This module imports TVM lazily: the kernels run standalone under torch + Triton (the GPU check).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import triton
import triton.language as tl

from .pdl import pdl_enter, pdl_mode
from .xq_triton import xq_store

if TYPE_CHECKING:
    from tvm.relax.frontend import nn

    from .triton_aot import KernelImage

MAX_SPLITS = 128  # splits per (sequence, KV head) at most; the grid is (MAX_SPLITS, Hkv, B)
TARGET = 1056  # programs with keys to read (8 per SM of an H200); sets the split size
COMBINE_CHUNK = 16  # splits merged per step of the combine kernel
BLOCK_N = 32  # keys per inner step (a multiple of the page size)
NUM_WARPS = 4
NUM_STAGES = 3
ROWS = 16  # query rows per program (G padded up to the tensor-core tile)
ARCHS = ("sm_90a", "sm_120a", "sm_121a")
SPLIT_SYMBOL = "ninfer_attention_decode_split"
COMBINE_SYMBOL = "ninfer_attention_decode_combine"
LOG2E = 1.4426950408889634


@triton.jit
def _split_plan(lens_ptr, b, batch, HKV: tl.constexpr, NS: tl.constexpr, BLOCK_N: tl.constexpr,
                TARGET: tl.constexpr):
    """Keys of sequence `b`, keys per split and its number of used splits (both kernels agree).

    A split gets at least `1 / TARGET` of the whole batch's key tiles (times KV heads), so the
    work is spread over about `TARGET` programs whatever the mix of lengths, and a sequence
    never has more than `NS` splits.
    """
    keys = tl.load(lens_ptr + b) + 1
    tiles = tl.cdiv(keys, BLOCK_N)
    total = 0
    for i in range(0, batch, 16):
        idx = i + tl.arange(0, 16)
        total += tl.sum(tl.cdiv(tl.load(lens_ptr + idx, mask=idx < batch, other=-1) + 1, BLOCK_N), 0)
    chunk = tl.maximum(tl.cdiv(tiles, NS), tl.cdiv(total * HKV, TARGET))
    per_split = chunk * BLOCK_N
    used = tl.cdiv(tiles, chunk)
    return keys, per_split, used


@triton.jit
def _tile(q, k, v, ok, m_i, l_i, acc, scale_log2):
    """One tile of keys into the online softmax: `(m_i, l_i, acc)` after keys `k`, values `v` (rows
    where `ok`)."""
    s = tl.dot(q, tl.trans(k)) * scale_log2
    s = tl.where(ok[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc


@triton.jit
def _split_kernel(
    q_ptr,  # [B, 1, Hq, D] bf16
    kv_ptr,  # the layer's pages: [num_pages, 2, Hkv, PS, D] bf16
    pages_ptr,  # [B, P] int32
    lens_ptr,  # [B] int32, tokens cached before this token
    ws_ptr,  # [B, Hq * NS * (D + 1)] fp32
    P,
    scale_log2,
    HQ: tl.constexpr,
    HKV: tl.constexpr,
    D: tl.constexpr,
    PS: tl.constexpr,
    NS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ROWS: tl.constexpr,
    TARGET: tl.constexpr,
    PDL: tl.constexpr = False,
    EARLY: tl.constexpr = False,
):
    """EARLY (under PDL): the lengths, the page table and the split's first tile of keys and values
    but the new token's are read before the wait (what no kernel of the decode step writes: the graph's
    inputs and the pool's rows of earlier steps; the previous kernel, the attention prologue, appends
    the new token's row, which is read after it), so at short contexts the split's whole chain of
    dependent loads overlaps the prologue; the same operations in the same order as without it."""
    if PDL and not EARLY:  # launched with PDL (ninfer_cuda::launch): wait for the previous kernel, let the next one start
        pdl_enter(PDL)
    split = tl.program_id(0)
    kvh = tl.program_id(1)
    b = tl.program_id(2)
    keys, per_split, used = _split_plan(lens_ptr, b, tl.num_programs(2), HKV, NS, BLOCK_N, TARGET)
    G: tl.constexpr = HQ // HKV
    page_stride: tl.constexpr = 2 * HKV * PS * D
    if EARLY:  # the first tile, less the new token's row, before the wait (see above)
        cols = tl.arange(0, D)
        j = split * per_split + tl.arange(0, BLOCK_N)
        first_end = tl.minimum(split * per_split + per_split, keys)
        ok = j < tl.where(split < used, first_end, 0)
        old = j < tl.where(split < used, tl.minimum(first_end, keys - 1), 0)
        page = tl.load(pages_ptr + b.to(tl.int64) * P + j // PS, mask=ok, other=0)
        row_off = page.to(tl.int64) * page_stride + kvh * PS * D + (j % PS) * D
        k0 = tl.load(kv_ptr + row_off[:, None] + cols[None, :], mask=old[:, None], other=0.0)
        v0 = tl.load(kv_ptr + (row_off + HKV * PS * D)[:, None] + cols[None, :], mask=old[:, None], other=0.0)
        if PDL:
            pdl_enter(PDL)
        new = ok & (j == keys - 1)  # the new token's row, appended by the previous kernel
        k0 = tl.where(new[:, None], tl.load(kv_ptr + row_off[:, None] + cols[None, :], mask=new[:, None], other=0.0), k0)
        v0 = tl.where(new[:, None], tl.load(kv_ptr + (row_off + HKV * PS * D)[:, None] + cols[None, :],
                                            mask=new[:, None], other=0.0), v0)
    if split < used:
        rows = tl.arange(0, ROWS)
        cols = tl.arange(0, D)
        offs_n = tl.arange(0, BLOCK_N)
        row_ok = rows < G
        q = tl.load(q_ptr + (b * HQ + kvh * G + rows)[:, None] * D + cols[None, :], mask=row_ok[:, None], other=0.0)
        start = split * per_split
        end = tl.minimum(start + per_split, keys)
        m_i = tl.full([ROWS], float("-inf"), tl.float32)
        l_i = tl.zeros([ROWS], tl.float32)
        acc = tl.zeros([ROWS, D], tl.float32)
        head_off = kvh * PS * D
        n_first = start
        if EARLY:
            m_i, l_i, acc = _tile(q, k0, v0, ok, m_i, l_i, acc, scale_log2)
            n_first = start + BLOCK_N
        for n0 in range(n_first, end, BLOCK_N):
            j = n0 + offs_n
            ok = j < end
            page = tl.load(pages_ptr + b.to(tl.int64) * P + j // PS, mask=ok, other=0)
            row_off = page.to(tl.int64) * page_stride + head_off + (j % PS) * D
            k = tl.load(kv_ptr + row_off[:, None] + cols[None, :], mask=ok[:, None], other=0.0)
            v = tl.load(kv_ptr + (row_off + HKV * PS * D)[:, None] + cols[None, :], mask=ok[:, None], other=0.0)
            m_i, l_i, acc = _tile(q, k, v, ok, m_i, l_i, acc, scale_log2)
        head = kvh * G + rows
        base = ws_ptr + b.to(tl.int64) * (HQ * NS * (D + 1))
        part = acc / l_i[:, None]
        tl.store(base + (head * NS + split)[:, None] * D + cols[None, :], part, mask=row_ok[:, None])
        tl.store(base + HQ * NS * D + head * NS + split, m_i + tl.log2(l_i), mask=row_ok)


@triton.jit
def _combine_kernel(
    ws_ptr,  # [B, Hq * NS * (D + 1)] fp32
    lens_ptr,  # [B] int32
    o_ptr,  # [B, 1, Hq, D] bf16
    gate_ptr,  # GATED: [B, 1, Hq * D] bf16, the output is o * sigmoid(gate) (else unused)
    xq_ptr,  # XQ: the output also as the decode GEMVs' int8 activations at <= 4 rows (ops/xq_triton.py)
    xs_ptr,  # XQ: their scales
    HQ: tl.constexpr,
    HKV: tl.constexpr,
    D: tl.constexpr,
    NS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    TARGET: tl.constexpr,
    CHUNK: tl.constexpr,
    PDL: tl.constexpr = False,
    GATED: tl.constexpr = False,
    XQ: tl.constexpr = False,
):
    if PDL:  # launched with PDL (ninfer_cuda::launch): wait for the previous kernel, let the next one start
        pdl_enter(PDL)
    h = tl.program_id(0)
    b = tl.program_id(1)
    keys, per_split, used = _split_plan(lens_ptr, b, tl.num_programs(1), HKV, NS, BLOCK_N, TARGET)
    cols = tl.arange(0, D)
    base = ws_ptr + b.to(tl.int64) * (HQ * NS * (D + 1))
    if GATED:  # loaded first: its latency overlaps the partials'
        g = tl.load(gate_ptr + (b * HQ + h) * D + cols).to(tl.float32)
    # running maximum (the same in every lane), weighted sums per lane, reduced once at the end
    m = tl.full([CHUNK], float("-inf"), tl.float32)
    den = tl.zeros([CHUNK], tl.float32)
    acc = tl.zeros([CHUNK, D], tl.float32)
    for s0 in range(0, used, CHUNK):
        splits = s0 + tl.arange(0, CHUNK)
        ok = splits < used
        lse = tl.load(base + HQ * NS * D + h * NS + splits, mask=ok, other=float("-inf"))
        part = tl.load(base + (h * NS + splits)[:, None] * D + cols[None, :], mask=ok[:, None], other=0.0)
        m_new = tl.maximum(m, tl.max(lse, 0))
        alpha = tl.exp2(m - m_new)
        w = tl.exp2(lse - m_new)
        acc = acc * alpha[:, None] + part * w[:, None]
        den = den * alpha + w
        m = m_new
    out = tl.sum(acc, 0) / tl.sum(den, 0)
    if GATED:  # as the unfused `o * sigmoid(gate)` on the bf16 attention output
        out = out.to(tl.bfloat16).to(tl.float32) * (1.0 / (1.0 + tl.exp(-g)))
    tl.store(o_ptr + (b * HQ + h) * D + cols, out.to(o_ptr.dtype.element_ty))
    if XQ:  # (D % 64 == 0: this program's head is whole groups of the output row; more than 4
        if tl.num_programs(1) <= 4:  # rows: the GEMV reads `o`, so nothing is written)
            xq_store(out.to(tl.bfloat16).to(tl.float32), xq_ptr, xs_ptr, b, h * D, D)


def launch_torch(q, kv_layer, page_table, seq_lens, sm_scale: float, ws=None, o=None, *, splits: int = MAX_SPLITS,
                 target: int = TARGET, block_n: int = BLOCK_N, num_warps: int = NUM_WARPS,
                 num_stages: int = NUM_STAGES, interpret: bool = False, gate=None, xq=None, early: bool = False):
    """Run both kernels on torch tensors (Triton JIT); `kv_layer` is `kv_pool[layer]`; `xq` (uint8,
    with `gate`): also the output's int8 activations there; `early`: the split kernel's EARLY form.

    The standalone path of the GPU check and, with `interpret` (Triton's CPU interpreter on CPU
    tensors), of the unit tests; returns `(o, ws)`.
    """
    import torch

    split_kernel, combine_kernel = _split_kernel, _combine_kernel
    if interpret:
        from triton.runtime.interpreter import InterpretedFunction

        split_kernel, combine_kernel = InterpretedFunction(_split_kernel.fn), InterpretedFunction(_combine_kernel.fn)

    b, _, hq, d = q.shape
    hkv, ps = kv_layer.shape[2], kv_layer.shape[3]
    if block_n % ps:
        raise ValueError(f"page size {ps} does not divide {block_n}")
    if ws is None:
        ws = torch.empty((b, workspace_width(hq, d, splits)), dtype=torch.float32, device=q.device)
    if o is None:
        o = torch.empty_like(q)
    split_kernel[(splits, hkv, b)](
        q, kv_layer, page_table, seq_lens, ws, page_table.shape[1], sm_scale * LOG2E,
        HQ=hq, HKV=hkv, D=d, PS=ps, NS=splits, BLOCK_N=block_n, ROWS=ROWS, TARGET=target, EARLY=early,
        num_warps=num_warps, num_stages=num_stages)
    xq_args = (ws, ws) if xq is None else (xq.view(torch.int8), xq[hq * d * 8:].view(torch.float32))
    combine_kernel[(hq, b)](ws, seq_lens, o, o if gate is None else gate, *xq_args, HQ=hq, HKV=hkv, D=d,
                             NS=splits, BLOCK_N=block_n, TARGET=target, CHUNK=COMBINE_CHUNK,
                             GATED=gate is not None, XQ=xq is not None, num_warps=4, num_stages=1)
    return o, ws


def workspace_width(num_q_heads: int, head_dim: int, splits: int = MAX_SPLITS) -> int:
    """fp32 elements of workspace per sequence: partial outputs then log2-sum-exps."""
    return num_q_heads * splits * (head_dim + 1)


def _check_shapes(hq: int, hkv: int, d: int, page_size: int) -> None:
    if hq % hkv or hq // hkv > ROWS:
        raise ValueError(f"attention_decode: {hq} query heads over {hkv} KV heads is not 1..{ROWS} per KV head")
    if d & (d - 1) or d < 16:
        raise ValueError(f"attention_decode: head_dim {d} is not a power of two >= 16")
    if BLOCK_N % page_size:
        raise ValueError(f"attention_decode: page size {page_size} does not divide {BLOCK_N}")


def images(arch: str, hq: int, hkv: int, d: int, page_size: int, gated: bool = False,
           xq: bool = False, early: bool = False) -> list[KernelImage]:
    """AOT images (split, combine) for one shape and arch; cached on disk by `triton_aot`
    (`gated`: the combine multiplies by the sigmoid of the output gate; `xq`: and also writes
    its output as int8 activations; `early`: the split kernel's EARLY form)."""
    from .triton_aot import compile_kernel

    _check_shapes(hq, hkv, d, page_size)
    split = compile_kernel(
        _split_kernel,
        signature={"q_ptr": "*bf16", "kv_ptr": "*bf16", "pages_ptr": "*i32", "lens_ptr": "*i32",
                   "ws_ptr": "*fp32", "P": "i32", "scale_log2": "fp32"},
        constants={"HQ": hq, "HKV": hkv, "D": d, "PS": page_size, "NS": MAX_SPLITS, "BLOCK_N": BLOCK_N,
                   "ROWS": ROWS, "TARGET": TARGET, "PDL": pdl_mode(), "EARLY": early},
        arch=arch, num_warps=NUM_WARPS, num_stages=NUM_STAGES)
    combine = compile_kernel(
        _combine_kernel,
        signature={"ws_ptr": "*fp32", "lens_ptr": "*i32", "o_ptr": "*bf16", "gate_ptr": "*bf16",
                   "xq_ptr": "*i8", "xs_ptr": "*fp32"},
        constants={"HQ": hq, "HKV": hkv, "D": d, "NS": MAX_SPLITS, "BLOCK_N": BLOCK_N, "TARGET": TARGET,
                   "CHUNK": COMBINE_CHUNK, "PDL": pdl_mode(), "GATED": gated, "XQ": xq},
        arch=arch, num_warps=4, num_stages=1)
    return [split, combine]


HOST_SOURCE = r"""
// Launchers of the split-KV decode attention (ops/attention_decode.py). Both grids depend only on
// static shapes; sequence lengths are read by the kernels, so the launches are graph-safe.
namespace {

void attention_decode_split(tvm::ffi::TensorView q, tvm::ffi::TensorView pool, tvm::ffi::TensorView pages,
                            tvm::ffi::TensorView lens, int64_t layer, tvm::ffi::TensorView ws) {
  TVM_FFI_ICHECK(q.ndim() == 4 && q.shape()[1] == 1 && pool.ndim() == 6 && pages.ndim() == 2)
      << "attention_decode: unexpected ranks or token count";
  TVM_FFI_ICHECK(q.dtype().code == kDLBfloat && pool.dtype().code == kDLBfloat && pages.dtype().bits == 32 &&
                 lens.dtype().bits == 32)
      << "attention_decode: q and the pool must be bf16, the page table and lengths int32";
  const int64_t b = q.shape()[0];
  const int64_t num_pages = pool.shape()[1];
  const int64_t page_elems = pool.shape()[2] * pool.shape()[3] * pool.shape()[4] * pool.shape()[5];
  TVM_FFI_ICHECK(layer >= 0 && layer < pool.shape()[0]) << "attention_decode: layer out of range";
  uint64_t qp = ninfer_cuda::pointer(q, "q");
  uint64_t kv = ninfer_cuda::pointer(pool, "kv_pool") + static_cast<uint64_t>(layer * num_pages * page_elems * 2);
  uint64_t pp = reinterpret_cast<uint64_t>(ninfer_cuda::address(pages));
  uint64_t lp = reinterpret_cast<uint64_t>(ninfer_cuda::address(lens));
  uint64_t wp = ninfer_cuda::pointer(ws, "workspace");
  int32_t p = static_cast<int32_t>(pages.shape()[1]);
  float s = @SCALE@f;
  ninfer_cuda::launch("@SPLIT@", @NS@, static_cast<unsigned>(pool.shape()[3]), static_cast<unsigned>(b),
                      {&qp, &kv, &pp, &lp, &wp, &p, &s}, q.device().device_id, /*pdl=*/true);
}

#if !@GATED@
void attention_decode_combine(tvm::ffi::TensorView ws, tvm::ffi::TensorView lens, tvm::ffi::TensorView o) {
  const int64_t b = o.shape()[0];
  uint64_t wp = ninfer_cuda::pointer(ws, "workspace");
  uint64_t lp = reinterpret_cast<uint64_t>(ninfer_cuda::address(lens));
  uint64_t op = ninfer_cuda::pointer(o, "output");
  uint64_t none = 0;
  ninfer_cuda::launch("@COMBINE@", static_cast<unsigned>(o.shape()[2]), static_cast<unsigned>(b), 1,
                      {&wp, &lp, &op, &op, &none, &none}, o.device().device_id, /*pdl=*/true);
}

#else
// The gated form (an image built with GATED): o = attention * sigmoid(gate), o [B, 1, Hq * D];
// with XQ also o as int8 activations `xq` at <= 4 rows (uint8, Hq * D * 8 + Hq * D / 256 * 64 bytes).
void attention_decode_combine(tvm::ffi::TensorView ws, tvm::ffi::TensorView lens, tvm::ffi::TensorView gate,
                              tvm::ffi::TensorView o@XQ_PARAM@) {
  const int64_t b = o.shape()[0];
  TVM_FFI_ICHECK(gate.numel() == o.numel() && gate.dtype().code == kDLBfloat) << "attention_decode: gate shape";
  uint64_t wp = ninfer_cuda::pointer(ws, "workspace");
  uint64_t lp = reinterpret_cast<uint64_t>(ninfer_cuda::address(lens));
  uint64_t gp = ninfer_cuda::pointer(gate, "gate");
  uint64_t op = ninfer_cuda::pointer(o, "output");
  uint64_t xqp = 0, xsp = 0;
  @XQ_ADDRESSES@
  ninfer_cuda::launch("@COMBINE@", @HQ@u, static_cast<unsigned>(b), 1, {&wp, &lp, &op, &gp, &xqp, &xsp},
                      o.device().device_id, /*pdl=*/true);
}
#endif

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(@SPLIT_SYMBOL@, attention_decode_split);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(@COMBINE_SYMBOL@, attention_decode_combine);
"""


def host_source(tag: str, split_name: str, combine_name: str, scale_log2: float, hq: int,
                gated: bool = False, xq_width: int = 0) -> str:
    """The C++ launcher for the two images; exported symbols carry `tag` (one extern per shape).
    `xq_width` (gated only): the output's width when the combine also writes int8 activations."""
    addresses = ""
    if xq_width:
        addresses = (f"TVM_FFI_ICHECK(xq.numel() == {xq_width * 8 + xq_width // 256 * 64} && xq.dtype().bits == 8) "
                     '<< "attention_decode: xq size";\n  xqp = ninfer_cuda::pointer(xq, "xq"); '
                     f"xsp = xqp + {xq_width * 8};")
    fields = {"@SPLIT_SYMBOL@": f"{SPLIT_SYMBOL}_{tag}", "@COMBINE_SYMBOL@": f"{COMBINE_SYMBOL}_{tag}",
              "@SPLIT@": split_name, "@COMBINE@": combine_name, "@NS@": str(MAX_SPLITS),
              "@SCALE@": repr(float(scale_log2)), "@HQ@": str(hq),
              "@GATED@": "1" if gated else "0", "@XQ_PARAM@": ", tvm::ffi::TensorView xq" if xq_width else "",
              "@XQ_ADDRESSES@": addresses}
    from .cuda_extern import fill_launcher

    return fill_launcher(HOST_SOURCE, fields)


def supported(q: nn.Tensor, kv_pool: nn.Tensor, page_size: int) -> bool:
    """A CUDA target, decode-shaped `q [B, 1, Hq, D]` (T == 1 static), bf16 q and pool, shapes we handle."""
    import tvm

    target = tvm.target.Target.current(allow_none=True)
    if target is None or target.kind.name != "cuda" or str(target.arch) not in ARCHS:
        return False
    if str(q.dtype) != "bfloat16" or str(kv_pool.dtype) != "bfloat16" or len(q.shape) != 4:
        return False
    t, hq, d, hkv = q.shape[1], q.shape[2], q.shape[3], kv_pool.shape[3]
    if not all(isinstance(x, int) for x in (t, hq, d, hkv)) or t != 1:
        return False
    try:
        _check_shapes(hq, hkv, d, page_size)
    except ValueError:
        return False
    return True


def paged_attention_decode(
    q: nn.Tensor,
    kv_pool: nn.Tensor,
    page_table: nn.Tensor,
    seq_lens: nn.Tensor,
    layer: int,
    page_size: int,
    sm_scale: float | None = None,
    gate: nn.Tensor | None = None,
    with_xq: bool = False,
) -> nn.Tensor | tuple[nn.Tensor, nn.Tensor]:
    """`paged_attention` for `q [B, 1, Hq, D]` through the split-KV Triton kernels; `[B, 1, Hq, D]`,
    or with `gate [B, 1, Hq * D]` the gated output `attention * sigmoid(gate)` as `[B, 1, Hq * D]`;
    `with_xq` (gated, `xq_supported`): `(that output, its int8 activations)` (uint8, written at <= 4 rows)."""
    import tvm
    from tvm.relax.frontend import nn

    from .common import kernel_feature
    from .cuda_extern import extern

    _, _, hq, d = q.shape
    hkv = int(kv_pool.shape[3])
    scale = 1.0 / math.sqrt(d) if sm_scale is None else float(sm_scale)
    arch = str(tvm.target.Target.current().arch)
    gated = gate is not None
    if with_xq and not (gated and xq_supported(hq, d)):
        raise ValueError(f"attention_decode: int8 activations need the gated form, D % 64 == 0 and Hq*D % 256 == 0, "
                         f"got Hq {hq}, D {d}")
    early = kernel_feature("attention_split_early")
    split, combine = images(arch, hq, hkv, d, page_size, gated, with_xq, early)

    def infer_split(q, pool, pages, lens, layer):
        return nn.Tensor.placeholder([q.shape[0], workspace_width(hq, d)], "float32")

    def infer_combine(ws, lens, *gate):
        return nn.Tensor.placeholder([ws.shape[0], 1, hq * d] if gated else [ws.shape[0], 1, hq, d], "bfloat16")

    tag = f"q{hq}_kv{hkv}_d{d}_p{page_size}_s{scale_tag(scale)}" + ("_gated" if gated else "") + (
        "_xq" if with_xq else "") + ("_early" if early else "")
    split_symbol, combine_symbol = f"{SPLIT_SYMBOL}_{tag}", f"{COMBINE_SYMBOL}_{tag}"
    module = extern(
        f"attention_decode_{arch}_{tag}",
        {split_symbol: infer_split, combine_symbol: infer_combine},
        host_source(tag, split.name, combine.name, scale * LOG2E, hq, gated, hq * d if with_xq else 0),
        [split, combine],
    )
    ws = module[split_symbol](q, kv_pool, page_table, seq_lens, int(layer))
    if with_xq:
        from .cuda_extern import dps_call

        width = hq * d
        outs = [nn.Tensor.placeholder([q.shape[0], 1, width], "bfloat16"),
                nn.Tensor.placeholder([width * 8 + width // 256 * 64], "uint8")]
        result = dps_call(combine_symbol, [ws, seq_lens, gate], outs)
        return result[0], result[1]
    return module[combine_symbol](ws, seq_lens, gate) if gated else module[combine_symbol](ws, seq_lens)


def xq_supported(hq: int, d: int) -> bool:
    """Whether the gated combine can also write its output as the decode GEMVs' int8 activations: a
    program's head is whole groups of 64, the width a multiple of 256 (the int8 stages')."""
    return d % 64 == 0 and (hq * d) % 256 == 0


def scale_tag(scale: float) -> str:
    """The softmax scale as a symbol-safe string (its float32 bits)."""
    import struct

    return struct.pack("<f", scale).hex()
