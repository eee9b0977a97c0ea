"""The CUDA-graph decode variant: the whole step is one captured region, other entries stay eager."""

from __future__ import annotations

import re

import tvm
from tvm import relax

from ninfer_compiler.build import export_module
from ninfer_compiler.codegen.graphs import add_graph_variants, bucket_sizes
from ninfer_compiler.codegen.targets import tvm_target
from ninfer_compiler.frontend.options import ModelOptions
from ninfer_compiler.frontend.qwen3_5.config import Qwen35TextConfig
from ninfer_compiler.frontend.qwen3_5.model import Qwen35ForCausalLM
from ninfer_compiler.passes.pipeline import relax_pipeline
from ninfer_runtime import targets
from tests.compiler.test_build import TEXT


def test_buckets():
    assert bucket_sizes(8) == [1, 2, 4, 8]
    assert bucket_sizes(6) == [1, 2, 4, 6]
    assert bucket_sizes(1) == [1]


def test_decode_graph_captures_the_whole_step():
    target = tvm_target(targets.load("h200"))
    model = Qwen35ForCausalLM(Qwen35TextConfig.from_dict(TEXT), ModelOptions(dtype="bfloat16"))
    with target:
        mod, _ = export_module(model, model.upper_bounds(max_prefill_tokens=64, max_batch=4))
    mod = add_graph_variants(mod)
    assert int(mod["decode_graph"].attrs["num_input"]) == 0
    with tvm.transform.PassContext(config={"relax.backend.use_cuda_graph": True}):
        mod = relax_pipeline(target)(mod)
    relax_fns = {gv.name_hint: f for gv, f in mod.functions.items() if isinstance(f, relax.Function)}
    assert sorted(n for n in relax_fns if "capture" in n) == ["decode_graph_cuda_graph_capture"]
    graph = relax_fns["decode_graph"].script()
    assert graph.count("vm.builtin.cuda_graph.run_or_capture") == 1
    for eager in ("decode", "prefill", "prefill_all_logits"):
        assert "run_or_capture" not in relax_fns[eager].script(), eager
    # every kernel runs inside the graph except the one writing the logits (allocated per call);
    # the greedy choice after it is an extern call (`ninfer_greedy_choice`), also outside
    kernels = [gv.name_hint for gv, f in mod.functions.items()
               if isinstance(f, tvm.tirx.PrimFunc) and not gv.name_hint.startswith("shape_func")]  # host shape code

    def launches(script: str) -> list[str]:
        return [line.strip() for line in script.splitlines()
                if any(line.strip().startswith(f"{k}(") for k in kernels)]

    def externs(script: str) -> list[str]:  # extern kernels (the decode norms, the greedy choice)
        return re.findall(r'R\.call_packed\("(ninfer_\w+)"', script)

    outside = launches(graph)
    captured = relax_fns["decode_graph_cuda_graph_capture"].script()
    inside = launches(captured)
    assert len(outside) == 1 and outside[0].startswith("fused_dense_nt"), outside
    assert set(externs(graph)) == {"ninfer_greedy_choice"}, externs(graph)
    assert "ninfer_rms_norm" in externs(captured)
    assert len(inside) + len(externs(captured)) > 30
    assert len(inside) + 1 == len(launches(relax_fns["decode"].script()))


def test_decode_graph_replay_does_not_unpack_the_weights():
    """The weight tuple goes to the capture function whole (`params_into_capture`): a replay runs
    no per-weight VM instruction; only weights read outside the graph stay unpacked outside."""
    target = tvm_target(targets.load("h200"))
    model = Qwen35ForCausalLM(Qwen35TextConfig.from_dict(TEXT), ModelOptions(dtype="bfloat16"))
    with target:
        mod, _ = export_module(model, model.upper_bounds(max_prefill_tokens=64, max_batch=4))
    mod = add_graph_variants(mod)
    with tvm.transform.PassContext(config={"relax.backend.use_cuda_graph": True}):
        mod = relax_pipeline(target)(mod)
    graph = mod["decode_graph"]
    packed = graph.params[-1]
    n_weights = len(packed.ty.fields)
    outer = graph.script()
    capture = mod["decode_graph_cuda_graph_capture"]
    inner = capture.script()
    unpacked_outside = len(re.findall(rf"\b{packed.name}\[\d+\]", outer))
    unpacked_inside = len(re.findall(rf"\b{capture.params[-1].name}\[\d+\]", inner))
    # the output head (the logits are allocated per call, outside the graph) is the one weight left
    assert unpacked_outside == 1, unpacked_outside
    assert unpacked_inside >= n_weights - 1, (unpacked_inside, n_weights)  # (+ its shape checks)
    assert isinstance(capture.params[-1].ty, tvm.ir.TupleType)
    call = re.search(r'run_or_capture", \(decode_graph_cuda_graph_capture, \(([^()]*)', outer)
    assert call is not None and packed.name in call.group(1).split(", "), outer


def test_graph_variant_shares_no_call_with_decode():
    """An allocation of a static shape (no variable in it) is a call node `copy_with_new_vars`
    would leave shared between `decode` and its graph variant; StaticPlanBlockMemory then fails
    ("token_map_.count(call)"). The variant gets its own nodes, and the pipeline plans both."""
    b = tvm.tirx.Var("b", "int64")
    x = relax.Var("x", relax.TensorType([b, 4], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("decode", [x], attrs={"global_symbol": "decode"}):
        with bb.dataflow():
            scratch = bb.emit(relax.op.builtin.alloc_tensor(relax.ShapeExpr([16]), "uint8", 0))
            y = bb.emit_output(relax.op.add(x, x))
        bb.emit_func_output(relax.Tuple([y, scratch]))
    mod = add_graph_variants(bb.get())

    def calls(func: relax.Function) -> set[int]:  # the call nodes' addresses
        found: set[int] = set()
        relax.analysis.post_order_visit(func.body, lambda e: found.add(e.__chandle__()) if isinstance(e, relax.Call)
                                        else None)
        return found

    assert calls(mod["decode"]) and not calls(mod["decode"]) & calls(mod["decode_graph"])
    with tvm_target(targets.load("h200")), tvm.transform.PassContext(config={"relax.backend.use_cuda_graph": True}):
        relax.transform.StaticPlanBlockMemory()(relax.transform.ToNonDataflow()(mod))
