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
from tvm.relax.expr_functor import PyExprMutator, mutator

from ..ops import qgemv
from ..ops.common import kernel_feature

_CONSUMERS = {qgemv.MULTI_I8_SYMBOL: qgemv.NORM_MULTI_I8_SYMBOL,
              qgemv.SWIGLU_I8X_SYMBOL: qgemv.NORM_SWIGLU_I8X_SYMBOL}
_CALL_DPS_PACKED = "relax.call_dps_packed"


def _packed(expr: relax.Expr) -> tuple[str, list[relax.Expr]] | None:
    """(symbol, arguments) of a `call_dps_packed` of an extern, else None."""
    if not (isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == _CALL_DPS_PACKED):
        return None
    func, args = expr.args[0], expr.args[1]
    if not isinstance(func, relax.ExternFunc) or not hasattr(args, "fields"):
        return None
    return str(func.global_symbol), list(args.fields)


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
        call = _packed(value)
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


@mutator
class _FoldNorms(PyExprMutator):
    """Emits the fused call at each folded norm's binding and drops the launch's (its var remapped)."""

    def __init__(self, mod: tvm.IRModule, params: set[relax.Var]) -> None:
        super().__init__(mod)
        self.params = params
        self.pending: dict[relax.Var, relax.VarBinding] = {}  # norm var -> its launch binding
        self.folded: set[relax.Var] = set()  # launch vars now bound to the fused call's outputs
        self.count = 0

    def visit_dataflow_block_(self, block: relax.DataflowBlock) -> relax.BindingBlock:
        self.pending = _pairs(block, self.params)
        return super().visit_dataflow_block_(block)

    def visit_binding_block_(self, block: relax.BindingBlock) -> relax.BindingBlock:
        self.pending = {}  # (outside dataflow blocks nothing is folded)
        return super().visit_binding_block_(block)

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        if binding.var in self.folded:
            return  # the launch: its var is remapped to the fused call's outputs
        launch = self.pending.get(binding.var)
        if launch is None:
            super().visit_var_binding_(binding)
            return
        _, norm_args = _packed(binding.value)
        symbol, launch_args = _packed(launch.value)
        args = [self.visit_expr(a) for a in norm_args + launch_args[2:]]
        norm_ty, launch_ty = binding.var.ty, launch.var.ty
        launch_fields = list(launch_ty.fields) if isinstance(launch_ty, relax.TupleType) else [launch_ty]
        outs = [*norm_ty.fields, *launch_fields]
        fused = self.builder_.emit(relax.op.call_dps_packed(_CONSUMERS[symbol], relax.Tuple(args), outs), "norm_prologue")
        # (a var that leaves the dataflow block stays an output var)
        emit = self.builder_.emit if isinstance(binding.var, relax.DataflowVar) else self.builder_.emit_output
        n = emit(relax.Tuple([relax.TupleGetItem(fused, 0), relax.TupleGetItem(fused, 1)]), binding.var.name)
        self.set_var_remap(binding.var, n)
        emit = self.builder_.emit if isinstance(launch.var, relax.DataflowVar) else self.builder_.emit_output
        if isinstance(launch_ty, relax.TupleType):
            y = emit(relax.Tuple([relax.TupleGetItem(fused, 2 + i) for i in range(len(launch_fields))]), launch.var.name)
        else:
            y = emit(relax.TupleGetItem(fused, 2), launch.var.name)
        self.set_var_remap(launch.var, y)
        self.folded.add(launch.var)
        self.count += 1


def fold_norm_prologues(mod: tvm.IRModule) -> tuple[tvm.IRModule, int]:
    """`mod` with every foldable (int8 RMS norm, int8 launch) pair as one call; the pairs folded."""
    total, updates = 0, {}
    for gv, func in mod.functions_items():
        if not isinstance(func, relax.Function):
            continue
        folder = _FoldNorms(mod, set(func.params))
        new = folder.visit_expr(func)
        if folder.count:
            updates[gv] = new
            total += folder.count
    if updates:
        mod = mod.clone()  # (the caller's module stays as it was)
    for gv, func in updates.items():
        mod.update_func(gv, func)
    if total:  # the (n, xq) tuples and their items become direct uses of the fused outputs
        mod = relax.transform.CanonicalizeBindings()(mod)
    return mod, total


@tvm.transform.module_pass(opt_level=0, name="NinferFoldNormPrologues")
def fold_norm_prologues_pass(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
    """The pipeline's form of `fold_norm_prologues` (the kernel feature "gemv_norm_prologue")."""
    if not kernel_feature("gemv_norm_prologue"):
        return mod
    return fold_norm_prologues(mod)[0]
