"""Fold each decode RMS norm into the int8 launch that reads its activations.

Why: at decode a Qwen3.5 layer's input norm feeds the mixer's q4 + q5 projections (one multi launch)
and its post-attention norm the MLP's SwiGLU, both on the norm's int8 activations at <= 4 rows. As
a kernel of its own each norm is one block that costs a launch boundary on the step's critical path
(~2 us, 128 on the 64-layer 27B model). The launcher's `ninfer_qgemv_norm_*` calls run the norm in
the reading launch's prologue at one row instead (every block normalizes and quantizes the row
itself, the norm kernel's math in its summation order: the same bytes; `qgemv_cuda.cu` `v4_norm_in`)
and launch the norm kernel first at more rows, so this pass rewrites

    nq = ninfer_rms_norm_xq(x, w, eps, offset)          # (n, xq)
    y = ninfer_qgemv_multi_i8(nq[0], nq[1], ...)         # or ninfer_qgemv_swiglu_i8x -> (h, hq)

into one call `ninfer_qgemv_norm_multi_i8(x, w, eps, offset, ...) -> (n, xq, y..)` at the norm's
place. A pair is folded where the norm's int8 activations have no other reader (the fused call
writes them at more than one row only) and the launch's other arguments are function parameters,
constants or bound before the norm. Runs under the kernel feature "gemv_norm_prologue".
"""

from __future__ import annotations

import tvm
from tvm import relax

from ..ops import qgemv
from .extern_fold import feature_pass, fold_pairs, joined, packed

_CONSUMERS = {qgemv.MULTI_I8_SYMBOL: qgemv.NORM_MULTI_I8_SYMBOL,
              qgemv.SWIGLU_I8X_SYMBOL: qgemv.NORM_SWIGLU_I8X_SYMBOL}


def _var_uses(block: relax.DataflowBlock) -> dict[relax.Var, int]:
    """How often each var is read in `block` (the block's bindings; outputs leaving it count once)."""
    uses: dict[relax.Var, int] = {}

    def count(e: relax.Expr) -> None:
        if isinstance(e, relax.Var):
            uses[e] = uses.get(e, 0) + 1

    for b in block.bindings:
        relax.analysis.post_order_visit(b.value, count)
        if not isinstance(b.var, relax.DataflowVar):
            uses[b.var] = uses.get(b.var, 0) + 1
    return uses


def _pairs(block: relax.DataflowBlock, params: set[relax.Var]) -> dict[relax.Var, relax.VarBinding]:
    """For each int8 norm binding's var in `block`: the one launch binding that folds into it."""
    uses = _var_uses(block)
    defined: dict[relax.Var, int] = {}
    norms: dict[relax.Var, int] = {}  # norm var -> its binding's index
    items: dict[relax.Var, tuple[relax.Var, int]] = {}  # var bound to norm[i] -> (norm var, i)
    found: dict[relax.Var, relax.VarBinding] = {}
    for i, b in enumerate(block.bindings):
        defined[b.var] = i
        if not isinstance(b, relax.VarBinding):
            continue
        value = b.value
        if isinstance(value, relax.TupleGetItem) and isinstance(value.tuple_value, relax.Var) \
                and value.tuple_value in norms:
            items[b.var] = (value.tuple_value, int(value.index))
            continue
        call = packed(value)
        if call is None:
            continue
        symbol, args = call
        if symbol == qgemv.NORM_XQ_SYMBOL and len(args) == 4:
            norms[b.var] = i
            continue
        if symbol not in _CONSUMERS or len(args) < 3:
            continue
        n, xq = items.get(args[0]), items.get(args[1])
        if n is None or xq is None or n[0] != xq[0] or (n[1], xq[1]) != (0, 1):
            continue
        norm_var = n[0]
        at = norms[norm_var]
        rest_ok = all(not isinstance(a, relax.Var) or a in params or defined.get(a, i) < at for a in args[2:])
        if norm_var not in found and uses.get(args[1], 0) == 1 and rest_ok:
            found[norm_var] = b
    return found


def fold_norm_prologues(mod: tvm.IRModule) -> tuple[tvm.IRModule, int]:
    """`mod` with every foldable (int8 RMS norm, int8 launch) pair as one call: the norm's arguments,
    then the launch's but its two activation inputs; the pairs folded."""
    return fold_pairs(mod, _pairs, joined(_CONSUMERS, 2), "norm_prologue")


# the pipeline's form of `fold_norm_prologues`
fold_norm_prologues_pass = feature_pass(fold_norm_prologues, "gemv_norm_prologue", "NinferFoldNormPrologues")
