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
        mod[graph_name(name)] = relax.utils.copy_with_new_vars(graph)
    return mod


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
    out = mod.clone()
    for gv, f in part.functions.items():
        out[gv] = f
    return out
