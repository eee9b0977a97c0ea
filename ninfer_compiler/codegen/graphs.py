"""The CUDA-graph variant of `decode`: one captured graph per batch-size bucket.

TVM's `RewriteCUDAGraph` lifts a run of kernels into a captured graph only when every tensor
they touch has a fixed address: storage planned statically inside the function, or a
parameter at or after the function's `num_input` (taken to be weights). Our decode takes its
token ids, page table and caches as inputs, so by default nothing would be captured. The
variant `decode_graph` declares `num_input = 0`: *all* its arguments are then treated as
fixed, and the whole step becomes one graph per value of the batch size `b` (captured on the
first call, replayed after; the graph keeps the addresses it saw then). The runtime keeps
one set of input tensors per bucket and writes new values into them before each call; the
logits (the function's output) are allocated per call, outside the graph.

Capture runs the step once eagerly (kernel warm-up) and then records it without executing,
so the first call of a bucket updates the caches exactly once, like a replay.
"""

from __future__ import annotations

import tvm
from tvm import relax

GRAPH_SUFFIX = "_graph"
GRAPH_FUNCTIONS = ("decode",)


def graph_name(function: str) -> str:
    return function + GRAPH_SUFFIX


def bucket_sizes(max_batch: int) -> list[int]:
    """Batch sizes with a graph: powers of two below `max_batch`, and `max_batch` itself."""
    out, b = [], 1
    while b < max_batch:
        out.append(b)
        b *= 2
    return [*out, max_batch]


def add_graph_variants(mod: tvm.IRModule, symbolic_vars: tuple[str, ...] = ("b",)) -> tvm.IRModule:
    """Add `<fn>_graph` for each of `GRAPH_FUNCTIONS`: same body, all arguments fixed."""
    mod = mod.clone()
    for name in GRAPH_FUNCTIONS:
        func = mod[name]
        graph = (
            func.with_attr("global_symbol", graph_name(name))
            .with_attr("num_input", 0)
            .with_attr("relax.rewrite_cuda_graph.capture_symbolic_vars", list(symbolic_vars))
        )
        mod[graph_name(name)] = _FreshCalls().visit_expr(relax.utils.copy_with_new_vars(graph))
    return mod


@relax.expr_functor.mutator
class _FreshCalls(relax.PyExprMutator):
    """Every call node rebuilt. `copy_with_new_vars` keeps the nodes that mention no variable (an
    allocation of a static shape) shared with the original function, and StaticPlanBlockMemory,
    which plans the whole module, refuses to see one call in two functions."""

    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: D102
        call = super().visit_call_(call)
        return relax.Call(call.op, call.args, call.attrs, call.ty_args, call.span)


@tvm.transform.module_pass(opt_level=0, name="RewriteGraphVariants")
def rewrite_graph_variants(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
    """`RewriteCUDAGraph` restricted to the `<fn>_graph` functions.

    TVM's pass looks at every function; prefill would get a small graph around whatever has
    static shapes (the final norm of the last token). Keeping graphs to the variants keeps
    the other entry functions plainly eager, which is what the runtime's switch promises.
    """
    graph_fns = {gv for gv, f in mod.functions.items()
                 if isinstance(f, relax.Function) and gv.name_hint.endswith(GRAPH_SUFFIX)}
    if not graph_fns:
        return mod
    part = tvm.IRModule({gv: f for gv, f in mod.functions.items()
                         if gv in graph_fns or not isinstance(f, relax.Function)}, attrs=mod.attrs)
    part = relax.transform.RewriteCUDAGraph()(part)
    for gv in graph_fns:
        part = params_into_capture(part, gv.name_hint)
    out = mod.clone()
    for gv, f in part.functions.items():
        out[gv] = f
    return out



def _uses(expr: relax.Expr) -> set[relax.Var]:
    """Every relax Var that `expr` reads."""
    seen: set[relax.Var] = set()

    @relax.expr_functor.visitor
    class _Collect(relax.PyExprVisitor):
        def visit_var_(self, op: relax.Var) -> None:
            seen.add(op)

        def visit_dataflow_var_(self, op: relax.DataflowVar) -> None:
            seen.add(op)

    _Collect().visit_expr(expr)
    return seen


def _run_or_capture_args(value: relax.Expr) -> tuple[relax.GlobalVar, relax.Tuple] | None:
    """(capture function, its argument tuple) when `value` is a `run_or_capture` builtin call."""
    # R.call_builtin_with_ctx(run_or_capture, (capture, (args...), entry_index[, shape]))
    if not isinstance(value, relax.Call) or len(value.args) != 2:
        return None
    fn, packed = value.args
    if not (isinstance(fn, relax.ExternFunc) and fn.global_symbol == "vm.builtin.cuda_graph.run_or_capture"):
        return None
    if not isinstance(packed, relax.Tuple) or len(packed.fields) < 2:
        return None
    capture, args = packed.fields[0], packed.fields[1]
    if isinstance(capture, relax.GlobalVar) and isinstance(args, relax.Tuple):
        return capture, args
    return None


def _block_like(block: relax.BindingBlock, bindings: list) -> relax.BindingBlock:
    return relax.DataflowBlock(bindings) if isinstance(block, relax.DataflowBlock) else relax.BindingBlock(bindings)


def params_into_capture(mod: tvm.IRModule, name: str) -> tvm.IRModule:
    """Move the weight tuple's unpacking of graph function `name` into its capture function.

    After `RewriteCUDAGraph` the outer function takes every weight out of its tuple parameter
    (one `TupleGetItem` each) and hands them to `run_or_capture` as one new tuple; the VM
    interprets all of that on every call although a replay launches the graph and nothing else:
    ~3,500 VM instructions for a 27B model's 1,735 weights, ~0.7 ms of host time per decode step.
    Here the capture function takes the weight tuple itself and unpacks it inside (which runs once,
    at capture), so a replay passes the tuple on. Weights the outer function also reads elsewhere
    stay unpacked there too. Functions with no or several graphs are left as they are.
    """
    gv = mod.get_global_var(name)
    func = mod[gv]
    tuples = [p for p in func.params if isinstance(p.ty, tvm.ir.TupleType)]
    if len(tuples) != 1 or not isinstance(func.body, relax.SeqExpr):
        return mod
    packed = tuples[0]
    getitems: dict[relax.Var, int] = {}
    sites = []
    for bi, block in enumerate(func.body.blocks):
        for ji, binding in enumerate(block.bindings):
            if not isinstance(binding, relax.VarBinding):
                continue
            value = binding.value
            if isinstance(value, relax.TupleGetItem) and value.tuple_value.same_as(packed):
                getitems[binding.var] = int(value.index)
            elif _run_or_capture_args(value) is not None:
                sites.append((bi, ji))
    if len(sites) != 1 or not getitems:
        return mod
    bi, ji = sites[0]
    site = func.body.blocks[bi].bindings[ji]
    capture_gv, args = _run_or_capture_args(site.value)
    capture = mod[capture_gv]
    if len(capture.params) != len(args.fields) or not isinstance(capture.body, relax.SeqExpr):
        return mod
    inner = relax.Var(packed.name, packed.ty)
    kept_args, kept_params, unpack = [], [], []
    for arg, param in zip(args.fields, capture.params, strict=True):
        if isinstance(arg, relax.Var) and arg in getitems:
            unpack.append(relax.VarBinding(param, relax.TupleGetItem(inner, getitems[arg])))
        else:
            kept_args.append(arg)
            kept_params.append(param)
    if not unpack:
        return mod
    body = relax.SeqExpr([relax.BindingBlock(unpack), *capture.body.blocks], capture.body.body)
    new_capture = relax.Function([*kept_params, inner], body, capture.ret_ty, capture.is_pure,
                                 capture.attrs, capture.span)
    call = site.value
    fields = call.args[1].fields
    new_args = [call.args[0], relax.Tuple([fields[0], relax.Tuple([*kept_args, packed]), *fields[2:]])]
    new_call = relax.Call(call.op, new_args, call.attrs, call.ty_args, call.span)
    blocks = list(func.body.blocks)
    bindings = list(blocks[bi].bindings)
    bindings[ji] = relax.VarBinding(site.var, new_call)
    blocks[bi] = _block_like(blocks[bi], bindings)
    # the unpacking bindings nothing reads any more
    rest = relax.SeqExpr(blocks, func.body.body)
    used = _uses(relax.SeqExpr([relax.BindingBlock([b for blk in blocks for b in blk.bindings
                                                     if b.var not in getitems])], func.body.body))
    blocks = [_block_like(blk, [b for b in blk.bindings if b.var not in getitems or b.var in used])
              for blk in rest.blocks]
    new_func = relax.Function(func.params, relax.SeqExpr(blocks, func.body.body), func.ret_ty,
                              func.is_pure, func.attrs, func.span)
    out = mod.clone()
    out[gv] = new_func
    out[capture_gv] = new_capture
    return out
