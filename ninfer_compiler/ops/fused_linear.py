"""Projections fused with their neighbours: several weights on one input, SwiGLU, residual add.

Why: on the GPU every projection launch has a fixed cost (ramp, tail, launch gap) and every
elementwise op between projections is a kernel of its own that re-reads and re-writes its
activations. Decode runs ~8 projections per layer on the same few kilobytes of activations, so
the decode GEMVs (`ops/qgemv.py`) and prefill GEMMs (`ops/qgemm.py`) offer fused forms: one
launch for all the weights that read the same input, the SwiGLU product computed from the gate and
up accumulators, and the residual added before the single rounding of the output.

The functions here take the projection modules (`Linear`, `QuantizedLinear`) and choose: the fused
kernel when the target and the weights allow it, else exactly the unfused composition (the CPU
path, the reference kernels, nvfp4 weights, unsupported shapes), so a model reads the same either way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import op

from . import qgemm, qgemv, xq_quantize
from .common import kernel_feature, tuned_cuda_kernels
from .linear_weight import LinearWeight, linear_weight


def _decode_shaped(x: nn.Tensor) -> bool:
    shape = x.shape
    return len(shape) == 3 and isinstance(shape[1], int) and shape[1] == 1


# the decode GEMVs' name for each fused form (their `fused_supported` checks per form)
_GEMV_FORMS = {"gemv_multi": "multi", "gemv_swiglu": "swiglu", "gemv_add": "add"}


def _kernel(name: str, x: nn.Tensor, modules: Sequence[nn.Module]) -> tuple[Callable | None, list[LinearWeight]]:
    """The fused op `name` of the kernel family that fits `x` (decode GEMV or prefill GEMM) and the
    modules' weights, or None when the unfused composition must run."""
    if not tuned_cuda_kernels():
        return None, []
    weights = [linear_weight(m) for m in modules]
    if any(w is None for w in weights):
        return None, []
    fn = getattr(qgemv if _decode_shaped(x) else qgemm, name, None)
    if fn is None:
        return None, []
    if _decode_shaped(x):
        ok = qgemv.fused_supported(x, weights, op=_GEMV_FORMS[name])
    else:
        ok = qgemm.fused_supported(x, weights)
    return (fn, weights) if ok else (None, [])


def multi_linear(x: nn.Tensor, groups: Sequence[Sequence[nn.Module]], xq: nn.Tensor | None = None) -> list[nn.Tensor]:
    """For each group, the concatenation (last axis) of its modules' outputs on `x`.

    One fused launch for all groups when the kernel takes every weight; else one for the groups it
    takes (e.g. the grouped-int projections beside bf16 gates) and the plain modules for the rest.
    `xq`: x also as the norm's int8 activations (`norm_int8_for_multi`), which the one decode launch
    over every group reads where its int8 entry runs (x is read otherwise)."""
    fn, weights = _kernel("gemv_multi", x, [m for g in groups for m in g])
    if fn is not None:
        it = iter(weights)
        ws = [[next(it) for _ in g] for g in groups]
        return list(fn(x, ws, xq) if xq is not None and _decode_shaped(x) else fn(x, ws))
    fused = [i for i, g in enumerate(groups) if _kernel("gemv_multi", x, list(g))[0] is not None]
    outs: list[nn.Tensor | None] = [None] * len(groups)
    if fused:
        fn, weights = _kernel("gemv_multi", x, [m for i in fused for m in groups[i]])
        if fn is not None:
            it = iter(weights)
            for i, y in zip(fused, fn(x, [[next(it) for _ in groups[i]] for i in fused]), strict=True):
                outs[i] = y
    # small bf16 projections left over (the GDN gates a, b) pairwise in one dense launch
    single = [i for i, g in enumerate(groups) if outs[i] is None and len(g) == 1]
    single_weights = [linear_weight(groups[i][0]) for i in single]
    if _decode_shaped(x) and tuned_cuda_kernels():
        for j in range(0, len(single) - 1, 2):
            ws = single_weights[j:j + 2]
            if None not in ws and qgemv.dense_pair_supported(x, ws):
                outs[single[j]], outs[single[j + 1]] = qgemv.dense_gemv_pair(x, ws[0].base, ws[1].base)
    for i, group in enumerate(groups):
        if outs[i] is None:
            parts = [m(x) for m in group]
            outs[i] = parts[0] if len(parts) == 1 else op.concat(parts, dim=-1)
    return outs


def norm_int8_for_multi(x: nn.Tensor, norm_weight: nn.Tensor, eps: float, offset: bool,
                        modules: Sequence[nn.Module]) -> tuple[nn.Tensor, nn.Tensor] | None:
    """`(rms_norm(x), its int8 activations)` from one decode norm kernel when the q4 + q5 projections
    `modules` of the norm's output can read int8 activations in their multi launch (the opt-in kernel
    feature "gemv_int8_multi", `qgemv.norm_multi_int8_supported`), else None (the caller runs its norm)."""
    if not (_decode_shaped(x) and tuned_cuda_kernels()):
        return None
    weights = [linear_weight(m) for m in modules]
    if not qgemv.norm_multi_int8_supported(x, norm_weight, [weights]):
        return None
    return qgemv.rms_norm_xq(x, norm_weight, eps, offset)


def swiglu(x: nn.Tensor, gate: nn.Module, up: nn.Module) -> nn.Tensor:
    """`silu(gate(x)) * up(x)`."""
    name = "gemv_swiglu" if _decode_shaped(x) else "qgemm_swiglu"
    fn, weights = _kernel(name, x, [gate, up])
    if fn is not None:
        return fn(x, *weights)
    return op.silu(gate(x)) * up(x)


def norm_swiglu(x: nn.Tensor, norm_weight: nn.Tensor, eps: float, offset: bool, gate: nn.Module,
                up: nn.Module) -> nn.Tensor | None:
    """`swiglu(rms_norm(x), gate, up)` where the decode norm can hand the SwiGLU its output as int8
    activations too (q4 gate / up: `qgemv.norm_swiglu_int8_supported`), else None (the caller runs
    the norm and `swiglu`)."""
    if not _decode_shaped(x) or not tuned_cuda_kernels():
        return None
    wg, wu = linear_weight(gate), linear_weight(up)
    if not qgemv.norm_swiglu_int8_supported(x, norm_weight, wg, wu):
        return None
    xn, xq = qgemv.rms_norm_xq(x, norm_weight, eps, offset)
    return qgemv.gemv_swiglu(xn, wg, wu, xq)


def norm_mlp_add(x: nn.Tensor, norm_weight: nn.Tensor, eps: float, offset: bool, gate: nn.Module, up: nn.Module,
                 down: nn.Module) -> nn.Tensor | None:
    """`x + down(swiglu(rms_norm(x), gate, up))` with int8 activations between all three kernels at
    decode (the norm's for the q4 gate / up, the SwiGLU's for the q4 / q5 down:
    `qgemv.mlp_int8_supported`; under the kernel feature "gemv_int8_mlp_kernel" quantized by
    `xq_quantize` rather than by the SwiGLU), else None (the caller composes `norm_swiglu` and
    `linear_add`)."""
    if not _decode_shaped(x) or not tuned_cuda_kernels():
        return None
    wg, wu, wd = linear_weight(gate), linear_weight(up), linear_weight(down)
    if not qgemv.mlp_int8_supported(x, norm_weight, wg, wu, wd):
        return None
    xn, xq = qgemv.rms_norm_xq(x, norm_weight, eps, offset)
    if kernel_feature("gemv_int8_mlp_kernel"):
        # the SwiGLU's output (N % 256 == 0: mlp_int8_supported) quantized by a kernel of its own
        # between the two launches, at the rows the handover entry reads it (one), instead of by
        # the SwiGLU's last blocks
        h = qgemv.gemv_swiglu(xn, wg, wu, xq)
        hq = xq_quantize.xq_quantize(h, max_rows=qgemv.XQ_HANDOVER_ROWS)
        return qgemv.gemv_add_i8(h, hq, wd, x, handover=True)
    h, hq = qgemv.gemv_swiglu_xq(xn, wg, wu, xq)
    return qgemv.gemv_add_i8(h, hq, wd, x, handover=True)


def add_reads_int8(x: nn.Tensor, module: nn.Module, feature: str) -> bool:
    """Whether `linear_add_i8(x, xq, module, ...)` would read int8 activations of the decode input `x`
    (`qgemv.add_int8_input_supported` under kernel feature `feature`): a producer asks before writing them."""
    return _decode_shaped(x) and tuned_cuda_kernels() and qgemv.add_int8_input_supported(
        x, linear_weight(module), feature)


def linear_add_i8(x: nn.Tensor, xq: nn.Tensor, module: nn.Module, residual: nn.Tensor) -> nn.Tensor:
    """`linear_add(x, module, residual)` reading x as the int8 activations `xq` (<= 4 rows, written by
    x's producer where `add_reads_int8` said so)."""
    return qgemv.gemv_add_i8(x, xq, linear_weight(module), residual)


def linear_add(x: nn.Tensor, module: nn.Module, residual: nn.Tensor) -> nn.Tensor:
    """`residual + module(x)`."""
    name = "gemv_add" if _decode_shaped(x) else "qgemm_add"
    fn, weights = _kernel(name, x, [module])
    if fn is not None:
        return fn(x, weights[0], residual)
    return residual + module(x)
