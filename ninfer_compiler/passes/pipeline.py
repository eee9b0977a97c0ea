"""The Relax pass pipeline, one readable list per target kind.

Why our own list instead of `relax_pipeline="default"`: for `llvm` the default skips
FuseOps/FuseTIR, and no default runs `FuseTransposeMatmul` (without it every `nn.Linear`
transposes its weight into scratch memory on every call). Memory planning of dynamic
dimensions relies on the `tir_var_upper_bound` attribute that `build.py` sets per function.
"""

from __future__ import annotations

import tvm
from tvm import relax

from ..codegen.graphs import rewrite_graph_variants
from .add_norm import fold_add_norms_pass
from .low_batch import schedule_low_batch
from .norm_prologue import fold_norm_prologues_pass


def _fusion_passes() -> list[tvm.transform.Pass]:
    return [
        relax.transform.FuseTransposeMatmul(),
        relax.backend.DispatchSampling(),
        relax.backend.DispatchSortScan(),
        relax.transform.LegalizeOps(),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
    ]


def _schedule_passes(target: tvm.target.Target) -> list[tvm.transform.Pass]:
    """Target schedules for TE-generated kernels; our TIR kernels are marked scheduled.

    Decode's matmuls (symbolic batch bounded by `max_batch`) take the low-batch GEMV first
    (`low_batch.py`); the default rules then schedule what is left (prefill matmuls: `Matmul`).
    """
    if target.kind.name == "llvm":
        return []  # the scalar lowering of unscheduled TIR is correct on CPU
    from tvm.s_tir import dlight as dl

    return [
        schedule_low_batch,
        dl.ApplyDefaultSchedule(
            dl.gpu.Matmul(),
            dl.gpu.GEMV(),
            dl.gpu.Reduction(),
            dl.gpu.GeneralReduction(),
            dl.gpu.Fallback(),
        )
    ]


def _lowering_passes(target: tvm.target.Target) -> list[tvm.transform.Pass]:
    # CUDA graphs (TVM's RewriteCUDAGraph, for the `<fn>_graph` variants only) act only under the
    # `relax.backend.use_cuda_graph` pass config, after StaticPlanBlockMemory gave the
    # intermediates static storage.
    graphs = [rewrite_graph_variants] if target.kind.name == "cuda" else []
    return [
        relax.transform.RewriteDataflowReshape(),
        relax.transform.ToNonDataflow(),
        relax.transform.RemovePurityChecking(),
        relax.transform.CallTIRRewrite(),
        relax.transform.StaticPlanBlockMemory(),
        *graphs,
        relax.transform.LowerAllocTensor(),
        relax.transform.KillAfterLastUse(),
        relax.transform.LowerRuntimeBuiltin(),
        relax.transform.ComputePrimValue(),
        relax.transform.VMShapeLower(),
        relax.transform.AttachGlobalSymbol(),
    ]


def _extern_passes(target: tvm.target.Target) -> list[tvm.transform.Pass]:
    """Rewrites among our CUDA externs: the decode RMS norms folded into the int8 launches reading
    them, then (the rest) into the residual-add GEMVs producing their input."""
    return [fold_norm_prologues_pass, fold_add_norms_pass] if target.kind.name == "cuda" else []


def relax_passes(target: tvm.target.Target) -> list[tvm.transform.Pass]:
    """The ordered pass list for `target` (readable top to bottom, testable)."""
    return _extern_passes(target) + _fusion_passes() + _schedule_passes(target) + _lowering_passes(target)


def relax_pipeline(target: tvm.target.Target) -> tvm.transform.Pass:
    """The Relax pipeline for `target`, to pass as `tvm.compile(..., relax_pipeline=...)`."""
    passes = relax_passes(target)

    @tvm.transform.module_pass(opt_level=0, name="NinferRelaxPipeline")
    def _pipeline(mod: tvm.ir.IRModule, _ctx: tvm.transform.PassContext) -> tvm.ir.IRModule:
        with target:
            return tvm.transform.Sequential(passes)(mod)

    return _pipeline
