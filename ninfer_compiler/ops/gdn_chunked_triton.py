"""Chunked gated delta rule (GDN prefill) on CUDA targets: two Triton kernels, compiled AOT.

Why this form: per chunk of 64 tokens with cumulative log decay `gam`, the UT transform gives
`V' = Tm (beta (V - exp(gam) K S))` with `Tm = (I + A)^-1`,
`A = strictly_lower(beta K K^T * exp(gam_i - gam_j))`. `Tm` and the decayed causal scores
`QK = (Q K^T) * exp(gam_i - gam_j)` (j <= i) depend only on the chunk's own q, k, g, beta, so they
are computed for all chunks at once; the walk over chunks only multiplies with them. The work:

* `prep_kernel`, one program per (chunk, value head, sequence), all in parallel: `K K^T` and
  `Q K^T` on tensor cores; the 16 x 16 diagonal blocks of `A` inverted by forward substitution in
  fp32 (15 steps, the four blocks at once); then with `N = Dinv L` (L: the strictly block-lower part
  of A, N^4 = 0) `Tm = (I - N)(I + N^2) Dinv` by four 64 x 64 products. `Tm` and `QK` go to a
  workspace (fp16), and with fp32 q/k inputs also fp16 copies of q and k for the walk.
* `walk_kernel`, one program per (value-column slice of `BV`, value head, sequence): the state
  slice `S [dk, BV]` stays in fp32 registers while the chunks are walked in order:
  `R = beta (V - exp(gam) (K S))`, `V' = Tm R`, `O = exp(gam) (Q S) + QK V'`,
  `S <- exp(gam_last) S + K^T (exp(gam_last - gam) V')`. Per chunk only three products are on the
  dependency chain (`K S`, `Tm R`, `K^T V'`); value columns of the state are independent, so the
  column slices multiply the parallelism of this serial part.

Matrix products take fp16 operands with fp32 accumulation (`F32=False`; the state, decays and
sums stay fp32): on the H200 the error against a float64 recurrence is 5-7e-4 of the output's
range (T = 1,024 to 8,192), under the bf16 rounding the output gets next (docs/kernels/gdn-chunked.md). fp16 assumes the values and
state stay under 65,504 in magnitude (q, k are unit vectors, decays and beta at most 1). `F32=True`
keeps fp32 operands (tf32x3 on tensor cores) and an fp32 workspace, for checks; the products'
`input_precision="tf32x3"` only has an effect there (it applies to fp32 operands).

The math, chunk boundaries (chunks start at each call's first token), in-place state update and
`seq_lens == 0` reset are those of `gated_delta_rule.gdn_chunked_func`.
"""

from __future__ import annotations

from typing import NamedTuple

import triton
import triton.language as tl

CHUNK = 64
BLOCK = 16  # diagonal blocks of the triangular inverse
ARCHS = ("sm_90a", "sm_120a", "sm_121a")
PREP_SYMBOL = "ninfer_gdn_chunked_prep"
STATE_SYMBOL = "ninfer_gdn_chunked_state"
QK_DTYPES = ("float32", "float16", "bfloat16")  # q, k: 16-bit ones are read in place by the walk
V_DTYPES = ("float32", "bfloat16", "float16")  # v and o


class Config(NamedTuple):
    """Launch shape: value-column slice, walk warps and pipeline stages, prep warps, fp32 operands."""

    bv: int = 32
    warps: int = 4
    stages: int = 2
    prep_warps: int = 4
    f32: bool = False


# Launch shapes, measured on the H200 (docs/kernels/gdn-chunked.md): with fp32 v the pipelined walk
# over 64 columns is fastest (0.70 ms per layer at 7,680 tokens); with 16-bit v a 32-column
# pipelined walk fits two blocks per SM (115 KB of shared memory each) and wins (0.55 ms). sm_12x
# has ~99 KB of shared memory per block: one stage, and 16-column slices keep the walk free of
# spills there (not measured).
SM90_F32_V = Config(bv=64, warps=4, stages=2, prep_warps=4)
SM90_16BIT_V = Config(bv=32, warps=4, stages=2, prep_warps=4)
SM12X = Config(bv=16, warps=4, stages=1, prep_warps=4)


def config_for(arch: str, v_dtype: str) -> Config:
    """The shipped launch shape for an arch and the dtype of v (and o)."""
    if arch not in ARCHS:
        raise ValueError(f"gdn_chunked: no kernels for {arch}")
    if arch == "sm_90a":
        return SM90_F32_V if v_dtype == "float32" else SM90_16BIT_V
    return SM12X


@triton.jit
def prep_kernel(
    q_ptr,  # [B, T, HK, DK]
    k_ptr,  # [B, T, HK, DK]
    g_ptr,  # [B, T, HV] fp32
    beta_ptr,  # [B, T, HV] fp32
    ws_ptr,  # [B, T, WS] fp16 (fp32 with F32), per token: Tm rows | QK rows | gam | (q | k copies)
    n_tok,  # T
    HK: tl.constexpr,
    HV: tl.constexpr,
    DK: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
    BK: tl.constexpr,
    COPY_QK: tl.constexpr,
    F32: tl.constexpr,
):
    c = tl.program_id(0)
    hv = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    kh = hv // (HV // HK)
    E: tl.constexpr = 1 if F32 else 2  # workspace values per fp32
    GAM: tl.constexpr = 2 * HV * BT  # where the fp32 gam of the heads start (16-byte aligned)
    COPY: tl.constexpr = GAM + ((HV * E + 7) // 8) * 8
    WS: tl.constexpr = COPY + (2 * HK * DK if COPY_QK else 0)
    rows = tl.arange(0, BT)
    cols = tl.arange(0, BT)
    tok = c * BT + rows
    valid = tok < n_tok
    # scalar int64 bases of the chunk's first token, int32 offsets inside the tiles (registers)
    t0 = b * n_tok + c * BT  # token index over [B * T]
    gv = tl.load(g_ptr + t0 * HV + hv + rows * HV, mask=valid, other=0.0)
    bv = tl.load(beta_ptr + t0 * HV + hv + rows * HV, mask=valid, other=0.0)
    gam = tl.cumsum(gv, 0)
    OP: tl.constexpr = tl.float32 if F32 else tl.float16  # matrix-product operands
    wsb = ws_ptr + t0 * WS
    gam_ptr = ws_ptr.to(tl.pointer_type(tl.float32), bitcast=True) + (t0 * WS + GAM) // E + hv
    tl.store(gam_ptr + rows * (WS // E), gam, mask=valid)
    kqb = t0 * HK * DK + kh * DK
    # K K^T and Q K^T over slices of dk (the fp32 tiles of q and k are not all live at once)
    kkt = tl.zeros((BT, BT), tl.float32)
    qkt = tl.zeros((BT, BT), tl.float32)
    for d0 in range(0, DK, BK):
        ek = d0 + tl.arange(0, BK)
        kq_off = rows[:, None] * (HK * DK) + ek[None, :]
        kk = tl.load(k_ptr + kqb + kq_off, mask=valid[:, None], other=0.0).to(OP)
        qq = tl.load(q_ptr + kqb + kq_off, mask=valid[:, None], other=0.0).to(OP)
        if COPY_QK:
            if hv % (HV // HK) == 0:  # one copy per key head
                copy_off = rows[:, None] * WS + (COPY + kh * DK) + ek[None, :]
                tl.store(wsb + copy_off, qq.to(ws_ptr.dtype.element_ty), mask=valid[:, None])
                tl.store(wsb + copy_off + HK * DK, kk.to(ws_ptr.dtype.element_ty), mask=valid[:, None])
        kkt = tl.dot(kk, tl.trans(kk), acc=kkt, input_precision="tf32x3")
        qkt = tl.dot(qq, tl.trans(kk), acc=qkt, input_precision="tf32x3")
    causal = rows[:, None] >= cols[None, :]
    qkd = tl.where(causal, qkt * tl.exp(tl.where(causal, gam[:, None] - gam[None, :], 0.0)), 0.0)
    tl.store(wsb + rows[:, None] * WS + (HV + hv) * BT + cols[None, :], qkd.to(ws_ptr.dtype.element_ty),
             mask=valid[:, None])
    # A[i, j] = beta_i (k_i . k_j) exp(gam_i - gam_j), j < i; D its BC x BC diagonal blocks, L the rest.
    NB: tl.constexpr = BT // BC
    lower = rows[:, None] > cols[None, :]
    same = (rows // BC)[:, None] == (cols // BC)[None, :]
    ell = tl.where(lower & ~same, kkt * bv[:, None] * tl.exp(tl.where(lower, gam[:, None] - gam[None, :], 0.0)),
                   0.0).to(OP)
    # The diagonal blocks transposed, as [NB, BC, BC] (block, column j, row i): D^T[b, j, i] =
    # A[i, j] of block b, built from the symmetric K K^T with the roles of i and j swapped, so
    # that row s of D comes out of a reduction already laid out along Dinv's rows.
    upper = rows[:, None] < cols[None, :]
    at = tl.where(upper, kkt * bv[None, :] * tl.exp(tl.where(upper, gam[None, :] - gam[:, None], 0.0)), 0.0)
    bi = tl.arange(0, NB)[:, None, None, None]
    bj = tl.arange(0, NB)[None, None, :, None]
    dt = tl.sum(tl.where(bi == bj, tl.reshape(at, (NB, BC, NB, BC)), 0.0), 2)
    jj = tl.arange(0, BC)[None, :, None]
    ii = tl.arange(0, BC)[None, None, :]
    eye3 = tl.where(jj == ii, 1.0, 0.0) + tl.zeros((NB, BC, BC), tl.float32)
    # Dinv = (I + D)^-1 by forward substitution, all blocks at once: row s of each block is
    # e_s - sum_{j < s} D[s, j] Dinv[j, :] (rows j < s already final, the others are still e_j).
    dinv3 = eye3  # [NB, BC, BC] (block, row, column)
    for s in range(1, BC):
        ds = tl.sum(tl.where(ii == s, dt, 0.0), 2)  # [NB, BC]: D[s, j] of each block, along j
        new = -tl.sum(ds[:, :, None] * dinv3, 1)  # [NB, BC]: sum_j D[s, j] Dinv[j, c], along c
        dinv3 = tl.where(jj == s, new[:, None, :] + eye3, dinv3)
    dinv = tl.reshape(tl.where(bi == bj, tl.expand_dims(dinv3.to(OP), 2), 0.0), (BT, BT))
    # (I + A) = (I + D)(I + N), N = Dinv L strictly block-lower (N^NB = 0; NB = 4), so
    # Tm = (I + N)^-1 Dinv = (I - N)(I + N^2) Dinv.
    tl.static_assert(NB == 4, "Tm = (I - N)(I + N^2) Dinv needs four diagonal blocks")
    diag = rows[:, None] == cols[None, :]
    n = tl.dot(dinv, ell, input_precision="tf32x3").to(OP)
    p = tl.dot(n, n, input_precision="tf32x3")
    p = tl.where(diag, p + 1.0, p)
    m = p - tl.dot(n, p.to(OP), input_precision="tf32x3")
    tm = tl.dot(m.to(OP), dinv, input_precision="tf32x3")
    tl.store(wsb + rows[:, None] * WS + hv * BT + cols[None, :], tm.to(ws_ptr.dtype.element_ty),
             mask=valid[:, None])


@triton.jit
def walk_kernel(
    q_ptr,  # [B, T, HK, DK] (read when not COPY_QK)
    k_ptr,  # [B, T, HK, DK]
    v_ptr,  # [B, T, HV, DV]
    beta_ptr,  # [B, T, HV] fp32
    ws_ptr,  # [B, T, WS], from prep_kernel
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
    COPY_QK: tl.constexpr,
    F32: tl.constexpr,
):
    vs = tl.program_id(0)
    hv = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    kh = hv // (HV // HK)
    E: tl.constexpr = 1 if F32 else 2
    GAM: tl.constexpr = 2 * HV * BT
    COPY: tl.constexpr = GAM + ((HV * E + 7) // 8) * 8
    WS: tl.constexpr = COPY + (2 * HK * DK if COPY_QK else 0)
    gam_ptr = ws_ptr.to(tl.pointer_type(tl.float32), bitcast=True)
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
        bv = tl.load(beta_ptr + tok64 * HV + hv, mask=valid, other=0.0)
        ws_row = tok64 * WS
        gam = tl.load(gam_ptr + (ws_row + GAM) // E + hv, mask=valid, other=0.0)
        last = b * n_tok + tl.minimum(c * BT + BT, n_tok) - 1  # the chunk's last valid token
        glast = tl.load(gam_ptr + (last * WS + GAM) // E + hv)
        if COPY_QK:
            copy_off = ws_row[:, None] + COPY + kh * DK + ek[None, :]
            qc = tl.load(ws_ptr + copy_off, mask=valid[:, None], other=0.0)
            kc = tl.load(ws_ptr + copy_off + HK * DK, mask=valid[:, None], other=0.0)
        else:
            kq_off = (tok64 * HK + kh)[:, None] * DK + ek[None, :]
            qc = tl.load(q_ptr + kq_off, mask=valid[:, None], other=0.0)
            kc = tl.load(k_ptr + kq_off, mask=valid[:, None], other=0.0)
        tmc = tl.load(ws_ptr + ws_row[:, None] + hv * BT + rows[None, :], mask=valid[:, None], other=0.0)
        qkc = tl.load(ws_ptr + ws_row[:, None] + (HV + hv) * BT + rows[None, :], mask=valid[:, None], other=0.0)
        vo_off = (tok64 * HV + hv)[:, None] * DV + ev[None, :]
        vc = tl.load(v_ptr + vo_off, mask=valid[:, None], other=0.0).to(tl.float32)
        eg = tl.exp(gam)
        if F32:
            qc = qc.to(tl.float32)
            kc = kc.to(tl.float32)
            ks = tl.dot(kc, s, input_precision="tf32x3")
            r = bv[:, None] * (vc - eg[:, None] * ks)
            vp = tl.dot(tmc.to(tl.float32), r, input_precision="tf32x3")
            out = tl.dot(qc, s, input_precision="tf32x3") * eg[:, None]
            out = tl.dot(qkc.to(tl.float32), vp, acc=out, input_precision="tf32x3")
            vd = vp * tl.exp(glast - gam)[:, None]
            s = tl.dot(tl.trans(kc), vd, acc=s * tl.exp(glast), input_precision="tf32x3")
        else:
            qc = qc.to(tl.float16)
            kc = kc.to(tl.float16)
            s16 = s.to(tl.float16)
            ks = tl.dot(kc, s16)
            r = bv[:, None] * (vc - eg[:, None] * ks)
            vp = tl.dot(tmc.to(tl.float16), r.to(tl.float16))
            out = tl.dot(qc, s16) * eg[:, None]
            out = tl.dot(qkc.to(tl.float16), vp.to(tl.float16), acc=out)
            vd = vp * tl.exp(glast - gam)[:, None]
            s = tl.dot(tl.trans(kc), vd.to(tl.float16), acc=s * tl.exp(glast))
        tl.store(o_ptr + vo_off, out.to(o_ptr.dtype.element_ty), mask=valid[:, None])
    tl.store(state_ptr + s_off, s)


def copies_qk(qk_dtype: str, f32: bool) -> bool:
    """Whether the prep kernel writes 16-bit q/k copies for the walk (fp32 q/k, fp16 operands)."""
    return not f32 and qk_dtype == "float32"


def workspace_width(hk: int, hv: int, dk: int, copy_qk: bool, f32: bool = False) -> int:
    """Workspace values per token: Tm and QK rows of every value head, their fp32 cumulative
    decays (padded to 16 bytes), then the q/k copies (as the kernels lay them out)."""
    per_fp32 = 1 if f32 else 2
    return 2 * hv * CHUNK + -(-hv * per_fp32 // 8) * 8 + (2 * hk * dk if copy_qk else 0)


def workspace_dtype(f32: bool) -> str:
    """fp16 (the products' operand type); fp32 for the fp32-operand check mode."""
    return "float32" if f32 else "float16"


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
              config: Config | None = None, prep=None, walk=None):
    """Launch both kernels on torch tensors (GPU checks; CPU tests pass interpreted kernels).

    Updates `state` in place and returns `o`; `config` overrides the sm_90a launch shape.
    """
    import torch

    cfg = config or config_for("sm_90a", str(v.dtype).removeprefix("torch."))
    bsz, n_tok, hk, dk = q.shape
    hv, dv = v.shape[2], v.shape[3]
    bv = min(cfg.bv, dv)
    check_shapes(hk, hv, dk, dv, bv)
    copy = copies_qk(str(q.dtype).removeprefix("torch."), cfg.f32)
    o = torch.empty_like(v) if out is None else out
    ws = workspace
    if ws is None:
        ws = torch.empty((bsz, n_tok, workspace_width(hk, hv, dk, copy, cfg.f32)),
                         dtype=torch.float32 if cfg.f32 else torch.float16, device=v.device)
    if n_tok == 0 or bsz == 0:
        return o
    (prep or prep_kernel)[(triton.cdiv(n_tok, CHUNK), hv, bsz)](
        q, k, g, beta, ws, n_tok, HK=hk, HV=hv, DK=dk, BT=CHUNK, BC=BLOCK, BK=min(dk, 64), COPY_QK=copy, F32=cfg.f32,
        num_warps=cfg.prep_warps, num_stages=1)
    (walk or walk_kernel)[(dv // bv, hv, bsz)](
        q, k, v, beta, ws, state, slot_ids, seq_lens, o, n_tok, state.shape[1], layer,
        HK=hk, HV=hv, DK=dk, DV=dv, BT=CHUNK, BV=bv, COPY_QK=copy, F32=cfg.f32,
        num_warps=cfg.warps, num_stages=cfg.stages)
    return o


HOST_SOURCE = r"""
#include "ninfer_cuda.h"
#include <tvm/ffi/container/tuple.h>
namespace {
constexpr int kHK = @HK@, kHV = @HV@, kDK = @DK@, kDV = @DV@, kBV = @BV@, kChunk = @BT@;

// ws [B, T, @WS@] <- per-chunk Tm and decayed QK rows (and q/k copies), all chunks in parallel.
void prep(tvm::ffi::TensorView q, tvm::ffi::TensorView k, tvm::ffi::TensorView g, tvm::ffi::TensorView beta,
          tvm::ffi::TensorView ws) {
  TVM_FFI_ICHECK(q.ndim() == 4 && q.size(2) == kHK && q.size(3) == kDK && ws.size(2) == @WS@)
      << "gdn_chunked: unexpected q/workspace shape";
  uint64_t qp = ninfer_cuda::pointer(q, "q"), kp = ninfer_cuda::pointer(k, "k");
  uint64_t gp = ninfer_cuda::pointer(g, "g"), bp = ninfer_cuda::pointer(beta, "beta");
  uint64_t wp = ninfer_cuda::pointer(ws, "workspace");
  int32_t n = static_cast<int32_t>(q.size(1));
  unsigned b = static_cast<unsigned>(q.size(0));
  ninfer_cuda::launch("@PREP@", (n + kChunk - 1) / kChunk, kHV, b, {&qp, &kp, &gp, &bp, &wp, &n},
                      q.device().device_id);
}

// Walks the chunks in order per (column slice, head, sequence); writes o and state in place.
tvm::ffi::Tuple<tvm::ffi::Tensor, tvm::ffi::Tensor> step(
    tvm::ffi::TensorView q, tvm::ffi::TensorView k, tvm::ffi::TensorView v, tvm::ffi::TensorView beta,
    tvm::ffi::TensorView ws, tvm::ffi::TensorView slots, tvm::ffi::TensorView lens,
    int64_t layer, tvm::ffi::Tensor o, tvm::ffi::Tensor state) {
  TVM_FFI_ICHECK(state.ndim() == 5 && state.size(2) == kHV && state.size(3) == kDK && state.size(4) == kDV)
      << "gdn_chunked: unexpected state shape";
  TVM_FFI_ICHECK(v.ndim() == 4 && v.size(2) == kHV && v.size(3) == kDV) << "gdn_chunked: unexpected v shape";
  TVM_FFI_ICHECK(layer >= 0 && layer < state.size(0)) << "gdn_chunked: layer " << layer << " out of range";
  uint64_t qp = ninfer_cuda::pointer(q, "q"), kp = ninfer_cuda::pointer(k, "k"), vp = ninfer_cuda::pointer(v, "v");
  uint64_t bp = ninfer_cuda::pointer(beta, "beta");
  uint64_t wp = ninfer_cuda::pointer(ws, "workspace"), sp = ninfer_cuda::pointer(state, "state");
  uint64_t slp = ninfer_cuda::pointer(slots, "slot_ids"), lp = ninfer_cuda::pointer(lens, "seq_lens");
  uint64_t op = ninfer_cuda::pointer(o, "o");
  int32_t n = static_cast<int32_t>(q.size(1));
  int32_t num_slots = static_cast<int32_t>(state.size(1));
  int32_t lay = static_cast<int32_t>(layer);
  unsigned b = static_cast<unsigned>(q.size(0));
  if (n > 0)
    ninfer_cuda::launch("@STATE@", kDV / kBV, kHV, b,
                        {&qp, &kp, &vp, &bp, &wp, &sp, &slp, &lp, &op, &n, &num_slots, &lay},
                        q.device().device_id);
  return tvm::ffi::Tuple<tvm::ffi::Tensor, tvm::ffi::Tensor>(o, state);
}
}  // namespace
TVM_FFI_DLL_EXPORT_TYPED_FUNC(@PREP_SYMBOL@, prep);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(@STATE_SYMBOL@, step);
"""

_TRITON_DTYPE = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def images(arch: str, hk: int, hv: int, dk: int, dv: int, qk_dtype: str, v_dtype: str,
           config: Config | None = None):
    """The (prep, walk) kernel images for one head shape, input dtypes and arch."""
    from .triton_aot import compile_kernel

    cfg = config or config_for(arch, v_dtype)
    bv = min(cfg.bv, dv)
    check_shapes(hk, hv, dk, dv, bv)
    x, y = f"*{_TRITON_DTYPE[qk_dtype]}", f"*{_TRITON_DTYPE[v_dtype]}"
    w = f"*{_TRITON_DTYPE[workspace_dtype(cfg.f32)]}"
    common = {"HK": hk, "HV": hv, "DK": dk, "BT": CHUNK, "COPY_QK": copies_qk(qk_dtype, cfg.f32), "F32": cfg.f32}
    prep = compile_kernel(
        prep_kernel, arch=arch, num_warps=cfg.prep_warps, num_stages=1,
        signature={"q_ptr": x, "k_ptr": x, "g_ptr": "*fp32", "beta_ptr": "*fp32", "ws_ptr": w, "n_tok": "i32"},
        constants={**common, "BC": BLOCK, "BK": min(dk, 64)})
    walk = compile_kernel(
        walk_kernel, arch=arch, num_warps=cfg.warps, num_stages=cfg.stages,
        signature={"q_ptr": x, "k_ptr": x, "v_ptr": y, "beta_ptr": "*fp32", "ws_ptr": w,
                   "state_ptr": "*fp32", "slots_ptr": "*i32", "lens_ptr": "*i32", "o_ptr": y, "n_tok": "i32",
                   "n_slots": "i32", "layer": "i32"},
        constants={**common, "DV": dv, "BV": bv})
    return prep, walk


def host_source(tag: str, hk: int, hv: int, dk: int, dv: int, ws_width: int, prep_name: str, walk_name: str,
                config: Config) -> str:
    """The launcher C++ for one head shape and launch shape (exported symbols carry `tag`)."""
    bv = min(config.bv, dv)
    fields = {"@HK@": str(hk), "@HV@": str(hv), "@DK@": str(dk), "@DV@": str(dv), "@BV@": str(bv),
              "@BT@": str(CHUNK), "@WS@": str(ws_width), "@PREP@": prep_name, "@STATE@": walk_name,
              "@PREP_SYMBOL@": f"{PREP_SYMBOL}_{tag}", "@STATE_SYMBOL@": f"{STATE_SYMBOL}_{tag}"}
    from .cuda_extern import fill_launcher

    return fill_launcher(HOST_SOURCE, fields)


def supported(q, k, v, g, beta, state) -> bool:
    """A CUDA target we build for, static head shapes the kernels handle, dtypes they take.

    q, k: fp32 (what the GDN layer passes), fp16 or bf16; v (and so o): fp32, bf16 or fp16;
    g, beta and the state fp32.
    """
    import tvm

    target = tvm.target.Target.current(allow_none=True)
    if target is None or target.kind.name != "cuda" or str(target.arch) not in ARCHS:
        return False
    if len(q.shape) != 4 or len(v.shape) != 4 or len(state.shape) != 5:
        return False
    dims = (q.shape[2], q.shape[3], v.shape[2], v.shape[3])
    if not all(isinstance(x, int) for x in dims):
        return False
    if str(q.dtype) not in QK_DTYPES or str(k.dtype) != str(q.dtype) or str(v.dtype) not in V_DTYPES:
        return False
    if any(str(x.dtype) != "float32" for x in (g, beta, state)):
        return False
    hk, dk, hv, dv = dims
    try:
        check_shapes(hk, hv, dk, dv, min(config_for(str(target.arch), str(v.dtype)).bv, dv))
    except ValueError:
        return False
    return True


def wants_16bit_inputs(num_k_heads: int, num_v_heads: int, dk: int, dv: int, v_dtype: str) -> bool:
    """Whether chunked GDN on the current target runs these kernels and should get 16-bit inputs.

    The kernels round q and k to fp16 for their tensor-core products anyway, and read v / write
    o in v's dtype: a layer whose v is bf16 can pass fp16 q, k (straight from the L2 norm) and v
    without the fp32 upcast, for the same result, 0.55 instead of 0.70 ms per layer at 7,680 tokens
    on the H200 and no cast passes around the op. Mirrors `gated_delta_rule`'s gate for this path.
    """
    import tvm

    from .common import kernel_flavor, tuned_cuda_kernels

    if v_dtype not in ("bfloat16", "float16") or kernel_flavor() != "gpu" or not tuned_cuda_kernels():
        return False
    target = tvm.target.Target.current(allow_none=True)
    if target is None or str(target.arch) not in ARCHS:
        return False
    try:
        check_shapes(num_k_heads, num_v_heads, dk, dv, min(config_for(str(target.arch), v_dtype).bv, dv))
    except ValueError:
        return False
    return True


def gdn_chunked(q, k, v, g, beta, state, slot_ids, seq_lens, layer: int):
    """`gated_delta_rule(..., chunked=True)` through the Triton kernels: `(o [B, T, Hv, dv], state)`.

    The state is updated in place (`call_inplace_packed`: the returned state aliases the input);
    `o` has v's dtype.
    """
    from tvm.relax.frontend import nn
    from tvm.relax.frontend.nn import op

    from .cuda_extern import current_arch, extern, inplace_call

    hk, dk = int(q.shape[2]), int(q.shape[3])
    hv, dv = int(v.shape[2]), int(v.shape[3])
    qk_dtype, v_dtype = str(q.dtype), str(v.dtype)
    arch = current_arch()
    cfg = config_for(arch, v_dtype)
    prep, walk = images(arch, hk, hv, dk, dv, qk_dtype, v_dtype, cfg)
    width = workspace_width(hk, hv, dk, copies_qk(qk_dtype, cfg.f32), cfg.f32)
    tag = f"hk{hk}_hv{hv}_dk{dk}_dv{dv}_{_TRITON_DTYPE[qk_dtype]}_{_TRITON_DTYPE[v_dtype]}"
    prep_symbol, state_symbol = f"{PREP_SYMBOL}_{tag}", f"{STATE_SYMBOL}_{tag}"

    def infer_ws(q, k, g, beta):
        return nn.Tensor.placeholder([q.shape[0], q.shape[1], width], workspace_dtype(cfg.f32))

    def infer_o(q, k, v, beta, ws, slots, lens, layer, o, state):
        return nn.Tensor.placeholder(o.shape, o.dtype)

    module = extern(f"gdn_chunked_{arch}_{tag}", {prep_symbol: infer_ws, state_symbol: infer_o},
                    host_source(tag, hk, hv, dk, dv, width, prep.name, walk.name, cfg), [prep, walk])
    ws = module[prep_symbol](q, k, g, beta)
    o = op.empty(v.shape, v_dtype, name="gdn_o")
    return inplace_call(state_symbol, [q, k, v, beta, ws, slot_ids, seq_lens, int(layer)], [o, state])
