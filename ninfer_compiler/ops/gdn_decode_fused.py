"""One GDN decode step in one kernel on CUDA targets: gates, L2 norms, delta rule, gated RMS norm.

Why: at batch 1 a GDN layer's decode ran seven small kernels between the short convolution and
the output projection (split, two L2 norms, a cast, the recurrent rule, a cast, the gated norm),
each a few microseconds of launch and tail for a few KB of work, plus the gate epilogues; 48
layers per step. Here one program per (sequence, value head) reads the post-convolution row,
its two gate pre-activations and `z`, updates that head's fp32 state in place and writes the
normalised, gated output, rounding where the unfused ops round (HF's order). Where the gate
projections are dense bf16 (`gates_foldable`) it also computes them from the layer input, which
takes the small dense GEMV launch out of the decode step; its state slice and parameters are read
before the PDL wait.

Semantics (see ops/gated_delta_rule.py, ops/gdn_gates.py, ops/norm.py):
    q, k = l2norm(q) * dk^-0.5, l2norm(k);  g = -exp(a_log) * softplus(a + dt_bias);
    beta = bf16(sigmoid(b));  S <- exp(g) S;  u = beta (v - S^T k);  S <- S + k u^T;
    o = bf16(S^T q);  out = bf16(bf16(o * rsqrt(mean(o^2) + eps)) * w * silu(z)).
"""

from __future__ import annotations

from dataclasses import dataclass

import triton
import triton.language as tl
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import op

from .common import dtype_tag, kernel_feature, tuned_cuda_kernels
from .cuda_extern import current_arch, extern, fill_launcher, inplace_call
from .gdn_gates import SOFTPLUS_THRESHOLD
from .pdl import pdl_enter, pdl_mode, pdl_trigger_early
from .triton_aot import KernelImage, compile_kernel
from .xq_triton import xq_store

SYMBOL = "ninfer_gdn_decode"
L2_EPS = 1e-6


@triton.jit
def gdn_decode_kernel(mixed, a_in, b_in, h, a_log, dt_bias, z, norm_w, state, slots, lens, out,
                      layer, num_slots, eps, xq, xs, conv_w, conv_hist, conv_slots,
                      HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
                      Q_SCALE: tl.constexpr, L2_EPS: tl.constexpr, SOFTPLUS_T: tl.constexpr,
                      GATE_K: tl.constexpr = 0, GATE_KP: tl.constexpr = 1, PDL: tl.constexpr = False,
                      XQ: tl.constexpr = False, BV: tl.constexpr = 0, GATE_BK: tl.constexpr = 1024,
                      PREFETCH: tl.constexpr = False, CONV: tl.constexpr = False, CLUSTER: tl.constexpr = False):
    """Program (b, j): value head j of sequence b.

    BV = 0: the whole state slice [DK, DV] in registers, loaded before the PDL wait (few programs:
    each needs the most loads in flight). BV > 0 (divides DV): the slice in column chunks of BV,
    one after another, so a program holds BV / DV of the state's registers and several programs share
    a multiprocessor (many programs: at batch 8 the whole-slice form runs three waves of one
    program per multiprocessor); the unnormalised output goes to `out` per chunk and is read back
    for the gated norm, and the gate projections are dotted GATE_BK columns at a time (GATE_BK = 0:
    all at once, their weights loaded before the wait). PREFETCH (BV > 0): chunk 0 is loaded before
    the wait and chunk c + 1 while chunk c is computed.
    GATE_K = 0: `a_in`, `b_in` are the gate pre-activations [B, HV] (`h` unused). GATE_K > 0: they
    are the bf16 gate projections [HV, GATE_K] and `h` the layer input [B, GATE_K] (GATE_KP: the
    next power of two); row j of each is dotted with h in fp32 and rounded to bf16, as the dense
    projection would (one launch less per layer).
    XQ: the output also as the int8 activations of the decode GEMVs, at batches of <= 4 rows (`xq` bytes, `xs`
    their scales: the xq layout of ops/qgemv_cuda.cu `v4_stage_i8`, ops/xq_triton.py `xq_store`); DV % 64 == 0, so
    a program owns whole groups of 64 and needs no other program's outputs.
    CONV: `mixed` is the row before the short convolution (4 taps `conv_w [4, C]`, history `conv_hist [L,
    conv_slots, 3, C]` bf16), which the program applies to its q, k and v channels itself (ops/conv1d_decode.py's
    math and roundings) and shifts in the history: its v channels are its own; q and k are shared by the
    HV / HK programs of a key head, which all read their history and the last of them writes it. CLUSTER: those
    programs are one thread block cluster (launched so), whose barrier orders every read before that write
    (without it, only a launch that runs programs one after another in order, as Triton's interpreter does).
    """
    b = tl.program_id(0)
    j = tl.program_id(1)
    C: tl.constexpr = 2 * HK * DK + HV * DV
    kh = j // (HV // HK)
    rk = tl.arange(0, DK)
    rv = tl.arange(0, DV)
    # Before the wait: what no kernel of this step writes (the state slice, last written by this
    # kernel in the previous step; parameters; the step's slot table). Under PDL these loads
    # overlap the previous kernel (the convolution).
    slot = tl.load(slots + b).to(tl.int64)
    fresh = tl.load(lens + b) == 0
    base = ((layer.to(tl.int64) * num_slots + slot) * HV + j) * (DK * DV)
    a_log_j = tl.load(a_log + j).to(tl.float32)
    dt_j = tl.load(dt_bias + j).to(tl.float32)
    w = tl.load(norm_w + rv).to(tl.float32)
    GATE_ONCE: tl.constexpr = BV == 0 or GATE_BK == 0
    if BV == 0:
        s_ptr = state + base + rk[:, None] * DV + rv[None, :]
        s = tl.load(s_ptr)
    elif PREFETCH:
        s_next = tl.load(state + base + rk[:, None] * DV + tl.arange(0, BV)[None, :])
    if GATE_K > 0:
        if GATE_ONCE:
            rg = tl.arange(0, GATE_KP)
            wa = tl.load(a_in + j * GATE_K + rg, mask=rg < GATE_K, other=0.0)
            wb = tl.load(b_in + j * GATE_K + rg, mask=rg < GATE_K, other=0.0)
    if CONV:  # the taps and the history's 3 rows (zeros for a fresh sequence), their partial sums
        if CLUSTER and PDL:  # (the cluster barrier below waits for the state's loads)
            pdl_trigger_early(PDL)
        cq = kh * DK + rk
        ck = HK * DK + kh * DK + rk
        hist = conv_hist + (layer.to(tl.int64) * conv_slots + slot) * (3 * C)
        hq1, hq2, pq = conv_history(hist, conv_w, cq, fresh, C)
        hk1, hk2, pk = conv_history(hist, conv_w, ck, fresh, C)
        if BV == 0:
            cv = 2 * HK * DK + j * DV + rv
            hv1, hv2, pv = conv_history(hist, conv_w, cv, fresh, C)
        # v's history is this program's own; q / k's is written by the key head's last program once every
        # program of the head has read it (CLUSTER: the cluster's barrier, whose arrival waits for this
        # program's reads through the sum)
        last = j % (HV // HK) == HV // HK - 1
        if CLUSTER:
            last = last & (cluster_wait(cluster_arrive(tl.sum(pq + pk, 0))) != 0x7FC00001)
    if PDL:  # launched with PDL (ninfer_cuda::launch): wait for the previous kernel, let the next one start
        pdl_enter(PDL)
    # After the wait: this step's inputs at once, so their latencies overlap (each reduction below is
    # a block-wide barrier, which no later load would be issued across); all but the gate input `h`,
    # which would cost the one-row form 31 registers a thread (215 -> 246), i.e. its co-residency
    if CONV:  # rows 1, 2 of the history move to 0, 1 first (nothing is written before the wait), so that
        # no history value stays live through the step
        tl.debug_barrier()  # every thread of the program has read the history
        if BV == 0:
            tl.store(hist + cv, hv1)
            tl.store(hist + C + cv, hv2)
        if last:
            tl.store(hist + cq, hq1)
            tl.store(hist + C + cq, hq2)
            tl.store(hist + ck, hk1)
            tl.store(hist + C + ck, hk2)
    row = mixed + b.to(tl.int64) * C
    if CONV:  # (the last tap's weights too: fewer registers live across the wait)
        xqr = tl.load(row + kh * DK + rk)
        xkr = tl.load(row + HK * DK + kh * DK + rk)
        wq3 = tl.load(conv_w + 3 * C + cq).to(tl.float32)
        wk3 = tl.load(conv_w + 3 * C + ck).to(tl.float32)
    else:
        qr = tl.load(row + kh * DK + rk).to(tl.float32)
        kr = tl.load(row + HK * DK + kh * DK + rk).to(tl.float32)
    zf = tl.load(z + (b * HV + j).to(tl.int64) * DV + rv).to(tl.float32)
    if BV == 0:
        if CONV:
            xv = tl.load(row + 2 * HK * DK + j * DV + rv)
            v = conv_silu(pv + tl.load(conv_w + 3 * C + cv).to(tl.float32) * xv.to(tl.float32))
        else:
            v = tl.load(row + 2 * HK * DK + j * DV + rv).to(tl.float32)
    if CONV:
        if BV == 0:
            tl.store(hist + 2 * C + cv, xv)
        if last:
            tl.store(hist + 2 * C + cq, xqr)
            tl.store(hist + 2 * C + ck, xkr)
        qr = conv_silu(pq + wq3 * xqr.to(tl.float32))
        kr = conv_silu(pk + wk3 * xkr.to(tl.float32))
    if GATE_K == 0:
        a_pre = tl.load(a_in + b * HV + j).to(tl.float32)
        b_pre = tl.load(b_in + b * HV + j).to(tl.float32)
    q = qr * tl.math.rsqrt(tl.sum(qr * qr, 0) + L2_EPS) * Q_SCALE
    k = kr * tl.math.rsqrt(tl.sum(kr * kr, 0) + L2_EPS)

    if GATE_K > 0:
        if GATE_ONCE:
            hv = tl.load(h + b.to(tl.int64) * GATE_K + rg, mask=rg < GATE_K, other=0.0).to(tl.float32)
            a_dot = tl.sum(hv * wa.to(tl.float32), 0)
            b_dot = tl.sum(hv * wb.to(tl.float32), 0)
        else:
            acc_a = tl.zeros([GATE_BK], tl.float32)
            acc_b = tl.zeros([GATE_BK], tl.float32)
            for k0 in tl.range(0, GATE_K, GATE_BK):
                rg = k0 + tl.arange(0, GATE_BK)
                hv = tl.load(h + b.to(tl.int64) * GATE_K + rg, mask=rg < GATE_K, other=0.0).to(tl.float32)
                acc_a += hv * tl.load(a_in + j * GATE_K + rg, mask=rg < GATE_K, other=0.0).to(tl.float32)
                acc_b += hv * tl.load(b_in + j * GATE_K + rg, mask=rg < GATE_K, other=0.0).to(tl.float32)
            a_dot = tl.sum(acc_a, 0)
            b_dot = tl.sum(acc_b, 0)
        a_pre = a_dot.to(tl.bfloat16).to(tl.float32)
        b_pre = b_dot.to(tl.bfloat16).to(tl.float32)
    x = a_pre + dt_j
    soft = tl.where(x > SOFTPLUS_T, x, tl.log(1.0 + tl.exp(x)))
    g = -tl.exp(a_log_j) * soft
    beta = (1.0 / (1.0 + tl.exp(-b_pre))).to(tl.bfloat16).to(tl.float32)
    decay = tl.exp(g)
    out_row = out + (b * HV + j).to(tl.int64) * DV

    if BV == 0:
        s = tl.where(fresh, 0.0, s) * decay
        ks = tl.sum(s * k[:, None], 0)
        u = beta * (v - ks)
        s = s + k[:, None] * u[None, :]
        o = tl.sum(s * q[:, None], 0)
        tl.store(s_ptr, s)
        ob = o.to(tl.bfloat16).to(tl.float32)
        sum_sq = tl.sum(ob * ob, 0)
    else:
        sq = tl.zeros([BV], tl.float32)
        for c0 in tl.range(0, DV, BV):
            rc = c0 + tl.arange(0, BV)
            s_ptr = state + base + rk[:, None] * DV + rc[None, :]
            if PREFETCH:
                s = s_next
                rn = rc + BV
                s_next = tl.load(state + base + rk[:, None] * DV + rn[None, :], mask=rn[None, :] < DV, other=0.0)
            else:
                s = tl.load(s_ptr)
            s = tl.where(fresh, 0.0, s) * decay
            if CONV:  # this chunk's v channels: taps, history and input at once
                cc = 2 * HK * DK + j * DV + rc
                xc = tl.load(row + cc)
                hc1, hc2, pc = conv_history(hist, conv_w, cc, fresh, C)
                v = conv_silu(pc + tl.load(conv_w + 3 * C + cc).to(tl.float32) * xc.to(tl.float32))
            else:
                v = tl.load(row + 2 * HK * DK + j * DV + rc).to(tl.float32)
            ks = tl.sum(s * k[:, None], 0)
            u = beta * (v - ks)
            s = s + k[:, None] * u[None, :]
            o = tl.sum(s * q[:, None], 0)
            tl.store(s_ptr, s)
            oc = o.to(tl.bfloat16)
            sq += oc.to(tl.float32) * oc.to(tl.float32)
            tl.store(out_row + rc, oc)
            if CONV:  # every thread has read the chunk's history
                tl.debug_barrier()
                tl.store(hist + cc, hc1)
                tl.store(hist + C + cc, hc2)
                tl.store(hist + 2 * C + cc, xc)
        sum_sq = tl.sum(sq, 0)
        tl.debug_barrier()  # this program's chunks of `out` are written (read back by other threads)
        ob = tl.load(out_row + rv).to(tl.float32)
        tl.debug_barrier()  # and read by every thread before any overwrites them

    inv = tl.math.rsqrt(sum_sq / DV + eps)
    normed = (ob * inv).to(tl.bfloat16).to(tl.float32)
    res = normed * w * zf * (1.0 / (1.0 + tl.exp(-zf)))
    tl.store(out_row + rv, res.to(tl.bfloat16))
    if XQ:  # (a batch of more than 4 rows: the GEMV reads `out`, so nothing is written)
        if tl.num_programs(0) <= 4:
            xq_store(res.to(tl.bfloat16).to(tl.float32), xq, xs, b, j * DV, DV)


@triton.jit
def conv_history(hist, conv_w, ch, fresh, C: tl.constexpr):
    """Channels `ch`' history rows 1 and 2 (bf16, zeros for a fresh sequence) and the sum of the first
    three taps' products in fp32, in ops/conv1d_decode.py's order (the first product is the first sum)."""
    h0 = tl.where(fresh, 0.0, tl.load(hist + ch))
    h1 = tl.where(fresh, 0.0, tl.load(hist + C + ch))
    h2 = tl.where(fresh, 0.0, tl.load(hist + 2 * C + ch))
    p = tl.load(conv_w + ch).to(tl.float32) * h0.to(tl.float32)
    p += tl.load(conv_w + C + ch).to(tl.float32) * h1.to(tl.float32)
    p += tl.load(conv_w + 2 * C + ch).to(tl.float32) * h2.to(tl.float32)
    return h1, h2, p


@triton.jit
def conv_silu(acc):
    """The convolution's output as ops/conv1d_decode.py rounds it: silu in fp32, stored as bf16."""
    return (acc * (1.0 / (1.0 + tl.exp(-acc)))).to(tl.bfloat16).to(tl.float32)


@triton.jit
def cluster_arrive(x):
    """This thread's arrival at its thread block cluster's barrier, with release semantics (its memory
    accesses so far are performed before any thread of the cluster passes the wait); `x`, returned, is
    what the arrival must come after."""
    return tl.inline_asm_elementwise("mov.b32 $0, $1;\nbarrier.cluster.arrive.release;", "=r,r",
                                     [x.to(tl.int32, bitcast=True)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def cluster_wait(token):
    """Wait until every thread of the cluster has arrived (acquire); returns `token`, for what must follow."""
    return tl.inline_asm_elementwise("barrier.cluster.wait.acquire;\nmov.b32 $0, $1;", "=r,r", [token],
                                     dtype=tl.int32, is_pure=False, pack=1)


@dataclass(frozen=True)
class Shape:
    """One launch shape of the kernel: BV (0: the whole slice), warps, GATE_BK, PREFETCH."""

    bv: int
    warps: int
    gate_bk: int
    prefetch: bool


# Launch shapes by the most rows each is used at (None: more). H200, 27B heads (16 / 48, dk = dv = 128,
# gates folded from 5,120), microseconds per launch over 48 layers' state in a CUDA graph
# (tests/gpu/check_gdn_decode.py; docs/kernels/gdn-decode.md): at 1 row the whole slice (6.86; the
# chunked forms 6.82-10.2); at 2-4 rows chunks of 64 with the next chunk and the gate weights loaded
# ahead (7.83 / 10.53 vs 8.50 / 14.77); above, chunks of 64 with nothing ahead, 3 programs per
# multiprocessor (17.60 vs 22.77 at 8 rows).
SHAPES: dict[int | None, Shape] = {1: Shape(0, 8, 0, False), 4: Shape(64, 4, 0, True), None: Shape(64, 4, 1024, False)}


def shape_for(rows: int | None, dv: int) -> Shape:
    """SHAPES' entry for `rows`, its chunk narrowed to DV where DV is smaller (a chunk must divide DV)."""
    shape = SHAPES[rows]
    bv = min(shape.bv, dv)
    if bv and dv % bv:
        return SHAPES[1]
    return Shape(bv, shape.warps, shape.gate_bk, shape.prefetch)


def launch_shapes(dv: int) -> dict[int | None, Shape]:
    """The package's launch shape per batch bound (None: any batch): SHAPES under the kernel feature
    `gdn_step_by_batch`, with one row in the 2-4-row shape under `gdn_step_one_row_chunked`; else the
    whole slice at every batch."""
    if not kernel_feature("gdn_step_by_batch"):
        return {None: shape_for(1, dv)}
    shapes = {rows: shape_for(rows, dv) for rows in SHAPES}
    if kernel_feature("gdn_step_one_row_chunked"):
        shapes[1] = shape_for(4, dv)
    return shapes


def image(hk: int, hv: int, dk: int, dv: int, w_dtype: str, gate_param_dtype: str, arch: str,
          gate_k: int = 0, xq: bool = False, bv: int = 0, num_warps: int = 8,
          gate_bk: int = 1024, prefetch: bool = False, conv_dtype: str | None = None) -> KernelImage:
    """The kernel for one model's head geometry and parameter dtypes (`gate_k`: see GATE_K; `xq`: XQ;
    `bv`: BV, 0 for the whole slice; `gate_bk`: GATE_BK; `prefetch`: PREFETCH; `conv_dtype`: the
    convolution weight's dtype for CONV, launched in clusters (CLUSTER), or None)."""
    wt = {"bfloat16": "bf16", "float32": "fp32", "float16": "fp16"}
    return compile_kernel(
        gdn_decode_kernel,
        signature={"mixed": "*bf16", "a_in": "*bf16", "b_in": "*bf16", "h": "*bf16", "a_log": f"*{wt[gate_param_dtype]}",
                   "dt_bias": f"*{wt[gate_param_dtype]}", "z": "*bf16", "norm_w": f"*{wt[w_dtype]}",
                   "state": "*fp32", "slots": "*i32", "lens": "*i32", "out": "*bf16", "layer": "i32",
                   "num_slots": "i32", "eps": "fp32", "xq": "*i8", "xs": "*fp32",
                   "conv_w": f"*{wt[conv_dtype or 'bfloat16']}", "conv_hist": "*bf16", "conv_slots": "i32"},
        constants={"HK": hk, "HV": hv, "DK": dk, "DV": dv, "Q_SCALE": dk**-0.5, "L2_EPS": L2_EPS,
                   "SOFTPLUS_T": SOFTPLUS_THRESHOLD, "GATE_K": gate_k,
                   "GATE_KP": triton.next_power_of_2(gate_k) if gate_k else 1, "PDL": pdl_mode(), "XQ": xq, "BV": bv,
                   "GATE_BK": gate_bk, "PREFETCH": prefetch, "CONV": conv_dtype is not None,
                   "CLUSTER": conv_dtype is not None},
        arch=arch, num_warps=num_warps, num_stages=1,
    )


LAUNCHER = r"""
#include "ninfer_cuda.h"
namespace {
using tvm::ffi::TensorView;
// In place: `state` and `out` are both written; as call_inplace_packed requires, the function
// returns them (the VM binds its results to what the call returns).
// GATE_K > 0: `a`, `b` are the gate projections [HV, GATE_K] and `h` the layer input [B, 1, GATE_K];
// else `a`, `b` are the gate pre-activations [B, 1, HV] and `h` is not read.
// XQ: `xq` (uint8, HV * DV * 8 + HV * DV / 256 * 64 bytes) also gets `out` as int8 activations (<= 4 rows).
// CONV: `mixed` is the row before the short convolution, applied by the kernel with `conv_w` [4, C], which
// shifts `conv_state` [L, S, 3, C] (bf16, in place); the programs of a key head are one cluster.
@RESULT@ gdn_decode(
    TensorView mixed, TensorView a, TensorView b, TensorView h, TensorView a_log, TensorView dt_bias, TensorView z,
    TensorView norm_w, TensorView slots, TensorView lens, int64_t layer, double eps, @CONV_IN@tvm::ffi::Tensor out,
    @XQ_PARAM@tvm::ffi::Tensor state@CONV_OUT@) {
  const int64_t batch = mixed.shape()[0];
  TVM_FFI_ICHECK(state.ndim() == 5 && state.shape()[2] == @HV@ && state.shape()[3] == @DK@ && state.shape()[4] == @DV@)
      << "ninfer_gdn_decode: state shape";
  TVM_FFI_ICHECK(out.numel() == batch * @HV@ * @DV@ && z.numel() == batch * @HV@ * @DV@) << "ninfer_gdn_decode: shapes";
  const bool gate_weights = @GATE_K@ > 0;
  TVM_FFI_ICHECK(!gate_weights || (a.numel() == @HV@ * @GATE_K@ && b.numel() == @HV@ * @GATE_K@ &&
                                   h.numel() == batch * @GATE_K@))
      << "ninfer_gdn_decode: gate projection shapes";
  TVM_FFI_ICHECK(gate_weights || (a.numel() == batch * @HV@ && b.numel() == batch * @HV@))
      << "ninfer_gdn_decode: gate shapes";
  uint64_t xq_bytes = 0, xs_bytes = 0, conv_w_bytes = 0, conv_bytes = 0;
  int32_t conv_slots = 0;
  @XQ_ADDRESSES@
  @CONV_ADDRESSES@
  uint64_t p[14] = {ninfer_cuda::pointer(mixed, "mixed"), reinterpret_cast<uint64_t>(ninfer_cuda::address(a)),
                    reinterpret_cast<uint64_t>(ninfer_cuda::address(b)), reinterpret_cast<uint64_t>(ninfer_cuda::address(h)),
                    reinterpret_cast<uint64_t>(ninfer_cuda::address(a_log)),
                    reinterpret_cast<uint64_t>(ninfer_cuda::address(dt_bias)), ninfer_cuda::pointer(z, "z"),
                    ninfer_cuda::pointer(norm_w, "norm_w"), ninfer_cuda::pointer(state, "state"),
                    reinterpret_cast<uint64_t>(ninfer_cuda::address(slots)),
                    reinterpret_cast<uint64_t>(ninfer_cuda::address(lens)), ninfer_cuda::pointer(out, "out"),
                    xq_bytes, xs_bytes};
  int32_t layer32 = static_cast<int32_t>(layer), num_slots = static_cast<int32_t>(state.shape()[1]);
  float eps32 = static_cast<float>(eps);
  // the launch shape measured fastest at this many rows (ops/gdn_decode_fused.py SHAPES)
  const char* kernel = @KERNEL_CHOICE@;
  ninfer_cuda::launch(kernel, static_cast<unsigned>(batch), @HV@, 1,
                      {&p[0], &p[1], &p[2], &p[3], &p[4], &p[5], &p[6], &p[7], &p[8], &p[9], &p[10], &p[11],
                       &layer32, &num_slots, &eps32, &p[12], &p[13], &conv_w_bytes, &conv_bytes, &conv_slots},
                      mixed.device().device_id, /*pdl=*/true, /*cluster_y=*/@CLUSTER_Y@);
  return @RESULT@(@RETURNED@);
}
}  // namespace
TVM_FFI_DLL_EXPORT_TYPED_FUNC(@SYMBOL@, gdn_decode);
"""


def kernel_choice(kernels: dict[str, int | None]) -> str:
    """C++ choosing a kernel key by `batch`: `kernels` maps each key to the most rows it takes (None:
    any number; last)."""
    expr = ""
    for key, rows in kernels.items():
        expr += f'"{key}"' if rows is None else f'batch <= {rows} ? "{key}" : '
    return expr


def launcher_values(hv: int, dk: int, dv: int, gate_k: int, kernels: dict[str, int | None], symbol: str,
                    xq: bool, conv_channels: int = 0, cluster: int = 1) -> dict:
    """LAUNCHER's placeholders for the kernel images `kernels` (key: the most rows it is launched at, see
    `kernel_choice`; `xq`: the form that also writes int8 activations; `conv_channels`: C of the form that
    applies the convolution (0: none), launched in clusters of `cluster` programs along the heads)."""
    width = hv * dv
    tensors = 2 + xq + (conv_channels > 0)
    addresses = ("TVM_FFI_ICHECK(xq.numel() == " + str(width * 8 + width // 256 * 64) + " && xq.dtype().bits == 8) "
                 '<< "ninfer_gdn_decode: xq size";\n  xq_bytes = ninfer_cuda::pointer(xq, "xq"); '
                 f"xs_bytes = xq_bytes + {width * 8};") if xq else ""
    conv = (f"TVM_FFI_ICHECK(conv_state.ndim() == 4 && conv_state.shape()[2] == 3 && conv_state.shape()[3] == {conv_channels}"
            f" && conv_w.ndim() == 2 && conv_w.shape()[0] == 4 && conv_w.shape()[1] == {conv_channels} && "
            f"mixed.numel() == batch * {conv_channels} && conv_state.dtype().bits == 16)"
            ' << "ninfer_gdn_decode: convolution shapes";\n'
            '  TVM_FFI_ICHECK(layer >= 0 && layer < conv_state.shape()[0]) << "ninfer_gdn_decode: convolution layer";\n'
            '  conv_w_bytes = ninfer_cuda::pointer(conv_w, "conv_w"); conv_bytes = ninfer_cuda::pointer(conv_state, '
            '"conv_state");\n  conv_slots = static_cast<int32_t>(conv_state.shape()[1]);') if conv_channels else ""
    returned = "out, " + ("xq, " if xq else "") + "state" + (", conv_state" if conv_channels else "")
    return {"HV": hv, "DK": dk, "DV": dv, "GATE_K": gate_k, "KERNEL_CHOICE": kernel_choice(kernels), "SYMBOL": symbol,
            "RESULT": "tvm::ffi::Tuple<" + ", ".join(["tvm::ffi::Tensor"] * tensors) + ">",
            "XQ_PARAM": "tvm::ffi::Tensor xq, " if xq else "", "XQ_ADDRESSES": addresses, "RETURNED": returned,
            "CONV_IN": "TensorView conv_w, " if conv_channels else "",
            "CONV_OUT": ", tvm::ffi::Tensor conv_state" if conv_channels else "", "CONV_ADDRESSES": conv,
            "CLUSTER_Y": cluster}


def xq_supported(hv: int, dv: int) -> bool:
    """Whether the step can also write its output as the decode GEMVs' int8 activations: whole groups
    of 64 per head and a width the int8 stages take (a multiple of 256)."""
    return dv % 64 == 0 and (hv * dv) % 256 == 0


def supported(mixed: nn.Tensor, gdn_state: nn.Tensor, dk: int, dv: int) -> bool:
    """Tuned CUDA kernels on, one token per sequence (static), bf16 activations, dims the kernel tiles."""
    if not tuned_cuda_kernels():
        return False
    t = mixed.shape[1]
    pow2 = dk & (dk - 1) == 0 and dv & (dv - 1) == 0
    return (isinstance(t, int) and t == 1 and str(mixed.dtype) == "bfloat16"
            and str(gdn_state.dtype) == "float32" and pow2 and 16 <= dk <= 256 and 16 <= dv <= 256)


def gates_foldable(h: nn.Tensor, a_weight: nn.Tensor | None, b_weight: nn.Tensor | None, hv: int) -> bool:
    """Whether the kernel can compute the gate projections itself: both dense bf16 `[Hv, K]` weights
    (None: not dense) over a bf16 layer input `[B, 1, K]` with a static K."""
    k = h.shape[-1]
    return (a_weight is not None and b_weight is not None and isinstance(k, int) and str(h.dtype) == "bfloat16"
            and all(str(w.dtype) == "bfloat16" and tuple(w.shape) == (hv, k) for w in (a_weight, b_weight)))


def conv_supported(conv_weight: nn.Tensor, conv_state: nn.Tensor, hk: int, hv: int) -> bool:
    """Whether the step can apply the short convolution itself (kernel feature `gdn_step_conv`): 4 taps,
    a bf16 history, and a key head's programs few enough for one thread block cluster (<= 8)."""
    if not kernel_feature("gdn_step_conv"):
        return False
    taps = conv_weight.shape[0]
    return (isinstance(taps, int) and taps == 4 and str(conv_state.dtype) == "bfloat16"
            and str(conv_weight.dtype) in ("bfloat16", "float32", "float16") and hv % hk == 0 and hv // hk <= 8)


def gdn_decode_fused(
    mixed: nn.Tensor, a: nn.Tensor, b: nn.Tensor, a_log: nn.Tensor, dt_bias: nn.Tensor, z: nn.Tensor,
    norm_w: nn.Tensor, gdn_state: nn.Tensor, slot_ids: nn.Tensor, seq_lens: nn.Tensor, layer: int,
    eps: float, hk: int, hv: int, dk: int, dv: int, h: nn.Tensor | None = None, with_xq: bool = False,
    conv: tuple[nn.Tensor, nn.Tensor] | None = None,
) -> tuple[nn.Tensor, ...]:
    """`(out [B, 1, Hv*dv] bf16, gdn_state)` for post-conv `mixed [B, 1, 2*Hk*dk + Hv*dv]`;
    `with_xq` (`xq_supported`): `(out, its int8 activations (uint8, written at <= 4 rows), gdn_state)`.
    `conv` (`conv_supported`): `(convolution weight [4, C], conv_state)`; `mixed` is then the row before
    the convolution, which the step applies, and the updated conv_state is returned last.

    `a`, `b`: the gate pre-activations `[B, 1, Hv]`, or with `h` (the layer input `[B, 1, K]`, see
    `gates_foldable`) the gate projections' weights `[Hv, K]`."""
    if with_xq and not xq_supported(hv, dv):
        raise ValueError(f"gdn_decode_fused: int8 activations need dv % 64 == 0 and Hv*dv % 256 == 0, got {hv}x{dv}")
    if conv is not None and not (hv % hk == 0 and hv // hk <= 8 and conv[0].shape[0] == 4):
        raise ValueError(f"gdn_decode_fused: the convolution needs 4 taps and Hv / Hk <= 8, got {hk} / {hv}")
    arch = current_arch()
    gate_k = 0 if h is None else int(h.shape[-1])
    by_rows = kernel_feature("gdn_step_by_batch")
    conv_dtype = None if conv is None else str(conv[0].dtype)
    images = {}
    for rows, sh in launch_shapes(dv).items():
        images[f"gdn_decode_{rows or 'any'}"] = (rows, image(
            hk, hv, dk, dv, str(norm_w.dtype), str(a_log.dtype), arch, gate_k, with_xq, sh.bv, sh.warps,
            gate_bk=sh.gate_bk, prefetch=sh.prefetch, conv_dtype=conv_dtype))
    tag = ((f"_g{gate_k}" if gate_k else "") + ("_xq" if with_xq else "") + ("" if by_rows else "_one")
           + ("" if conv is None else f"_conv{dtype_tag(conv_dtype)}"))
    key = f"gdn_decode_{hk}_{hv}_{dk}_{dv}_{norm_w.dtype}_{a_log.dtype}_g{gate_k}" + tag
    symbol = f"{SYMBOL}_{hk}_{hv}_{dk}_{dv}{tag}"
    channels = 2 * hk * dk + hv * dv
    launcher = fill_launcher(LAUNCHER, launcher_values(
        hv, dk, dv, gate_k, {name: rows for name, (rows, _) in images.items()}, symbol, with_xq,
        conv_channels=0 if conv is None else channels, cluster=1 if conv is None else hv // hk))
    # registers the launcher library with the export (the call itself is emitted below)
    extern(key, {symbol: lambda *args: args[-1]}, launcher, {name: img for name, (_, img) in images.items()})
    out = op.empty([mixed.shape[0], 1, hv * dv], "bfloat16", name="gdn_decode_out")
    mutated = [out, gdn_state]
    if with_xq:
        width = hv * dv
        mutated.insert(1, op.empty([width * 8 + width // 256 * 64], "uint8", name="gdn_decode_xq"))
    inputs = [mixed, a, b, a if h is None else h, a_log, dt_bias, z, norm_w, slot_ids, seq_lens, layer, eps]
    if conv is not None:
        inputs.append(conv[0])
        mutated.append(conv[1])
    result = inplace_call(symbol, inputs, mutated)
    return tuple(result[i] for i in range(len(mutated)))
