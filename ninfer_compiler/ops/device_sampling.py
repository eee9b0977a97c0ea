"""Sampled tokens chosen on the device: temperature, top-k, top-p and min-p over each logits row,
with the host's definition of a draw (`runtime/sampling.py`), so that only 8 bytes a row come back.

Why: a sampling request used to copy its 248,320-float logits row to the host every step and draw
there: ~1 MB over PCIe, a synchronisation on it and 4 to 20 ms of NumPy work a row (the whole
row sorted when the distribution is flat), against a 6 ms decode step.

The draw is the host's: the row in descending order (ties by lower id), cut to the top k, then to
the shortest head holding top_p of the (top-k) probability and to the probabilities >= min_p x
the largest, then the inverse CDF of the host's uniform `u` over the kept head. No sort is
needed for that: each cut and the draw is "the first position of the order where the running
count reaches C or the running mass reaches M", found by a radix descent over a 64-bit key that
orders the row exactly (value bits, then the id). Every pass histograms, for the rows' keys
still in play, the next 4-bit digit (count, mass in fp64 and the smallest key of each bin),
then one program per row picks the bin where the running sums cross and narrows the prefix;
a bin holding one key decides the position at once. Masses are exp(x / T - max / T) in fp64,
as on the host, so a token differs from the host's only where `u` falls within rounding
(~1e-16) of a boundary.

A call is `stats` (max, normalizers) then up to three selections of `passes(vocab)` passes each:
the top-k cut (only where top-p follows it, whose mass is relative to it), the kept head, the
draw. Each pass is two launches, the histogram over (row, slice) programs and its combination per
row; passes after a row's selection is decided return at once. The caller says which of the
first two selections any row needs (`SELECT_TOPK`, `SELECT_KEPT`: the host knows its rows'
parameters), so a plain temperature draw is 28 launches and one with top-p 54, not 80; without
them the whole row is the kept head, as `stats` leaves it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import triton
import triton.language as tl

if TYPE_CHECKING:
    from tvm.relax.frontend import nn

    from .triton_aot import KernelImage

SLICES = 256  # programs per row in the histogram passes: each walks 8 steps of a 248,320 row; 64 took
# twice the GPU time at one row, 512 more at eight (tests/gpu/check_device_sampling.py, H100)
BLOCK = 128  # elements a program takes at a time
DIGIT = 4  # key bits a pass decides
PARAMS = 5  # per row: temperature, top_k, top_p, min_p, u (float64)
# the three selections (the combine kernel's STAGE)
TOPK, KEPT, DRAW = 0, 1, 2
# bits of the call's `selections`: the selections before the draw that are launched
SELECT_TOPK, SELECT_KEPT = 1 << TOPK, 1 << KEPT

# float64 state per row
SF_MAX, SF_S1, SF_ST, SF_TARGET, SF_ABOVE, SF_KEPT, SF_MASS_K = 0, 1, 2, 3, 4, 5, 6
# int64 state per row
SI_LIVE, SI_BAD, SI_TARGET, SI_ABOVE, SI_PREFIX, SI_DONE, SI_KEPT = 0, 1, 2, 3, 4, 5, 6
STATE = 8  # width of both state arrays

STATS_SYMBOL, STATS_COMBINE_SYMBOL = "ninfer_sample_stats", "ninfer_sample_stats_combine"
PASS_SYMBOL, COMBINE_SYMBOL = "ninfer_sample_pass", "ninfer_sample_combine"


def index_bits(vocab: int) -> int:
    """Bits of a token id in the key."""
    return max(1, (vocab - 1).bit_length())


def passes(vocab: int) -> int:
    """Passes of one selection: the key is 32 value bits and the id."""
    return -(-(32 + index_bits(vocab)) // DIGIT)


@triton.jit
def _clipped(x):
    """The host's clip of +inf to the largest float32, and -0 as 0 (the two zeros tie)."""
    x = tl.minimum(x, 3.4028234663852886e38)
    return tl.where(x == 0.0, 0.0, x)


@triton.jit
def _keys(x, col, IDX_BITS: tl.constexpr):
    """A key per element, smaller first in the descending, ties-by-lower-id order."""
    b = x.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF
    desc = tl.where(b >= 0x80000000, b, b ^ 0x7FFFFFFF)  # negative values: larger bits, later
    return (desc << IDX_BITS) | col.to(tl.int64)


@triton.jit
def stats_kernel(logits, params, part_f, part_i, vocab, SLICES: tl.constexpr, BLOCK: tl.constexpr):
    """Program (row, slice): the slice's max, sum exp(x - max), sum exp(x / T - max / T) (fp64),
    its finite-or-+inf count and its NaN count."""
    row = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1)
    t = tl.load(params + row * 5)
    span = tl.cdiv(tl.cdiv(vocab, SLICES), BLOCK) * BLOCK
    offs = tl.arange(0, BLOCK)
    m = tl.full((), float("-inf"), tl.float64)
    s1 = tl.zeros((), tl.float64)
    st = tl.zeros((), tl.float64)
    live = tl.zeros((), tl.int64)
    nan = tl.zeros((), tl.int64)
    for off in range(0, span, BLOCK):
        col = s * span + off + offs
        inside = col < vocab
        raw = tl.load(logits + row * vocab + col, mask=inside, other=float("-inf"))
        nan += tl.sum((raw != raw).to(tl.int64), 0)
        x = _clipped(tl.where(raw != raw, float("-inf"), raw)).to(tl.float64)
        live += tl.sum((x > float("-inf")).to(tl.int64), 0)
        new_m = tl.maximum(m, tl.max(x, 0))
        ref = tl.where(new_m == float("-inf"), 0.0, new_m)  # nothing live yet: sums stay 0
        s1 = s1 * tl.exp(m - ref) + tl.sum(tl.exp(x - ref), 0)
        st = st * tl.exp(m / t - ref / t) + tl.sum(tl.exp(x / t - ref / t), 0)
        m = new_m
    out = (row * SLICES + s) * 4
    tl.store(part_f + out, m)
    tl.store(part_f + out + 1, s1)
    tl.store(part_f + out + 2, st)
    tl.store(part_i + out, live)
    tl.store(part_i + out + 1, nan)


@triton.jit
def stats_combine_kernel(params, part_f, part_i, sf, si, token, logprob, SLICES: tl.constexpr):
    """Program (row): the row's statistics from its slices'; a row with NaN or nothing finite is
    marked bad (token 0, NaN log-probability: the engine refuses it)."""
    row = tl.program_id(0).to(tl.int64)
    t = tl.load(params + row * 5)
    r = tl.arange(0, SLICES)
    pm = tl.load(part_f + (row * SLICES + r) * 4)
    p1 = tl.load(part_f + (row * SLICES + r) * 4 + 1)
    pt = tl.load(part_f + (row * SLICES + r) * 4 + 2)
    live = tl.sum(tl.load(part_i + (row * SLICES + r) * 4), 0)
    nan = tl.sum(tl.load(part_i + (row * SLICES + r) * 4 + 1), 0)
    m = tl.max(pm, 0)
    ref = tl.where(m == float("-inf"), 0.0, m)
    s1 = tl.sum(tl.where(pm == float("-inf"), 0.0, p1 * tl.exp(pm - ref)), 0)
    st = tl.sum(tl.where(pm == float("-inf"), 0.0, pt * tl.exp(pm / t - ref / t)), 0)
    bad = (nan > 0) | (live == 0)
    base = row * 8
    tl.store(sf + base + 0, m)
    tl.store(sf + base + 1, s1)
    tl.store(sf + base + 2, st)
    tl.store(sf + base + 5, st)  # the kept head's mass and that of the top-k cut: the whole row
    tl.store(sf + base + 6, st)  # until a selection narrows them
    tl.store(si + base + 0, live)
    tl.store(si + base + 1, bad.to(tl.int64))
    tl.store(si + base + 5, tl.full((), 1, tl.int64))
    tl.store(si + base + 6, live)
    tl.store(token + row, tl.zeros((), tl.int32))
    tl.store(logprob + row, tl.full((), float("nan"), tl.float32))


@triton.jit
def pass_kernel(logits, params, sf, si, hist_m, hist_c, hist_k, vocab, step, STAGE: tl.constexpr,
                NPASS: tl.constexpr, IDX_BITS: tl.constexpr, SLICES: tl.constexpr, BLOCK: tl.constexpr,
                DIGIT: tl.constexpr):
    """Program (row, slice), pass `step` of selection STAGE: for the keys still in play (their
    digits above this pass's equal to the prefix decided so far), the count, mass and smallest
    key of each value of this pass's digit."""
    NB: tl.constexpr = 1 << DIGIT
    row = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1)
    base = row * 8
    bad = tl.load(si + base + 1)
    done = tl.load(si + base + 5)
    if (bad == 0) & ((step == 0) | (done == 0)):
        t = tl.load(params + row * 5)
        min_p = tl.load(params + row * 5 + 3)
        zmax = tl.load(sf + base + 0) / t
        prefix = tl.where(step == 0, 0, tl.load(si + base + 4))
        shift = (NPASS - 1 - step) * DIGIT
        high = prefix >> (shift + DIGIT)
        span = tl.cdiv(tl.cdiv(vocab, SLICES), BLOCK) * BLOCK
        offs = tl.arange(0, BLOCK)
        bins = tl.arange(0, NB)
        acc_m = tl.zeros((BLOCK, NB), tl.float64)
        acc_c = tl.zeros((BLOCK, NB), tl.int32)
        acc_k = tl.full((BLOCK, NB), 0x7FFFFFFFFFFFFFFF, tl.int64)
        for off in range(0, span, BLOCK):
            col = s * span + off + offs
            x = _clipped(tl.load(logits + row * vocab + col, mask=col < vocab, other=float("-inf")))
            key = _keys(x, col, IDX_BITS)
            play = (x > float("-inf")) & ((key >> (shift + DIGIT)) == high)
            if tl.max(play.to(tl.int32), 0) > 0:  # (past the first passes most blocks have no key in play)
                w = tl.exp(x.to(tl.float64) / t - zmax)
                if STAGE == 1:  # the kept head: only probabilities >= min_p x the largest
                    play = play & (w >= min_p)
                hit = play[:, None] & (((key >> shift) & (NB - 1))[:, None] == bins[None, :])
                acc_m += tl.where(hit, w[:, None], 0.0)
                acc_c += hit.to(tl.int32)
                acc_k = tl.minimum(acc_k, tl.where(hit, key[:, None], 0x7FFFFFFFFFFFFFFF))
        out = (row * SLICES + s) * NB + bins
        tl.store(hist_m + out, tl.sum(acc_m, 0))
        tl.store(hist_c + out, tl.sum(acc_c, 0).to(tl.int64))
        tl.store(hist_k + out, tl.min(acc_k, 0))


@triton.jit
def combine_kernel(logits, params, sf, si, hist_m, hist_c, hist_k, token, logprob, vocab, step,
                   STAGE: tl.constexpr, NPASS: tl.constexpr, IDX_BITS: tl.constexpr, SLICES: tl.constexpr,
                   DIGIT: tl.constexpr):
    """Program (row), pass `step` of selection STAGE: the first digit value where the running
    count reaches the target count or the running mass reaches the target mass (strictly past it
    for the draw); the prefix narrows to it, or the position is decided (its bin holds one key)."""
    NB: tl.constexpr = 1 << DIGIT
    row = tl.program_id(0).to(tl.int64)
    base = row * 8
    bad = tl.load(si + base + 1)
    done = tl.load(si + base + 5)
    if (bad == 0) & ((step == 0) | (done == 0)):
        bins = tl.arange(0, NB)
        r = tl.arange(0, SLICES)
        at = (row * SLICES + r)[:, None] * NB + bins[None, :]
        mass = tl.sum(tl.load(hist_m + at), 0)
        count = tl.sum(tl.load(hist_c + at), 0)
        least = tl.min(tl.load(hist_k + at), 0)
        live = tl.load(si + base + 0)
        finished = tl.zeros((), tl.int32)
        if step == 0:  # this selection's targets, from the statistics and the selections before
            k = tl.load(params + row * 5 + 1).to(tl.int64)
            top_p = tl.load(params + row * 5 + 2)
            has_k = (k > 0) & (k < live)
            if STAGE == 0:  # the top-k cut, needed only for the mass top-p is relative to
                target_c = k
                target_m = tl.full((), float("inf"), tl.float64)
                finished = (~(has_k & (top_p < 1.0))).to(tl.int32)
            elif STAGE == 1:  # the kept head
                target_c = tl.where(has_k, k, live)
                target_m = tl.where(top_p < 1.0, top_p * tl.load(sf + base + 6), float("inf"))
                total_c = tl.sum(count, 0)
                total_m = tl.sum(mass, 0)
                every = (target_c >= total_c) & (total_m < target_m)  # every key in play is kept
                tl.store(si + base + 6, total_c, mask=every)
                tl.store(sf + base + 5, total_m, mask=every)
                finished = every.to(tl.int32)
            else:  # the draw: inverse CDF of u over the kept head
                target_c = tl.load(si + base + 6)
                target_m = tl.load(params + row * 5 + 4) * tl.load(sf + base + 5)
            tl.store(si + base + 2, target_c)
            tl.store(sf + base + 3, target_m)
            tl.store(si + base + 3, tl.zeros((), tl.int64))
            tl.store(sf + base + 4, tl.zeros((), tl.float64))
            tl.store(si + base + 5, finished.to(tl.int64))
        if finished == 0:
            target_c = tl.load(si + base + 2)
            target_m = tl.load(sf + base + 3)
            above_c = tl.where(step == 0, 0, tl.load(si + base + 3))
            above_m = tl.where(step == 0, 0.0, tl.load(sf + base + 4))
            prefix = tl.where(step == 0, 0, tl.load(si + base + 4))
            run_c = above_c + tl.cumsum(count, 0)
            run_m = above_m + tl.cumsum(mass, 0)
            if STAGE == 2:
                crossed = (run_c >= target_c) | (run_m > target_m)
            else:
                crossed = (run_c >= target_c) | (run_m >= target_m)
            b = tl.min(tl.where(crossed, bins, NB), 0)
            b = tl.where(b == NB, tl.max(tl.where(count > 0, bins, 0), 0), b)  # (rounding: the last bin in play)
            in_b = tl.sum(tl.where(bins == b, count, 0), 0)
            before_c = above_c + tl.sum(tl.where(bins < b, count, 0), 0)
            before_m = above_m + tl.sum(tl.where(bins < b, mass, 0.0), 0)
            shift = (NPASS - 1 - step) * DIGIT
            if (in_b <= 1) | (shift == 0):  # decided: the bin's one key
                key = tl.sum(tl.where(bins == b, least, 0), 0)
                incl_c = before_c + 1
                incl_m = before_m + tl.sum(tl.where(bins == b, mass, 0.0), 0)
                if STAGE == 0:
                    tl.store(sf + base + 6, incl_m)
                elif STAGE == 1:
                    tl.store(si + base + 6, incl_c)
                    tl.store(sf + base + 5, incl_m)
                else:
                    tok = (key & ((1 << IDX_BITS) - 1)).to(tl.int32)
                    x = _clipped(tl.load(logits + row * vocab + tok)).to(tl.float64)
                    m = tl.load(sf + base + 0)
                    ok = (in_b == 1) & (tok < vocab)
                    tl.store(token + row, tl.where(ok, tok, 0))
                    lp = (x - m) - tl.log(tl.load(sf + base + 1))
                    tl.store(logprob + row, tl.where(ok, lp, float("nan")).to(tl.float32))
                tl.store(si + base + 5, tl.full((), 1, tl.int64))
            else:
                tl.store(si + base + 4, prefix | (b.to(tl.int64) << shift))
                tl.store(si + base + 3, before_c)
                tl.store(sf + base + 4, before_m)


def images(arch: str, vocab: int, slices: int = SLICES, block: int = BLOCK,
           warps: int = 4) -> dict[str, KernelImage]:
    """Every kernel of a call for `vocab`-wide rows (the key's layout is compiled in), by launch key;
    `slices` programs a row in the histogram passes (a power of two) of `warps` warps taking `block`
    elements at a time (measured in tests/gpu/check_device_sampling.py)."""
    from .triton_aot import compile_kernel

    if index_bits(vocab) > 28:
        raise ValueError(f"device sampling takes vocabularies up to 2^28 tokens, not {vocab}")
    npass, ib = passes(vocab), index_bits(vocab)
    state = {"sf": "*fp64", "si": "*i64"}
    hist = {"hist_m": "*fp64", "hist_c": "*i64", "hist_k": "*i64"}
    out = {
        "stats": compile_kernel(
            stats_kernel, signature={"logits": "*fp32", "params": "*fp64", "part_f": "*fp64", "part_i": "*i64",
                                     "vocab": "i32"},
            constants={"SLICES": slices, "BLOCK": block}, arch=arch, num_warps=warps, num_stages=2),
        "stats_combine": compile_kernel(
            stats_combine_kernel, signature={"params": "*fp64", "part_f": "*fp64", "part_i": "*i64", **state,
                                             "token": "*i32", "logprob": "*fp32"},
            constants={"SLICES": slices}, arch=arch, num_warps=2, num_stages=1),
    }
    for stage in (TOPK, KEPT, DRAW):
        shape = {"STAGE": stage, "NPASS": npass, "IDX_BITS": ib, "SLICES": slices, "DIGIT": DIGIT}
        out[f"pass{stage}"] = compile_kernel(
            pass_kernel, signature={"logits": "*fp32", "params": "*fp64", **state, **hist, "vocab": "i32",
                                    "step": "i32"},
            constants={**shape, "BLOCK": block}, arch=arch, num_warps=warps, num_stages=2)
        out[f"combine{stage}"] = compile_kernel(
            combine_kernel, signature={"logits": "*fp32", "params": "*fp64", **state, **hist, "token": "*i32",
                                       "logprob": "*fp32", "vocab": "i32", "step": "i32"},
            constants=shape, arch=arch, num_warps=4, num_stages=1)
    return out


LAUNCHER = r"""
#include "ninfer_cuda.h"
namespace {
using tvm::ffi::TensorView;
// token[b] int32 and logprob[b] fp32 of logits [b, V] fp32 drawn with params [b, 5] fp64
// (temperature, top_k, top_p, min_p, u); the other tensors are scratch: part_f / part_i
// [b, SLICES, 4], sf / si [b, 8], hist_* [b, SLICES, 16]. `selections`: bit s launches selection s
// (0 the top-k cut, 1 the kept head; the draw always). Launches in stream order, no PDL.
void sample(TensorView logits, TensorView params, int64_t selections, TensorView part_f, TensorView part_i, TensorView sf,
            TensorView si, TensorView hist_m, TensorView hist_c, TensorView hist_k, TensorView token,
            TensorView logprob) {
  TVM_FFI_ICHECK(logits.ndim() == 2 && logits.dtype().code == kDLFloat && logits.dtype().bits == 32)
      << "@SYMBOL@: logits must be [b, V] float32";
  TVM_FFI_ICHECK(logits.shape()[1] == @VOCAB@) << "@SYMBOL@: logits rows must be @VOCAB@ wide";
  const int64_t rows = logits.shape()[0];
  TVM_FFI_ICHECK(params.ndim() == 2 && params.shape()[0] == rows && params.shape()[1] == 5 &&
                 params.dtype().code == kDLFloat && params.dtype().bits == 64)
      << "@SYMBOL@: params must be [b, 5] float64";
  TVM_FFI_ICHECK(token.numel() == rows && logprob.numel() == rows && hist_m.numel() == rows * @SLICES@ * 16)
      << "@SYMBOL@: unexpected shapes";
  uint64_t lp = ninfer_cuda::pointer(logits, "logits"), pp = ninfer_cuda::pointer(params, "params");
  uint64_t pf = ninfer_cuda::pointer(part_f, "part_f"), pi = ninfer_cuda::pointer(part_i, "part_i");
  uint64_t fs = ninfer_cuda::pointer(sf, "sf"), is = ninfer_cuda::pointer(si, "si");
  uint64_t hm = ninfer_cuda::pointer(hist_m, "hist_m"), hc = ninfer_cuda::pointer(hist_c, "hist_c");
  uint64_t hk = ninfer_cuda::pointer(hist_k, "hist_k");
  uint64_t tp = ninfer_cuda::pointer(token, "token"), op = ninfer_cuda::pointer(logprob, "logprob");
  int32_t vocab = @VOCAB@;
  const unsigned b = static_cast<unsigned>(rows);
  const int dev = logits.device().device_id;
  ninfer_cuda::launch("stats", b, @SLICES@, 1, {&lp, &pp, &pf, &pi, &vocab}, dev);
  ninfer_cuda::launch("stats_combine", b, 1, 1, {&pp, &pf, &pi, &fs, &is, &tp, &op}, dev);
  static const char* const pass_names[3] = {"pass0", "pass1", "pass2"};
  static const char* const combine_names[3] = {"combine0", "combine1", "combine2"};
  TVM_FFI_ICHECK(selections >= 0 && selections < 4) << "@SYMBOL@: selections must be a mask of bits 0 and 1";
  for (int stage = 0; stage < 3; ++stage) {
    if (stage < 2 && !(selections >> stage & 1)) continue;
    for (int32_t step = 0; step < @NPASS@; ++step) {
      ninfer_cuda::launch(pass_names[stage], b, @SLICES@, 1, {&lp, &pp, &fs, &is, &hm, &hc, &hk, &vocab, &step}, dev);
      ninfer_cuda::launch(combine_names[stage], b, 1, 1,
                          {&lp, &pp, &fs, &is, &hm, &hc, &hk, &tp, &op, &vocab, &step}, dev);
    }
  }
}
}  // namespace
TVM_FFI_DLL_EXPORT_TYPED_FUNC(@SYMBOL@, sample);
"""

SYMBOL = "ninfer_sample_choice"


def sample_choice(logits: nn.Tensor, params: nn.Tensor, selections) -> tuple[nn.Tensor, nn.Tensor]:  # noqa: ANN001
    """`(token [b] int32, logprob [b] fp32)` drawn from `logits [b, V]` fp32 with `params [b, 5]`
    fp64 (temperature > 0, top_k (0: off), top_p, min_p, the uniform u in [0, 1)): the host's draw
    (`runtime/sampling.sample`) on the device. `selections` (an int, or the function's int input):
    `SELECT_TOPK` where a row has top-k and top-p, `SELECT_KEPT` where a row has any cut. Tuned
    CUDA packages only."""
    from tvm.relax.frontend import nn

    from .cuda_extern import current_arch, dps_call, extern, fill_launcher

    rows, vocab = logits.shape
    arch = current_arch()
    kernels = images(arch, int(vocab))
    launcher = fill_launcher(LAUNCHER, {"SYMBOL": SYMBOL, "SLICES": SLICES, "VOCAB": int(vocab),
                                        "NPASS": passes(int(vocab))})
    extern(f"sample_{arch}", {SYMBOL: lambda *args: args[0]}, launcher, kernels)
    nb = 1 << DIGIT
    outputs = [nn.Tensor.placeholder([rows, SLICES, 4], "float64"), nn.Tensor.placeholder([rows, SLICES, 4], "int64"),
               nn.Tensor.placeholder([rows, STATE], "float64"), nn.Tensor.placeholder([rows, STATE], "int64"),
               nn.Tensor.placeholder([rows, SLICES, nb], "float64"), nn.Tensor.placeholder([rows, SLICES, nb], "int64"),
               nn.Tensor.placeholder([rows, SLICES, nb], "int64"), nn.Tensor.placeholder([rows], "int32"),
               nn.Tensor.placeholder([rows], "float32")]
    out = dps_call(SYMBOL, [logits, params, selections], outputs)
    return out[7], out[8]
