"""Folding two of our CUDA extern calls of a dataflow block into one call (passes/add_norm.py,
passes/norm_prologue.py): the pair's first call is replaced by the fused one, whose outputs are the
first call's then the second's, and the second call's binding is dropped (its var remapped).

A pass supplies `pairs(block, params)`, which maps each first call's var to the binding of the
call folded into it (every argument of the fused call must be defined at the first call), and
`fuse(first, second)`, the fused call's symbol and arguments (`joined`: the usual form), and gets
its pipeline pass from `feature_pass`.
"""

from __future__ import annotations

from collections.abc import Callable

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from ..ops.common import kernel_feature

CALL_DPS_PACKED = "relax.call_dps_packed"
Pairs = Callable[[relax.DataflowBlock, set[relax.Var]], dict[relax.Var, relax.VarBinding]]
Fuse = Callable[[relax.VarBinding, relax.VarBinding], tuple[str, list[relax.Expr]]]


def packed(expr: relax.Expr) -> tuple[str, list[relax.Expr]] | None:
    """(symbol, arguments) of a `call_dps_packed` of an extern, else None."""
    if not (isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == CALL_DPS_PACKED):
        return None
    func, args = expr.args[0], expr.args[1]
    if not isinstance(func, relax.ExternFunc) or not hasattr(args, "fields"):
        return None
    return str(func.global_symbol), list(args.fields)


def joined(symbols: dict[str, str], skip: int) -> Fuse:
    """The `fuse` whose call is `symbols[the second call's symbol]` on the first call's arguments,
    then the second's but its first `skip` (the first call's outputs it read)."""

    def fuse(first: relax.VarBinding, second: relax.VarBinding) -> tuple[str, list[relax.Expr]]:
        _, first_args = packed(first.value)
        symbol, second_args = packed(second.value)
        return symbols[symbol], first_args + second_args[skip:]

    return fuse


def _fields(ty: relax.Type) -> list[relax.Type]:
    return list(ty.fields) if isinstance(ty, relax.TupleType) else [ty]


@mutator
class _PairFolder(PyExprMutator):
    """Emits the fused call at each pair's first binding and drops the second's."""

    def __init__(self, mod: tvm.IRModule, params: set[relax.Var], pairs: Pairs, fuse: Fuse, name: str) -> None:
        super().__init__(mod)
        self.params, self.pairs, self.fuse, self.name = params, pairs, fuse, name
        self.pending: dict[relax.Var, relax.VarBinding] = {}  # first var -> the second call's binding
        self.folded: set[relax.Var] = set()  # second vars now bound to the fused call's outputs
        self.count = 0

    def visit_dataflow_block_(self, block: relax.DataflowBlock) -> relax.BindingBlock:
        self.pending = self.pairs(block, self.params)
        return super().visit_dataflow_block_(block)

    def visit_binding_block_(self, block: relax.BindingBlock) -> relax.BindingBlock:
        self.pending = {}  # (outside dataflow blocks nothing is folded)
        return super().visit_binding_block_(block)

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        if binding.var in self.folded:
            return  # the second call: its var is remapped to the fused call's outputs
        second = self.pending.get(binding.var)
        if second is None:
            super().visit_var_binding_(binding)
            return
        symbol, args = self.fuse(binding, second)
        outs = _fields(binding.var.ty) + _fields(second.var.ty)
        call = relax.op.call_dps_packed(symbol, relax.Tuple([self.visit_expr(a) for a in args]), outs)
        fused = self.builder_.emit(call, self.name)
        self._rebind(binding.var, fused, 0)
        self._rebind(second.var, fused, len(_fields(binding.var.ty)))
        self.folded.add(second.var)
        self.count += 1

    def _rebind(self, var: relax.Var, fused: relax.Var, first: int) -> None:
        """`var` as the fused call's outputs first.. (a tuple where var's type is one)."""
        # (a var that leaves the dataflow block stays an output var)
        emit = self.builder_.emit if isinstance(var, relax.DataflowVar) else self.builder_.emit_output
        if isinstance(var.ty, relax.TupleType):
            value = relax.Tuple([relax.TupleGetItem(fused, first + i) for i in range(len(var.ty.fields))])
        else:
            value = relax.TupleGetItem(fused, first)
        self.set_var_remap(var, emit(value, var.name))


def fold_pairs(mod: tvm.IRModule, pairs: Pairs, fuse: Fuse, name: str) -> tuple[tvm.IRModule, int]:
    """`mod` with every pair `pairs` finds folded (fused calls bound as `name`); the pairs folded."""
    total, updates = 0, {}
    for gv, func in mod.functions_items():
        if not isinstance(func, relax.Function):
            continue
        folder = _PairFolder(mod, set(func.params), pairs, fuse, name)
        new = folder.visit_expr(func)
        if folder.count:
            updates[gv] = new
            total += folder.count
    if updates:
        mod = mod.clone()  # (the caller's module stays as it was)
    for gv, func in updates.items():
        mod.update_func(gv, func)
    if total:  # the remapped tuples and their items become direct uses of the fused outputs
        mod = relax.transform.CanonicalizeBindings()(mod)
    return mod, total


def feature_pass(fold: Callable[[tvm.IRModule], tuple[tvm.IRModule, int]], feature: str,
                 name: str) -> tvm.transform.Pass:
    """The pipeline's form of `fold`: a module pass that folds only under the kernel feature `feature`."""

    def run(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return fold(mod)[0] if kernel_feature(feature) else mod

    return tvm.transform.module_pass(run, opt_level=0, name=name)
