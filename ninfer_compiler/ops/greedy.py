"""The greedy choice of each logits row on the device: its token (the lowest id among the maxima,
as `np.argmax`) and that token's log-probability.

Why: a decode step's logits are `[b, V]` fp32 (V = 248,320 for Qwen3.6: ~1 MB per sequence), and
copying them to the host every step costs PCIe time, a host synchronisation on a large buffer and
a host log-softmax over the whole row. A greedy request without penalties, constraints or
alternatives needs only these two numbers, 8 bytes per sequence.

On CUDA targets two Triton kernels run: partial (max, first argmax, sum of exp) over `SPLITS`
slices of each row, then their combination; elsewhere one TE op computes the same.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import triton
import triton.language as tl

from .pdl import pdl_enter, pdl_mode

if TYPE_CHECKING:
    from tvm.relax.frontend import nn

    from .triton_aot import KernelImage

SPLITS = 32  # slices of a row reduced in parallel (a row of 248,320 is ~31 KB per slice)
BLOCK = 1024
PARTIAL_SYMBOL, COMBINE_SYMBOL = "ninfer_greedy_partial", "ninfer_greedy_combine"


@triton.jit
def partial_kernel(logits, ws_max, ws_idx, ws_sum, vocab, SPLITS: tl.constexpr, BLOCK: tl.constexpr,
                   PDL: tl.constexpr = False):
    """Program (row, s): the max, the lowest index holding it, and sum(exp(x - max)) of slice s."""
    if PDL:  # launched with PDL (ninfer_cuda::launch): wait for the previous kernel, let the next one start
        pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1)
    span = tl.cdiv(tl.cdiv(vocab, SPLITS), BLOCK) * BLOCK
    start = s * span
    offs = tl.arange(0, BLOCK)
    m = tl.full((), float("-inf"), tl.float32)
    idx = tl.full((), 2147483647, tl.int32)
    acc = tl.zeros((), tl.float32)
    for off in range(0, span, BLOCK):
        col = start + off + offs
        x = tl.load(logits + row * vocab + col, mask=col < vocab, other=float("-inf"))
        bm = tl.max(x, 0)
        bi = tl.min(tl.where(x == bm, col, 2147483647), 0)
        new_m = tl.maximum(m, bm)
        # an earlier block keeps its index on a tie (it has the lower ids)
        idx = tl.where(bm > m, bi, idx)
        ref = tl.where(new_m == float("-inf"), 0.0, new_m)  # all -inf so far: exp(-inf - 0) = 0
        acc = acc * tl.exp(m - ref) + tl.sum(tl.exp(x - ref), 0)
        m = new_m
    out = row * SPLITS + s
    tl.store(ws_max + out, m)
    tl.store(ws_idx + out, idx)
    tl.store(ws_sum + out, acc)


@triton.jit
def combine_kernel(ws_max, ws_idx, ws_sum, token, logprob, SPLITS: tl.constexpr, PDL: tl.constexpr = False):
    """Program (row): the row's token and log-probability from its slices' partials."""
    if PDL:  # launched with PDL (ninfer_cuda::launch): wait for the previous kernel, let the next one start
        pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    r = tl.arange(0, SPLITS)
    m = tl.load(ws_max + row * SPLITS + r)
    i = tl.load(ws_idx + row * SPLITS + r)
    a = tl.load(ws_sum + row * SPLITS + r)
    big = tl.max(m, 0)
    tok = tl.min(tl.where(m == big, i, 2147483647), 0)
    total = tl.sum(a * tl.exp(m - big), 0)  # a slice of -inf only has a = 0 and exp(-inf) = 0
    # NaN logits leave no maximum to point at: token 0 rather than an id past the vocabulary (which a
    # step queued behind this one would look up), and a NaN log-probability, which the engine refuses
    ok = tok != 2147483647
    tl.store(token + row, tl.where(ok, tok, 0))
    tl.store(logprob + row, tl.where(ok, -tl.log(total), float("nan")))  # log p = -log sum exp(x - x_max)


def images(arch: str) -> tuple[KernelImage, KernelImage]:
    from .triton_aot import compile_kernel

    partial = compile_kernel(
        partial_kernel,
        signature={"logits": "*fp32", "ws_max": "*fp32", "ws_idx": "*i32", "ws_sum": "*fp32", "vocab": "i32"},
        constants={"SPLITS": SPLITS, "BLOCK": BLOCK, "PDL": pdl_mode()}, arch=arch, num_warps=4, num_stages=2)
    combine = compile_kernel(
        combine_kernel,
        signature={"ws_max": "*fp32", "ws_idx": "*i32", "ws_sum": "*fp32", "token": "*i32", "logprob": "*fp32"},
        constants={"SPLITS": SPLITS, "PDL": pdl_mode()}, arch=arch, num_warps=1, num_stages=1)
    return partial, combine


LAUNCHER = r"""
#include "ninfer_cuda.h"
namespace {
using tvm::ffi::TensorView;
// token[b] int32, logprob[b] fp32 of logits [b, V] fp32; ws_* are [b, SPLITS] scratch (outputs of
// the first launch, read by the second within this call).
void greedy(TensorView logits, TensorView ws_max, TensorView ws_idx, TensorView ws_sum, TensorView token,
            TensorView logprob) {
  TVM_FFI_ICHECK(logits.ndim() == 2 && logits.dtype().code == kDLFloat && logits.dtype().bits == 32)
      << "@SYMBOL@: logits must be [b, V] float32";
  const int64_t rows = logits.shape()[0];
  TVM_FFI_ICHECK(token.numel() == rows && logprob.numel() == rows && ws_max.numel() == rows * @SPLITS@)
      << "@SYMBOL@: unexpected shapes";
  uint64_t lp = reinterpret_cast<uint64_t>(ninfer_cuda::address(logits));
  uint64_t mp = reinterpret_cast<uint64_t>(ninfer_cuda::address(ws_max));
  uint64_t ip = reinterpret_cast<uint64_t>(ninfer_cuda::address(ws_idx));
  uint64_t sp = reinterpret_cast<uint64_t>(ninfer_cuda::address(ws_sum));
  uint64_t tp = reinterpret_cast<uint64_t>(ninfer_cuda::address(token));
  uint64_t pp = reinterpret_cast<uint64_t>(ninfer_cuda::address(logprob));
  int32_t vocab = static_cast<int32_t>(logits.shape()[1]);
  const int dev = logits.device().device_id;
  ninfer_cuda::launch(@PARTIAL@, static_cast<unsigned>(rows), @SPLITS@, 1, {&lp, &mp, &ip, &sp, &vocab}, dev, true);
  ninfer_cuda::launch(@COMBINE@, static_cast<unsigned>(rows), 1, 1, {&mp, &ip, &sp, &tp, &pp}, dev, true);
}
}  // namespace
TVM_FFI_DLL_EXPORT_TYPED_FUNC(@SYMBOL@, greedy);
"""


def _te_greedy(logits: nn.Tensor) -> tuple[nn.Tensor, nn.Tensor]:
    """The same two numbers as TE ops (CPU and reference-kernel packages): one single-output
    reduction each, the shape GPU reduction schedules take."""
    from tvm import te, tirx
    from tvm.relax.frontend.nn import op

    rows, vocab = logits.shape

    def row_max(x: te.Tensor) -> te.Tensor:
        k = te.reduce_axis((0, vocab), name="k")
        return te.compute((rows,), lambda i: te.max(x[i, k], axis=k), name="row_max")

    def first_max(x: te.Tensor, mx: te.Tensor) -> te.Tensor:
        k = te.reduce_axis((0, vocab), name="k")
        big = tirx.const(2147483647, "int32")
        first = te.compute((rows,), lambda i: te.min(tirx.Select(x[i, k] == mx[i], k.astype("int32"), big), axis=k),
                           name="greedy_first")
        # NaN logits leave no maximum to point at: token 0, never an id past the vocabulary
        return te.compute((rows,), lambda i: tirx.Select(first[i] == big, tirx.const(0, "int32"), first[i]),
                          name="greedy_token")

    def logprob(x: te.Tensor, mx: te.Tensor) -> te.Tensor:
        k = te.reduce_axis((0, vocab), name="k")
        total = te.compute((rows,), lambda i: te.sum(te.exp(x[i, k] - mx[i]), axis=k), name="sum_exp")
        return te.compute((rows,), lambda i: -te.log(total[i]), name="greedy_logprob")

    mx = op.tensor_expr_op(row_max, "greedy_row_max", [logits])
    return (op.tensor_expr_op(first_max, "greedy_token", [logits, mx]),
            op.tensor_expr_op(logprob, "greedy_logprob", [logits, mx]))


THREADS = 256  # threads per row of the TIR GPU form


def greedy_gpu_func(vocab: int, bound: bool = True):  # noqa: ANN201 (a tirx.PrimFunc)
    """Thread-bound TIR form for the reference kernels on CUDA targets (GPU reduction schedules do
    not take the two-input reductions of the TE form): one block per row, each thread an online
    (max, first index, sum of exp) over a strided slice, then thread 0 combines them in order.
    `bound=False` gives the serial form for CPU checks."""
    from tvm.script import tirx as T

    from .common import SCHEDULED_ATTRS, shared_scope, thread_loop

    V, NT = vocab, THREADS
    PER = (vocab + NT - 1) // NT
    loop = thread_loop(bound)
    smem = shared_scope(bound)
    big = 2147483647

    @T.prim_func
    def greedy_gpu(var_x: T.handle, var_tok: T.handle, var_lp: T.handle):
        T.func_attr(SCHEDULED_ATTRS)
        B = T.int64()
        x = T.match_buffer(var_x, (B, V), "float32")
        tok = T.match_buffer(var_tok, (B,), "int32")
        lp = T.match_buffer(var_lp, (B,), "float32")
        for b in loop(B, "blockIdx.x"):
            m_sh = T.alloc_buffer((NT,), "float32", scope=smem)
            i_sh = T.alloc_buffer((NT,), "int32", scope=smem)
            s_sh = T.alloc_buffer((NT,), "float32", scope=smem)
            for tx in loop(T.int64(NT), "threadIdx.x"):
                st = T.alloc_buffer((2,), "float32", scope="local")  # running max, sum of exp
                ix = T.alloc_buffer((1,), "int32", scope="local")
                st[0] = T.float32("-inf")
                st[1] = T.float32(0)
                ix[0] = T.int32(big)
                for j in range(T.int64(PER)):
                    k = j * T.int64(NT) + tx
                    if k < T.int64(V):
                        v = x[b, k]
                        if v > st[0]:
                            st[1] = st[1] * T.exp(st[0] - v) + T.float32(1)
                            st[0] = v
                            ix[0] = T.Cast("int32", k)
                        else:
                            st[1] = st[1] + T.if_then_else(v == T.float32("-inf"), T.float32(0), T.exp(v - st[0]))
                m_sh[tx] = st[0]
                i_sh[tx] = ix[0]
                s_sh[tx] = st[1]
            for tx in loop(T.int64(NT), "threadIdx.x"):
                if tx == T.int64(0):
                    acc = T.alloc_buffer((3,), "float32", scope="local")  # max, sum, this entry's max
                    best = T.alloc_buffer((2,), "int32", scope="local")  # index, this entry's index
                    acc[0] = m_sh[0]
                    best[0] = i_sh[0]
                    for t in range(T.int64(1), T.int64(NT)):
                        acc[2] = m_sh[t]  # shared loads outside the conditions (sync planning)
                        best[1] = i_sh[t]
                        if acc[2] > acc[0] or (acc[2] == acc[0] and best[1] < best[0]):
                            acc[0] = acc[2]
                            best[0] = best[1]
                    acc[1] = T.float32(0)
                    for t in range(T.int64(NT)):
                        acc[2] = m_sh[t]
                        acc[1] = acc[1] + T.if_then_else(acc[2] == T.float32("-inf"), T.float32(0),
                                                         s_sh[t] * T.exp(acc[2] - acc[0]))
                    # NaN logits: token 0 (never an id past the vocabulary) and a NaN log-probability
                    tok[b] = T.if_then_else(best[0] == T.int32(big), T.int32(0), best[0])
                    lp[b] = T.if_then_else(best[0] == T.int32(big), T.float32("nan"), T.float32(0) - T.log(acc[1]))

    return greedy_gpu


def _tir_greedy(logits: nn.Tensor, bound: bool) -> tuple[nn.Tensor, nn.Tensor]:
    from tvm.relax.frontend import nn
    from tvm.relax.frontend.nn import op

    rows, vocab = logits.shape
    # written in place into fresh buffers: a one-input `call_tir` would be taken for a reshape
    # candidate, whose analysis needs block-form TIR
    token, logprob = op.tensor_ir_inplace_op(
        greedy_gpu_func(int(vocab), bound), "greedy_choice_gpu",
        [logits, op.empty([rows], "int32", name="greedy_token"), op.empty([rows], "float32", name="greedy_logprob")],
        [1, 2], [nn.Tensor.placeholder([rows], "int32"), nn.Tensor.placeholder([rows], "float32")])
    return token, logprob


def greedy_choice(logits: nn.Tensor) -> tuple[nn.Tensor, nn.Tensor]:
    """`(token [b] int32, logprob [b] fp32)` of `logits [b, V]` fp32."""
    from tvm.relax.frontend import nn

    from .common import kernel_flavor, tuned_cuda_kernels

    if not tuned_cuda_kernels():
        flavor = kernel_flavor()
        return _te_greedy(logits) if flavor == "cpu" else _tir_greedy(logits, bound=flavor == "gpu")
    from .cuda_extern import current_arch, dps_call, extern, fill_launcher

    arch = current_arch()
    partial, combine = images(arch)
    symbol = "ninfer_greedy_choice"
    launcher = fill_launcher(LAUNCHER, {"SYMBOL": symbol, "SPLITS": SPLITS, "PARTIAL": f'"{partial.name}"',
                                        "COMBINE": f'"{combine.name}"'})
    # registers the launcher library with the export (the call itself is emitted below)
    extern(f"greedy_{arch}", {symbol: lambda *args: args[0]}, launcher, [partial, combine])
    rows = logits.shape[0]
    outputs = [nn.Tensor.placeholder([rows, SPLITS], "float32"), nn.Tensor.placeholder([rows, SPLITS], "int32"),
               nn.Tensor.placeholder([rows, SPLITS], "float32"), nn.Tensor.placeholder([rows], "int32"),
               nn.Tensor.placeholder([rows], "float32")]
    out = dps_call(symbol, [logits], outputs)
    return out[3], out[4]
