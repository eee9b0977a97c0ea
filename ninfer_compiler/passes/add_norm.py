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
from tvm.relax.expr_functor import PyExprMutator, mutator

from ..ops import qgemv
from ..ops.common import kernel_feature

_NORMS = {qgemv.NORM_SYMBOL: qgemv.ADD_NORM_SYMBOL, qgemv.NORM_XQ_SYMBOL: qgemv.ADD_NORM_XQ_SYMBOL}
_CALL_DPS_PACKED = "relax.call_dps_packed"


def _packed(expr: relax.Expr) -> tuple[str, list[relax.Expr]] | None:
    """(symbol, arguments) of a `call_dps_packed` of an extern, else None."""
    if not (isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == _CALL_DPS_PACKED):
        return None
    func, args = expr.args[0], expr.args[1]
    if not isinstance(func, relax.ExternFunc) or not hasattr(args, "fields"):
        return None
    return str(func.global_symbol), list(args.fields)


def _pairs(block: relax.DataflowBlock, params: set[relax.Var]) -> dict[relax.Var, relax.VarBinding]:
    """For each residual-add binding's var in `block`: the one norm binding that folds into it (its
    weight a parameter or bound before the add, eps and offset constants)."""
    adds: dict[relax.Var, int] = {}
    defined: dict[relax.Var, int] = {}
    found: dict[relax.Var, relax.VarBinding] = {}
    for i, b in enumerate(block.bindings):
        defined[b.var] = i
        call = _packed(b.value) if isinstance(b, relax.VarBinding) else None
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


@mutator
class _FoldNorms(PyExprMutator):
    """Emits the fused call at each folded add's binding and drops the norm's (its var remapped)."""

    def __init__(self, mod: tvm.IRModule, params: set[relax.Var]) -> None:
        super().__init__(mod)
        self.params = params
        self.pending: dict[relax.Var, relax.VarBinding] = {}  # add var -> its norm binding
        self.folded: set[relax.Var] = set()  # norm vars now bound to the fused call's outputs
        self.count = 0

    def visit_dataflow_block_(self, block: relax.DataflowBlock) -> relax.BindingBlock:
        self.pending = _pairs(block, self.params)
        return super().visit_dataflow_block_(block)

    def visit_binding_block_(self, block: relax.BindingBlock) -> relax.BindingBlock:
        self.pending = {}  # (outside dataflow blocks nothing is folded)
        return super().visit_binding_block_(block)

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        if binding.var in self.folded:
            return  # the norm: its var is remapped to the fused call's outputs
        norm = self.pending.get(binding.var)
        if norm is None:
            super().visit_var_binding_(binding)
            return
        _, add_args = _packed(binding.value)
        symbol, norm_args = _packed(norm.value)
        args = [self.visit_expr(a) for a in add_args + norm_args[1:]]
        norm_ty = norm.var.ty
        outs = [binding.var.ty, *(norm_ty.fields if isinstance(norm_ty, relax.TupleType) else [norm_ty])]
        fused = self.builder_.emit(relax.op.call_dps_packed(_NORMS[symbol], relax.Tuple(args), outs), "add_norm")
        # (a var that leaves the dataflow block stays an output var)
        emit = self.builder_.emit if isinstance(binding.var, relax.DataflowVar) else self.builder_.emit_output
        y = emit(relax.TupleGetItem(fused, 0), binding.var.name)
        self.set_var_remap(binding.var, y)
        emit = self.builder_.emit if isinstance(norm.var, relax.DataflowVar) else self.builder_.emit_output
        if isinstance(norm_ty, relax.TupleType):
            n = emit(relax.Tuple([relax.TupleGetItem(fused, i + 1) for i in range(len(outs) - 1)]), norm.var.name)
        else:
            n = emit(relax.TupleGetItem(fused, 1), norm.var.name)
        self.set_var_remap(norm.var, n)
        self.folded.add(norm.var)
        self.count += 1


def fold_add_norms(mod: tvm.IRModule) -> tuple[tvm.IRModule, int]:
    """`mod` with every foldable (residual-add GEMV, RMS norm) pair as one call; the pairs folded."""
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
    if total:  # the norms' (n, xq) tuples and their items become direct uses of the fused outputs
        mod = relax.transform.CanonicalizeBindings()(mod)
    return mod, total


@tvm.transform.module_pass(opt_level=0, name="NinferFoldAddNorms")
def fold_add_norms_pass(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
    """The pipeline's form of `fold_add_norms` (the kernel feature "gemv_add_norm")."""
    if not kernel_feature("gemv_add_norm"):
        return mod
    return fold_add_norms(mod)[0]
