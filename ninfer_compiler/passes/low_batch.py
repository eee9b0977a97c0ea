"""Schedule the matmuls of small-batch entry functions (decode) as low-batch GEMVs.

dlight's default rules give a matmul whose row count is symbolic (`x [b, 1, K]` in decode) the
SIMT `Matmul` schedule: at b = 1 that is N/64 blocks that each walk K serially in steps of 16
through shared memory with two barriers per step, so a projection takes about the same time
whatever its size (latency-bound, ~1.5% of the copy bandwidth on the H200). `LowBatchGEMV`
splits K over the lanes of a warp instead and reads each weight once per `bucket` rows
(tvm-0.27 notes 6.2: it accepts our two-block dequantize + fp32 reduction formulation).

Which kernels count as small-batch is read off the Relax entry functions: a PrimFunc qualifies
when every call of it comes from a function whose `tir_var_upper_bound` bounds each symbolic
dimension of the call to at most `max_rows` (decode's `b`), so prefill (`n` up to the chunk,
512 or 1024) keeps `Matmul`. Functions the rule does not match stay unscheduled for the default rules.
"""

from __future__ import annotations

import tvm
from tvm import relax, tirx

# Row counts bounded by this take the low-batch GEMV (decode's `max_batch`, 8 by default; a
# prefill chunk is larger); `bucket` rows share one weight read. Measured on the H200 (4-layer
# 27B proxy, docs/kernel-notes.md): bucket 4 gives 4.6 ms/step at batch 1 and 8.8 at batch 8,
# bucket 8 gives 7.3 and 8.5. Above the bound `Matmul` stays (MLC-style per-size dispatch: next).
LOW_BATCH_MAX_ROWS = 16
LOW_BATCH_BUCKET = 4


def _call_bounds(mod: tvm.IRModule) -> dict[tvm.ir.GlobalVar, list[int | None]]:
    """For each PrimFunc called through `call_tir`: per call, the product of the bounds of its
    symbolic dimensions (None when a dimension is unbounded, 0 when the call is static)."""
    call_tir = tvm.ir.Op.get("relax.call_tir")
    found: dict[tvm.ir.GlobalVar, list[int | None]] = {}
    for func in mod.functions.values():
        if not isinstance(func, relax.Function):
            continue
        attr = func.attrs.get("tir_var_upper_bound") if func.attrs else None
        bounds = {str(k): int(v) for k, v in attr.items()} if attr is not None else {}

        def visit(expr: relax.Expr, bounds: dict[str, int] = bounds) -> None:
            if not (isinstance(expr, relax.Call) and expr.op == call_tir):
                return
            sinfos = [expr.args[1].ty, *expr.ty_args]
            names = {v.name for s in sinfos for v in relax.analysis.tir_vars_in_type(s)}
            rows: int | None = 1 if names else 0
            for name in names:
                rows = None if rows is None or name not in bounds else rows * bounds[name]
            found.setdefault(expr.args[0], []).append(rows)

        relax.analysis.post_order_visit(func.body, visit)
    return found


def low_batch_functions(mod: tvm.IRModule, max_rows: int = LOW_BATCH_MAX_ROWS) -> list[tvm.ir.GlobalVar]:
    """Unscheduled PrimFuncs with a symbolic row count bounded by `max_rows` in every caller."""
    out = []
    for gv, calls in _call_bounds(mod).items():
        func = mod.functions.get(gv)
        if not isinstance(func, tirx.PrimFunc) or (func.attrs and func.attrs.get("tirx.is_scheduled")):
            continue
        # static calls (0) are left to GEMV (batch 1) and the default rules
        if calls and all(r is not None and 0 < r <= max_rows for r in calls):
            out.append(gv)
    return out


@tvm.transform.module_pass(opt_level=0, name="ScheduleLowBatchGEMV")
def schedule_low_batch(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
    """Apply `dlight.gpu.LowBatchGEMV` to the small-batch functions (under the current target)."""
    from tvm.s_tir import dlight as dl

    targets = low_batch_functions(mod)
    if not targets:
        return mod
    part = tvm.IRModule({gv: mod[gv] for gv in targets})
    part = dl.ApplyDefaultSchedule(dl.gpu.LowBatchGEMV(LOW_BATCH_BUCKET))(part)
    out = mod.clone()
    for gv, func in part.functions.items():
        if func.attrs and func.attrs.get("tirx.is_scheduled"):
            out[gv] = func
    return out
