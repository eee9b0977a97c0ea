"""Chunked gated delta rule (GDN prefill) on CUDA targets: two Triton kernels, compiled AOT.

Why: the TIR chunked kernel (`gated_delta_rule_gpu`) runs one block per value head with SIMT
fp32 and walks every chunk's forward substitution serially; on the H200 it takes ~10 ms per
layer for 1,024 tokens. Here the work splits by what depends on the recurrent state:

* `prep_kernel`, one program per (chunk of 64 tokens, value head, sequence), all in parallel:
  cumulative log decay `gam`, `A = strictly_lower(beta K K^T * exp(gam_i - gam_j))`, its unit
  lower-triangular inverse `Tm = (I + A)^-1` (forward substitution on the 64 x 64 tile in
  registers), then `W = Tm (beta exp(gam) K)`, `U = Tm (beta V)` and the decayed causal score
  matrix `QK = (Q K^T) * exp(gam_i - gam_j)` (j <= i), written to an fp32 workspace row per
  (token, head): `[W (dk) | U (dv) | QK (64)]`;
* `state_kernel`, one program per (value-column slice of `BV`, value head, sequence): the state
  slice `S [dk, BV]` stays in registers while the chunks are walked in order,
  `V' = U - W S`, `O = exp(gam) Q S + QK V'`, `S <- exp(gam_last) S + (exp(gam_last - gam) K)^T V'`.
  Value columns of the state are independent, so slicing dv multiplies the parallelism of the
  only serial part.

The math, chunk boundaries (chunks start at each call's first token), in-place state update and
`seq_lens == 0` reset are those of `gated_delta_rule.gdn_chunked_func`. Matrix products use
`tl.dot` with `input_precision` `PRECISION` (fp32 operands; tf32x3 keeps fp32-level accuracy on
tensor cores, see docs/kernels/gdn-chunked.md).
"""

from __future__ import annotations

import triton
import triton.language as tl

CHUNK = 64
ARCHS = ("sm_90a", "sm_120a", "sm_121a")
PREP_SYMBOL = "ninfer_gdn_chunked_prep"
STATE_SYMBOL = "ninfer_gdn_chunked_state"
# (BV, num_warps of the state kernel, num_warps of the prep kernel, input precision of tl.dot)
CONFIG = (32, 4, 4, "tf32x3")


@triton.jit
def prep_kernel(
    q_ptr,  # [B, T, HK, DK] fp32
    k_ptr,  # [B, T, HK, DK] fp32
    v_ptr,  # [B, T, HV, DV] fp32
    g_ptr,  # [B, T, HV] fp32
    beta_ptr,  # [B, T, HV] fp32
    ws_ptr,  # [B, T, HV, DK + DV + BT] fp32
    n_tok,  # T
    HK: tl.constexpr,
    HV: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BT: tl.constexpr,
    PRECISION: tl.constexpr,
):
    c = tl.program_id(0)
    hv = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    kh = hv // (HV // HK)
    rows = tl.arange(0, BT)
    tok = c * BT + rows
    valid = tok < n_tok
    tok64 = b * n_tok + tok  # token index over [B * T]
    gv = tl.load(g_ptr + tok64 * HV + hv, mask=valid, other=0.0)
    bv = tl.load(beta_ptr + tok64 * HV + hv, mask=valid, other=0.0)
    gam = tl.cumsum(gv, 0)
    ek = tl.arange(0, DK)
    ed = tl.arange(0, DV)
    kq_off = (tok64 * HK + kh)[:, None] * DK + ek[None, :]
    ws_row = (tok64 * HV + hv) * (DK + DV + BT)
    kk = tl.load(k_ptr + kq_off, mask=valid[:, None], other=0.0).to(tl.float32)
    # at[j, i] = A[i, j] = beta_i (k_i . k_j) exp(gam_i - gam_j) for j < i: rows of A as columns,
    # so forward substitution reads row i of A as a vector along dim 0 without a layout change.
    at = tl.dot(kk, tl.trans(kk * bv[:, None]), input_precision=PRECISION)
    upper = rows[:, None] < rows[None, :]
    at = tl.where(upper, at * tl.exp(tl.where(upper, gam[None, :] - gam[:, None], 0.0)), 0.0)
    qq = tl.load(q_ptr + kq_off, mask=valid[:, None], other=0.0).to(tl.float32)
    qk = tl.dot(qq, tl.trans(kk), input_precision=PRECISION)
    causal = rows[:, None] >= rows[None, :]
    qk = tl.where(causal, qk * tl.exp(tl.where(causal, gam[:, None] - gam[None, :], 0.0)), 0.0)
    tl.store(ws_ptr + ws_row[:, None] + DK + DV + rows[None, :], qk, mask=valid[:, None])
    # Tm = (I + A)^-1: row i = e_i - sum_{j<i} A[i, j] Tm[j, :], rows j < i already final.
    # K is loaded again afterwards rather than kept live through the 64 steps (registers).
    tm = tl.zeros([BT, BT], dtype=tl.float32)
    for i in range(BT):
        ai = tl.sum(tl.where(rows[None, :] == i, at, 0.0), 1)
        ri = -tl.sum(ai[:, None] * tm, 0)
        ri = tl.where(rows == i, 1.0, ri)
        tm = tl.where(rows[:, None] == i, ri[None, :], tm)
    kk = tl.load(k_ptr + kq_off, mask=valid[:, None], other=0.0).to(tl.float32)
    w = tl.dot(tm, kk * (bv * tl.exp(gam))[:, None], input_precision=PRECISION)
    tl.store(ws_ptr + ws_row[:, None] + ek[None, :], w, mask=valid[:, None])
    vv = tl.load(v_ptr + (tok64 * HV + hv)[:, None] * DV + ed[None, :], mask=valid[:, None],
                 other=0.0).to(tl.float32)
    u = tl.dot(tm, vv * bv[:, None], input_precision=PRECISION)
    tl.store(ws_ptr + ws_row[:, None] + DK + ed[None, :], u, mask=valid[:, None])


@triton.jit
def state_kernel(
    q_ptr,  # [B, T, HK, DK] fp32
    k_ptr,  # [B, T, HK, DK] fp32
    g_ptr,  # [B, T, HV] fp32
    ws_ptr,  # [B, T, HV, DK + DV + BT] fp32, from prep_kernel
    state_ptr,  # [L, NS, HV, DK, DV] fp32, updated in place
    slots_ptr,  # [B] int32
    lens_ptr,  # [B] int32
    o_ptr,  # [B, T, HV, DV]
    n_tok,  # T
    n_slots,  # NS
    layer,
    HK: tl.constexpr,
    HV: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BT: tl.constexpr,
    BV: tl.constexpr,
    PRECISION: tl.constexpr,
):
    vs = tl.program_id(0)
    hv = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    kh = hv // (HV // HK)
    slot = tl.load(slots_ptr + b).to(tl.int64)
    fresh = tl.load(lens_ptr + b) == 0
    rows = tl.arange(0, BT)
    ek = tl.arange(0, DK)
    ev = vs * BV + tl.arange(0, BV)
    head = (slot + layer * n_slots) * HV + hv  # slot is int64, so the offsets are too
    s_off = (head * DK + ek[:, None]) * DV + ev[None, :]
    s = tl.load(state_ptr + s_off)
    s = tl.where(fresh, 0.0, s)
    for c in range(0, tl.cdiv(n_tok, BT)):
        tok = c * BT + rows
        valid = tok < n_tok
        tok64 = b * n_tok + tok
        gv = tl.load(g_ptr + tok64 * HV + hv, mask=valid, other=0.0)
        gam = tl.cumsum(gv, 0)
        glast = tl.sum(gv, 0)  # gam of the chunk's last valid token (padding adds 0)
        ws_row = (tok64 * HV + hv) * (DK + DV + BT)
        w = tl.load(ws_ptr + ws_row[:, None] + ek[None, :], mask=valid[:, None], other=0.0)
        u = tl.load(ws_ptr + ws_row[:, None] + DK + ev[None, :], mask=valid[:, None], other=0.0)
        vp = u - tl.dot(w, s, input_precision=PRECISION)
        kq_off = (tok64 * HK + kh)[:, None] * DK + ek[None, :]
        qq = tl.load(q_ptr + kq_off, mask=valid[:, None], other=0.0).to(tl.float32)
        qk = tl.load(ws_ptr + ws_row[:, None] + DK + DV + rows[None, :], mask=valid[:, None], other=0.0)
        out = tl.dot(qq, s, input_precision=PRECISION) * tl.exp(gam)[:, None]
        out = tl.dot(qk, vp, acc=out, input_precision=PRECISION)
        tl.store(o_ptr + (tok64 * HV + hv)[:, None] * DV + ev[None, :],
                 out.to(o_ptr.dtype.element_ty), mask=valid[:, None])
        kk = tl.load(k_ptr + kq_off, mask=valid[:, None], other=0.0).to(tl.float32)
        kd = kk * tl.exp(glast - gam)[:, None]
        s = tl.dot(tl.trans(kd), vp, acc=s * tl.exp(glast), input_precision=PRECISION)
    tl.store(state_ptr + s_off, s)


def workspace_width(dk: int, dv: int) -> int:
    """fp32 values per (token, value head) in the workspace: W, U and the chunk's QK row."""
    return dk + dv + CHUNK


def check_shapes(hk: int, hv: int, dk: int, dv: int, bv: int) -> None:
    """Raise ValueError for head shapes the kernels do not handle."""
    if hv % hk:
        raise ValueError(f"value heads {hv} are not a multiple of key heads {hk}")
    for name, dim in (("dk", dk), ("dv", dv)):
        if dim < 16 or dim > 256 or dim & (dim - 1):
            raise ValueError(f"{name} = {dim}: the kernels need a power of two in 16..256")
    if dv % bv:
        raise ValueError(f"dv = {dv} is not a multiple of the column slice {bv}")


def run_torch(q, k, v, g, beta, state, slot_ids, seq_lens, layer: int, *, out=None, workspace=None,
              config: tuple[int, int, int, str] | None = None, prep=None, step=None):
    """Launch both kernels on torch tensors (GPU checks; CPU tests pass interpreted kernels).

    Updates `state` in place and returns `o`; `config` overrides `CONFIG`. One stage, as the AOT
    images: software pipelining of the chunk loop would need ~280 KB of shared memory.
    """
    import torch

    bsz, n_tok, hk, dk = q.shape
    hv, dv = v.shape[2], v.shape[3]
    bv, warps, prep_warps, precision = config or CONFIG
    bv = min(bv, dv)
    check_shapes(hk, hv, dk, dv, bv)
    o = torch.empty_like(v) if out is None else out
    ws = workspace
    if ws is None:
        ws = torch.empty((bsz, n_tok, hv, workspace_width(dk, dv)), dtype=torch.float32, device=v.device)
    if n_tok == 0 or bsz == 0:
        return o
    (prep or prep_kernel)[(triton.cdiv(n_tok, CHUNK), hv, bsz)](
        q, k, v, g, beta, ws, n_tok, HK=hk, HV=hv, DK=dk, DV=dv, BT=CHUNK, PRECISION=precision,
        num_warps=prep_warps, num_stages=1)
    (step or state_kernel)[(dv // bv, hv, bsz)](
        q, k, g, ws, state, slot_ids, seq_lens, o, n_tok, state.shape[1], layer,
        HK=hk, HV=hv, DK=dk, DV=dv, BT=CHUNK, BV=bv, PRECISION=precision, num_warps=warps, num_stages=1)
    return o


HOST_SOURCE = r"""
#include "ninfer_cuda.h"
#include <tvm/ffi/container/tuple.h>
namespace {
constexpr int kHK = @HK@, kHV = @HV@, kDK = @DK@, kDV = @DV@, kBV = @BV@, kChunk = @BT@;

// ws [B, T, HV, DK + DV + BT] <- per-chunk W, U and decayed QK (all chunks in parallel).
void prep(tvm::ffi::TensorView q, tvm::ffi::TensorView k, tvm::ffi::TensorView v, tvm::ffi::TensorView g,
          tvm::ffi::TensorView beta, tvm::ffi::TensorView ws) {
  TVM_FFI_ICHECK(q.ndim() == 4 && q.size(2) == kHK && q.size(3) == kDK && v.size(2) == kHV && v.size(3) == kDV)
      << "gdn_chunked: unexpected q/v shape";
  uint64_t qp = ninfer_cuda::pointer(q, "q"), kp = ninfer_cuda::pointer(k, "k"), vp = ninfer_cuda::pointer(v, "v");
  uint64_t gp = ninfer_cuda::pointer(g, "g"), bp = ninfer_cuda::pointer(beta, "beta");
  uint64_t wp = ninfer_cuda::pointer(ws, "workspace");
  int32_t n = static_cast<int32_t>(q.size(1));
  unsigned b = static_cast<unsigned>(q.size(0));
  ninfer_cuda::launch("@PREP@", (n + kChunk - 1) / kChunk, kHV, b, {&qp, &kp, &vp, &gp, &bp, &wp, &n},
                      q.device().device_id);
}

// Walks the chunks in order per (column slice, head, sequence); writes o and state in place.
tvm::ffi::Tuple<tvm::ffi::Tensor, tvm::ffi::Tensor> step(
    tvm::ffi::TensorView q, tvm::ffi::TensorView k, tvm::ffi::TensorView g, tvm::ffi::TensorView ws,
    tvm::ffi::TensorView slots, tvm::ffi::TensorView lens, int64_t layer, tvm::ffi::Tensor o,
    tvm::ffi::Tensor state) {
  TVM_FFI_ICHECK(state.ndim() == 5 && state.size(2) == kHV && state.size(3) == kDK && state.size(4) == kDV)
      << "gdn_chunked: unexpected state shape";
  TVM_FFI_ICHECK(layer >= 0 && layer < state.size(0)) << "gdn_chunked: layer " << layer << " out of range";
  uint64_t qp = ninfer_cuda::pointer(q, "q"), kp = ninfer_cuda::pointer(k, "k"), gp = ninfer_cuda::pointer(g, "g");
  uint64_t wp = ninfer_cuda::pointer(ws, "workspace"), sp = ninfer_cuda::pointer(state, "state");
  uint64_t slp = ninfer_cuda::pointer(slots, "slot_ids"), lp = ninfer_cuda::pointer(lens, "seq_lens");
  uint64_t op = ninfer_cuda::pointer(o, "o");
  int32_t n = static_cast<int32_t>(q.size(1));
  int32_t num_slots = static_cast<int32_t>(state.size(1));
  int32_t lay = static_cast<int32_t>(layer);
  unsigned b = static_cast<unsigned>(q.size(0));
  if (n > 0)
    ninfer_cuda::launch("@STATE@", kDV / kBV, kHV, b, {&qp, &kp, &gp, &wp, &sp, &slp, &lp, &op, &n, &num_slots, &lay},
                        q.device().device_id);
  return tvm::ffi::Tuple<tvm::ffi::Tensor, tvm::ffi::Tensor>(o, state);
}
}  // namespace
TVM_FFI_DLL_EXPORT_TYPED_FUNC(@PREP_SYMBOL@, prep);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(@STATE_SYMBOL@, step);
"""

_TRITON_DTYPE = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def images(arch: str, hk: int, hv: int, dk: int, dv: int, dtype: str,
           config: tuple[int, int, int, str] | None = None):
    """The (prep, state) kernel images for one head shape, input dtype and arch."""
    from .triton_aot import compile_kernel

    bv, warps, prep_warps, precision = config or CONFIG
    bv = min(bv, dv)
    check_shapes(hk, hv, dk, dv, bv)
    x = f"*{_TRITON_DTYPE[dtype]}"
    heads = {"HK": hk, "HV": hv, "DK": dk, "DV": dv, "BT": CHUNK, "PRECISION": precision}
    prep = compile_kernel(
        prep_kernel, arch=arch, num_warps=prep_warps, num_stages=1,
        signature={"q_ptr": x, "k_ptr": x, "v_ptr": x, "g_ptr": "*fp32", "beta_ptr": "*fp32",
                   "ws_ptr": "*fp32", "n_tok": "i32"},
        constants=heads)
    step = compile_kernel(
        state_kernel, arch=arch, num_warps=warps, num_stages=1,
        signature={"q_ptr": x, "k_ptr": x, "g_ptr": "*fp32", "ws_ptr": "*fp32", "state_ptr": "*fp32",
                   "slots_ptr": "*i32", "lens_ptr": "*i32", "o_ptr": x, "n_tok": "i32",
                   "n_slots": "i32", "layer": "i32"},
        constants={**heads, "BV": bv})
    return prep, step


def host_source(tag: str, hk: int, hv: int, dk: int, dv: int, prep_name: str, state_name: str,
                config: tuple[int, int, int, str] | None = None) -> str:
    """The launcher C++ for one head shape (exported symbols carry `tag`)."""
    bv = min((config or CONFIG)[0], dv)
    fields = {"@HK@": str(hk), "@HV@": str(hv), "@DK@": str(dk), "@DV@": str(dv), "@BV@": str(bv),
              "@BT@": str(CHUNK), "@PREP@": prep_name, "@STATE@": state_name,
              "@PREP_SYMBOL@": f"{PREP_SYMBOL}_{tag}", "@STATE_SYMBOL@": f"{STATE_SYMBOL}_{tag}"}
    from .cuda_extern import fill_launcher

    return fill_launcher(HOST_SOURCE, fields)


def supported(q, k, v, g, beta, state) -> bool:
    """A CUDA target we build for, static head shapes the kernels handle, fp32 inputs and state."""
    import tvm

    target = tvm.target.Target.current(allow_none=True)
    if target is None or target.kind.name != "cuda" or str(target.arch) not in ARCHS:
        return False
    if len(q.shape) != 4 or len(v.shape) != 4 or len(state.shape) != 5:
        return False
    dims = (q.shape[2], q.shape[3], v.shape[2], v.shape[3])
    if not all(isinstance(x, int) for x in dims):
        return False
    # fp32 is what the GDN layer passes (and what the tests check); the kernels also build for bf16
    if any(str(x.dtype) != "float32" for x in (q, k, v, g, beta, state)):
        return False
    hk, dk, hv, dv = dims
    try:
        check_shapes(hk, hv, dk, dv, min(CONFIG[0], dv))
    except ValueError:
        return False
    return True


def gdn_chunked(q, k, v, g, beta, state, slot_ids, seq_lens, layer: int):
    """`gated_delta_rule(..., chunked=True)` through the Triton kernels: `(o [B, T, Hv, dv], state)`.

    The state is updated in place (`call_inplace_packed`: the returned state aliases the input).
    """
    from tvm.relax.frontend import nn
    from tvm.relax.frontend.nn import op

    from .cuda_extern import current_arch, extern, inplace_call

    hk, dk = int(q.shape[2]), int(q.shape[3])
    hv, dv = int(v.shape[2]), int(v.shape[3])
    dtype = str(v.dtype)
    arch = current_arch()
    prep, step = images(arch, hk, hv, dk, dv, dtype)
    tag = f"hk{hk}_hv{hv}_dk{dk}_dv{dv}_{_TRITON_DTYPE[dtype]}"
    prep_symbol, state_symbol = f"{PREP_SYMBOL}_{tag}", f"{STATE_SYMBOL}_{tag}"

    def infer_ws(q, k, v, g, beta):
        return nn.Tensor.placeholder([q.shape[0], q.shape[1], hv, workspace_width(dk, dv)], "float32")

    def infer_o(q, k, g, ws, slots, lens, layer, o, state):
        return nn.Tensor.placeholder(o.shape, o.dtype)

    module = extern(f"gdn_chunked_{arch}_{tag}", {prep_symbol: infer_ws, state_symbol: infer_o},
                    host_source(tag, hk, hv, dk, dv, prep.name, step.name), [prep, step])
    ws = module[prep_symbol](q, k, v, g, beta)
    o = op.empty(v.shape, dtype, name="gdn_o")
    return inplace_call(state_symbol, [q, k, g, ws, slot_ids, seq_lens, int(layer)], [o, state])
