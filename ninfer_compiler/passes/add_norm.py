"""Fold each decode RMS norm into the residual-add GEMV that produces its input.

Why: at decode every layer has two `residual + x W^T` projections (the mixer's output and the MLP's
down projection), and each is read by an RMS norm (the post-attention norm, the next layer's input
norm or the final norm). As kernels of their own the norms cost a launch boundary each on the
step's critical path (128 on the 64-layer 27B model). The v4 launcher's `ninfer_qgemv_add_norm`
computes the norm in the GEMV's last block instead (`qgemv_cuda.cu` `v4_add_norm`), with the same
fp32 math as `ninfer_rms_norm`, so this pass rewrites

    y = ninfer_qgemv_add(x, planes.., bits, residual)
    n = ninfer_rms_norm(y, w, eps, offset)           # or ninfer_rms_norm_xq -> (n, xq)

into one call `ninfer_qgemv_add_norm(x, planes.., bits, residual, w, eps, offset) -> (y, n[, xq])`.
A norm is folded only where its weight is a function parameter or bound before the add in the same
dataflow block (so every argument is defined at the add's position); one norm per add. Measured on
the H200 the last block's norm costs more than the launch boundary it saves (docs/kernels/
decode-gemv-v4.md "tenth pass"), so the pipeline runs this only under the opt-in kernel feature
"gemv_add_norm".
"""

from __future__ import annotations

import tvm
from tvm import relax, tirx

from ..ops import qgemv
from .extern_fold import feature_pass, fold_pairs, joined, packed

_NORMS = {qgemv.NORM_SYMBOL: qgemv.ADD_NORM_SYMBOL, qgemv.NORM_XQ_SYMBOL: qgemv.ADD_NORM_XQ_SYMBOL}


def _pairs(block: relax.DataflowBlock, params: set[relax.Var]) -> dict[relax.Var, relax.VarBinding]:
    """For each residual-add binding's var in `block`: the one norm binding that folds into it (its
    weight a parameter or bound before the add, eps and offset constants)."""
    adds: dict[relax.Var, int] = {}
    defined: dict[relax.Var, int] = {}
    found: dict[relax.Var, relax.VarBinding] = {}
    for i, b in enumerate(block.bindings):
        defined[b.var] = i
        call = packed(b.value) if isinstance(b, relax.VarBinding) else None
        if call is None:
            continue
        symbol, args = call
        if symbol == qgemv.ADD_SYMBOL:
            adds[b.var] = i
        elif symbol in _NORMS and len(args) == 4 and isinstance(args[0], relax.Var) and args[0] in adds:
            w, consts = args[1], args[2:]
            w_ok = isinstance(w, relax.Var) and (w in params or defined.get(w, i) < adds[args[0]])
            if args[0] not in found and w_ok and all(isinstance(a, tirx.FloatImm) for a in consts):
                found[args[0]] = b
    return found


def fold_add_norms(mod: tvm.IRModule) -> tuple[tvm.IRModule, int]:
    """`mod` with every foldable (residual-add GEMV, RMS norm) pair as one call: the add's arguments,
    then the norm's but its input (the add's output); the pairs folded."""
    return fold_pairs(mod, _pairs, joined(_NORMS, 1), "add_norm")


# the pipeline's form of `fold_add_norms`
fold_add_norms_pass = feature_pass(fold_add_norms, "gemv_add_norm", "NinferFoldAddNorms")
