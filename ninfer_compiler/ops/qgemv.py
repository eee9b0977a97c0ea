"""Our decode GEMVs (`qgemv_cuda.cu`) as externs of the exported model.

Why: dlight's GEMV over the uint8 planes loads a byte per weight and is instruction-bound
(docs/kernel-notes.md, v1 at 4-16% of bandwidth). The CUDA kernel is compiled here by nvcc to a
fatbin with SASS for exactly the target's arch (no PTX, cached like TVM's kernels), embedded as
bytes into a small C++ launcher (`qgemv_host.cc`, driver API) and linked into the package as an
`nn.SourceModule`; `codegen.fatbin.inspect_library` sees its fatbin like TVM's own.

Two externs: `ninfer_qgemv` (grouped-int planes: v4/v3 tensor-core kernels for q4/q5/q6 with bf16
activations, v2 for q8, fp32 and small batch-1 projections; the launcher picks per shape and batch) and `ninfer_dense_gemv` (bf16 weights of small-N decode projections such
as the GDN gates, which dlight runs in 1-2 blocks). The second is the same sources built with
`NINFER_GEMV_DENSE_ONLY`, so a package carries only the kernels it calls.

The grouped-int launcher also exports the fused decode ops on v2/v3/v4 (kernel feature
"gemv4_fused", docs/kernels/decode-gemv-v4.md "v4.2"): `ninfer_qgemv_multi` (each weight's launch
writes its slice of a concatenated output), `ninfer_qgemv_add` and `ninfer_qgemv_swiglu` (v4
epilogues), and the dense launcher `ninfer_rms_norm` (the decode norms; there so that bf16 packages carry it
without the grouped-int kernels); every launch is chained to the previous kernel by Programmatic
Dependent Launch. `ninfer_qgemv_add_norm[_xq]` (the residual add whose last block also computes the
RMS norm of its output) is not called from here: `passes/add_norm.py` folds add + norm pairs into it
under the opt-in kernel feature "gemv_add_norm".

A third, v5 (`qgemv5_cuda.cu`, launcher `qgemv5_host.cc`, docs/kernels/decode-gemv-v5.md), runs the
same fused decode ops its own way (opt-in): `gemv_multi` (several outputs, each the concatenation of several weights' rows,
one launch), `gemv_swiglu` and `gemv_add`, over q4/q5/q6 planes and dense bf16 weights, chained
with Programmatic Dependent Launch. `fused_accepts` says which inputs they take; `fused_supported`
(what the dispatcher asks) also needs `v5_enabled()`, off by default until v5 is measured faster.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import tvm
from tvm import relax, tirx
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn.core import wrap_nested
from tvm.relax.frontend.nn.exporter import Exporter

from ..codegen.toolchain import nvcc_fatbin
from . import cuda_extern, pdl
from .common import kernel_feature, tuned_cuda_kernels
from .linear_weight import LinearWeight
from .row_split import grouped_format

HERE = Path(__file__).resolve().parent
DEVICE_SOURCE = HERE / "qgemv_cuda.cu"
HOST_SOURCE = HERE / "qgemv_host.cc"
CODES_HEADER = HERE / "qgemv_codes.h"  # code pairs shared by the v3/v4 and v5 kernels
LAUNCH_HEADER = HERE / "cuda_launch.h"  # cuLaunchKernelEx's structs, for both launchers
SYMBOL = "ninfer_qgemv"
ADD_SYMBOL, SWIGLU_SYMBOL, MULTI_SYMBOL = "ninfer_qgemv_add", "ninfer_qgemv_swiglu", "ninfer_qgemv_multi"
SWIGLU_I8_SYMBOL = "ninfer_qgemv_swiglu_i8"  # the SwiGLU on the norm's int8 activations (q4, <= 4 rows)
SWIGLU_I8X_SYMBOL = "ninfer_qgemv_swiglu_i8x"  # ... also writing its output as int8 activations
ADD_I8_SYMBOL = "ninfer_qgemv_add_i8"  # the residual-add projection on int8 activations (q4 / q5)
ADD_I8H_SYMBOL = "ninfer_qgemv_add_i8h"  # ... written by the SwiGLU (read at the rows it writes them)
MULTI_I8_SYMBOL = "ninfer_qgemv_multi_i8"  # the multi launch, its mixed q4 + q5 part on int8 activations
# the decode norm and the launch reading its int8 activations as one call (passes/norm_prologue.py): at
# one row the launch computes the norm in its prologue, else the norm kernel runs first
NORM_MULTI_I8_SYMBOL = "ninfer_qgemv_norm_multi_i8"
NORM_SWIGLU_I8X_SYMBOL = "ninfer_qgemv_norm_swiglu_i8x"
XQ_HANDOVER_ROWS = 1  # qgemv_host.cc NINFER_XQ_HANDOVER_ROWS: rows at which the down projection reads the MLP's int8
XQ_MAX_OUTPUTS = 64 * 8192  # qgemv_cuda.cu V4_XQ_GROUPS: outputs of a SwiGLU writing int8 activations
ADD_NORM_SYMBOL = "ninfer_qgemv_add_norm"  # the residual add, then the RMS norm of its output (passes/add_norm.py)
ADD_NORM_XQ_SYMBOL = "ninfer_qgemv_add_norm_xq"  # ... the norm also writing int8 activations
NORM_SYMBOL = "ninfer_rms_norm"
NORM_XQ_SYMBOL = "ninfer_rms_norm_xq"  # the norm, also writing its output as int8 activations (xq)
NORM_MAX_K = 8192  # qgemv_cuda.cu NORM_VECS x 8 x 256 threads
DENSE_SYMBOL = "ninfer_dense_gemv"
DENSE_PAIR_SYMBOL = "ninfer_dense_gemv_pair"
DENSE_MAX_ROWS = 256  # one block per row: small N only (cuBLAS-level or better up to ~256 rows; see notes)
MAX_ROWS = 8  # decode batch rows per weight read (larger batches loop in the launcher)
V4_STAGES = {4: 2, 5: 2, 6: 2}  # v4 ring depth per format (NINFER_V4_STAGES_Q* in both sources)


def supported(x: nn.Tensor, rows: int, in_features: int) -> bool:
    """Decode-shaped call (`[b, 1, K]`) on a CUDA target with shapes the kernel handles."""
    target = tvm.target.Target.current(allow_none=True)
    if target is None or target.kind.name != "cuda" or str(x.dtype) not in ("bfloat16", "float32"):
        return False
    shape = x.shape
    return len(shape) == 3 and isinstance(shape[1], int) and shape[1] == 1 and in_features % 128 == 0 and rows % 4 == 0


def dense_supported(x: nn.Tensor, weight: nn.Tensor) -> bool:
    """Decode-shaped (`[b, 1, K]`) bf16 x bf16 call with a small N on a CUDA target."""
    target = tvm.target.Target.current(allow_none=True)
    if target is None or target.kind.name != "cuda" or str(x.dtype) != "bfloat16" or str(weight.dtype) != "bfloat16":
        return False
    shape, (rows, k) = x.shape, weight.shape
    return (len(shape) == 3 and isinstance(shape[1], int) and shape[1] == 1 and isinstance(rows, int)
            and isinstance(k, int) and k % 8 == 0 and rows <= DENSE_MAX_ROWS)


def codes_key() -> str:
    """A define naming the shared code-pair header's content (`qgemv_codes.h`): the kernel cache keys
    on the source file's bytes, so its includes must enter the key through the flags."""
    digest = hashlib.sha256(CODES_HEADER.read_bytes()).hexdigest()[:16]
    return f"NINFER_CODES_KEY=0x{digest}"


def fatbin_defines(dense: bool = False) -> tuple[str, ...]:
    """The nvcc switches of the package's kernels (`dense`: the dense kernels alone; the code-pair
    header's key; the PDL order of the kernel feature `pdl_early`)."""
    return (("NINFER_GEMV_DENSE_ONLY",) if dense else ()) + (codes_key(),) + pdl.cuda_defines()


def fatbin(arch: str, dense: bool = False) -> bytes:
    """nvcc's fatbin of the kernels for `arch` (SASS only, cached; `dense`: the dense kernels alone)."""
    return nvcc_fatbin(DEVICE_SOURCE, arch, fatbin_defines(dense), tag="qgemv")


def host_source(arch: str, dense: bool = False) -> str:
    """The launcher's C++ with the fatbin embedded (and the dense-only switch for `dense`)."""
    data = fatbin(arch, dense)
    body = ",".join(str(b) for b in data)
    return (("#define NINFER_GEMV_DENSE_ONLY 1\n" if dense else "")
            + LAUNCH_HEADER.read_text() + "\n"
            + f"alignas(64) static const unsigned char NINFER_QGEMV_FATBIN[{len(data)}] = {{{body}}};\n"
            + HOST_SOURCE.read_text())


def _infer_qgemv(x: nn.Tensor, base: nn.Tensor, high: nn.Tensor, scales: nn.Tensor, bits: int) -> nn.Tensor:
    return nn.Tensor.placeholder([*x.shape[:-1], base.shape[0]], x.dtype)


def _infer_dense(x: nn.Tensor, weight: nn.Tensor) -> nn.Tensor:
    return nn.Tensor.placeholder([*x.shape[:-1], weight.shape[0]], x.dtype)


def _infer_dense_pair(x: nn.Tensor, weight: nn.Tensor, weight2: nn.Tensor) -> tuple[nn.Tensor, nn.Tensor]:
    return _infer_dense(x, weight), _infer_dense(x, weight2)


def _infer_qgemv_add(x: nn.Tensor, base: nn.Tensor, high: nn.Tensor, scales: nn.Tensor, bits: int,
                     residual: nn.Tensor) -> nn.Tensor:
    return nn.Tensor.placeholder(list(residual.shape), residual.dtype)


def _infer_qgemv_add_norm(x: nn.Tensor, base: nn.Tensor, high: nn.Tensor, scales: nn.Tensor, bits: int,
                          residual: nn.Tensor, weight: nn.Tensor, eps: float, offset: float) -> tuple[nn.Tensor, nn.Tensor]:
    y = _infer_qgemv_add(x, base, high, scales, bits, residual)
    return y, _infer_norm(y, weight, eps, offset)


def _infer_qgemv_add_norm_xq(x: nn.Tensor, base: nn.Tensor, high: nn.Tensor, scales: nn.Tensor, bits: int,
                             residual: nn.Tensor, weight: nn.Tensor, eps: float,
                             offset: float) -> tuple[nn.Tensor, nn.Tensor, nn.Tensor]:
    y, yn = _infer_qgemv_add_norm(x, base, high, scales, bits, residual, weight, eps, offset)
    return y, yn, nn.Tensor.placeholder([xq_bytes(int(y.shape[-1]))], "uint8")


def _infer_qgemv_swiglu(x: nn.Tensor, bits: int, gate: nn.Tensor, *planes: nn.Tensor) -> nn.Tensor:
    return nn.Tensor.placeholder([*x.shape[:-1], gate.shape[0]], x.dtype)


def _infer_norm(x: nn.Tensor, weight: nn.Tensor, eps: float, offset: float) -> nn.Tensor:
    return nn.Tensor.placeholder(list(x.shape), x.dtype)


def xq_bytes(k: int) -> int:
    """Bytes of the int8 activations of a K-wide input (`qgemv_cuda.cu` v4_stage_i8's xq layout:
    512 bytes per group of 64, then a float scale per group and row 0..3)."""
    return k * 8 + k // 256 * 64


def _infer_norm_xq(x: nn.Tensor, weight: nn.Tensor, eps: float, offset: float) -> tuple[nn.Tensor, nn.Tensor]:
    return _infer_norm(x, weight, eps, offset), nn.Tensor.placeholder([xq_bytes(int(x.shape[-1]))], "uint8")


def _infer_qgemv_swiglu_i8(x: nn.Tensor, xq: nn.Tensor, bits: int, gate: nn.Tensor, *planes: nn.Tensor) -> nn.Tensor:
    return _infer_qgemv_swiglu(x, bits, gate, *planes)


def _infer_qgemv_swiglu_i8x(x: nn.Tensor, xq: nn.Tensor, bits: int, gate: nn.Tensor,
                            *planes: nn.Tensor) -> tuple[nn.Tensor, nn.Tensor]:
    return (_infer_qgemv_swiglu(x, bits, gate, *planes),
            nn.Tensor.placeholder([xq_bytes(int(gate.shape[0]))], "uint8"))


def _infer_qgemv_add_i8(x: nn.Tensor, xq: nn.Tensor, base: nn.Tensor, high: nn.Tensor, scales: nn.Tensor, bits: int,
                        residual: nn.Tensor) -> nn.Tensor:
    return _infer_qgemv_add(x, base, high, scales, bits, residual)


def _infer_qgemv_multi(x: nn.Tensor, n_out: int, *rest) -> tuple[nn.Tensor, ...]:
    """(x, n_out, n_0 .. n_{n_out-1}, then 4 arguments per weight: a code, base, high, scales)."""
    counts, planes = rest[:n_out], rest[n_out:]
    outs, i = [], 0
    for n in counts:
        rows = 0
        for _ in range(n):
            rows += int(planes[i + 1].shape[0])
            i += 4
        outs.append(nn.Tensor.placeholder([*x.shape[:-1], rows], x.dtype))
    return tuple(outs)


def _infer_qgemv_multi_i8(x: nn.Tensor, xq: nn.Tensor, n_out: int, *rest) -> tuple[nn.Tensor, ...]:
    return _infer_qgemv_multi(x, n_out, *rest)


def _infer_norm_multi_i8(x: nn.Tensor, weight: nn.Tensor, eps: float, offset: float, n_out: int,
                         *rest) -> tuple[nn.Tensor, ...]:
    return (*_infer_norm_xq(x, weight, eps, offset), *_infer_qgemv_multi(x, n_out, *rest))


def _infer_norm_swiglu_i8x(x: nn.Tensor, weight: nn.Tensor, eps: float, offset: float, bits: int, gate: nn.Tensor,
                           *planes: nn.Tensor) -> tuple[nn.Tensor, ...]:
    return (*_infer_norm_xq(x, weight, eps, offset), *_infer_qgemv_swiglu_i8x(x, x, bits, gate, *planes))


def _extern(target: tvm.target.Target, dense: bool = False) -> nn.SourceModule:
    """A launcher module, registered once per export (a symbol may be added only once)."""
    exporter = Exporter.current()
    flag = "_ninfer_dense_gemv" if dense else "_ninfer_qgemv"
    module = getattr(exporter, flag, None)
    if module is not None:
        return module
    mtriple = str(target.host.attrs.get("mtriple", "")) if target.host is not None else ""
    compiler = f"{mtriple}-g++" if mtriple else None
    functions = ({DENSE_SYMBOL: _infer_dense, DENSE_PAIR_SYMBOL: _infer_dense_pair, NORM_SYMBOL: _infer_norm} if dense else
                 {SYMBOL: _infer_qgemv, ADD_SYMBOL: _infer_qgemv_add, SWIGLU_SYMBOL: _infer_qgemv_swiglu,
                  SWIGLU_I8_SYMBOL: _infer_qgemv_swiglu_i8, SWIGLU_I8X_SYMBOL: _infer_qgemv_swiglu_i8x,
                  ADD_I8_SYMBOL: _infer_qgemv_add_i8, ADD_I8H_SYMBOL: _infer_qgemv_add_i8, MULTI_SYMBOL: _infer_qgemv_multi,
                  MULTI_I8_SYMBOL: _infer_qgemv_multi_i8, NORM_MULTI_I8_SYMBOL: _infer_norm_multi_i8,
                  NORM_SWIGLU_I8X_SYMBOL: _infer_norm_swiglu_i8x,
                  ADD_NORM_SYMBOL: _infer_qgemv_add_norm, ADD_NORM_XQ_SYMBOL: _infer_qgemv_add_norm_xq})
    module = nn.SourceModule(
        functions,
        source_code=host_source(str(target.arch), dense),
        source_format="cpp",
        compile_options=[*nn.SourceModule.get_compile_options("cpp"), "-fPIC"],
        compiler=compiler,
    )
    nn.add_extern(module)
    setattr(exporter, flag, module)  # per-export registration flag
    return module


def qgemv(x: nn.Tensor, base: nn.Tensor, high: nn.Tensor | None, scales: nn.Tensor, fmt: str) -> nn.Tensor:
    """`y[b, 0, n] = sum_k x[b, 0, k] * W[n, k]` on the GPU through `qgemv_cuda.cu` (fp32 acc)."""
    target = tvm.target.Target.current()
    v5 = _plain_v5(x, base, high, scales, fmt)
    if v5 is not None:
        return gemv_multi(x, [[v5]])[0]
    bits = grouped_format(fmt).bits
    return _extern(target)[SYMBOL](x, base, base if high is None else high, scales, bits)


def dense_gemv(x: nn.Tensor, weight: nn.Tensor) -> nn.Tensor:
    """`y[b, 0, n] = sum_k x[b, 0, k] * weight[n, k]` (bf16, fp32 accumulation) on the GPU."""
    return _extern(tvm.target.Target.current(), dense=True)[DENSE_SYMBOL](x, weight)


def dense_pair_supported(x: nn.Tensor, weights: Sequence[LinearWeight]) -> bool:
    """Whether `dense_gemv_pair` takes these two weights (the "gemv4_fused" feature, each a small-N
    bf16 weight that `dense_gemv` takes)."""
    return (v4_fused_enabled() and len(weights) == 2
            and all(w.fmt == "bfloat16" and dense_supported(x, w.base) for w in weights))


def _call_outputs(symbol: str, args: list, outs: Sequence[nn.Tensor]) -> tuple[nn.Tensor, ...]:
    """A call of a registered extern with several outputs (nn's extern call takes one output only);
    int arguments become int64 prim values (relax expressions pass as they are)."""
    exprs = [a._expr if isinstance(a, nn.Tensor) else a if isinstance(a, relax.Expr)  # noqa: SLF001
             else relax.prim_value(tirx.IntImm("int64", a)) for a in args]
    call = relax.op.call_dps_packed(symbol, relax.Tuple(exprs), [o._expr.ty for o in outs])  # noqa: SLF001
    out = wrap_nested(call, symbol)
    return tuple(out) if isinstance(out, tuple | list) else (out,)


def dense_gemv_pair(x: nn.Tensor, weight: nn.Tensor, weight2: nn.Tensor) -> tuple[nn.Tensor, nn.Tensor]:
    """`dense_gemv` of two weights on one input in one launch (the GDN gates a and b)."""
    _extern(tvm.target.Target.current(), dense=True)  # registers the launcher
    a, b = _call_outputs(DENSE_PAIR_SYMBOL, [x, weight, weight2], _infer_dense_pair(x, weight, weight2))
    return a, b


# ---- v5: fused decode GEMVs -------------------------------------------------------------------

V5_DEVICE_SOURCE = HERE / "qgemv5_cuda.cu"
V5_HOST_SOURCE = HERE / "qgemv5_host.cc"
V5_PLAN_HEADER = HERE / "qgemv5_plan.h"
V5_MULTI, V5_SWIGLU, V5_ADD = "ninfer_qgemv5_multi", "ninfer_qgemv5_swiglu", "ninfer_qgemv5_add"
V5_FORMATS = {"q4_g64_fp16": 4, "q5_g64_fp16": 5, "q6_g64_fp16": 6, "bfloat16": 16}
V5_MAX_WEIGHTS = 8  # NINFER_V5_MAX_SEGS
V5_MAX_OUTPUTS = 8  # NINFER_V5_MAX_OUTS
V5_KSTEP = 128  # K must be a multiple of this (NINFER_V5_KSTEP)
# Whether the dispatcher gets the fused ops (`fused_supported`) and plain `qgemv` calls go to v5 is the
# opt-in kernel feature "gemv5" (`common.KERNEL_FEATURES`, `NINFER_KERNELS=+gemv5`): off until a device
# run shows v5 faster than the unfused v2/v3/v4 path (docs/kernels/decode-gemv-v5.md: the measured
# build was slower on most 27B launches).
# plain `qgemv` calls go to v5 (when enabled) from this many weights up
V5_PLAIN_MIN_WEIGHTS = 16 << 20


def v5_enabled() -> bool:
    """Whether decode projections use the v5 kernels (the opt-in kernel feature "gemv5")."""
    return kernel_feature("gemv5")


def fatbin_v5(arch: str) -> bytes:
    """nvcc's fatbin of the v5 kernels for `arch` (SASS only, cached; the key covers the plan header)."""
    digest = hashlib.sha256(V5_PLAN_HEADER.read_bytes()).hexdigest()[:16]
    return nvcc_fatbin(V5_DEVICE_SOURCE, arch, (f"NINFER_V5_PLAN_KEY=0x{digest}", codes_key()), tag="qgemv5")


def host_source_v5(arch: str) -> str:
    """The v5 launcher's C++: the plan header and the fatbin inlined before `qgemv5_host.cc`."""
    data = fatbin_v5(arch)
    body = ",".join(str(b) for b in data)
    return ("#define NINFER_V5_PLAN_INLINED 1\n" + LAUNCH_HEADER.read_text() + "\n" + V5_PLAN_HEADER.read_text() + "\n"
            + f"alignas(64) static const unsigned char NINFER_QGEMV5_FATBIN[{len(data)}] = {{{body}}};\n"
            + V5_HOST_SOURCE.read_text())


_infer_v5_multi = _infer_qgemv_multi  # the same argument layout (a format code per weight instead of bits)


def _infer_v5_swiglu(x: nn.Tensor, fmt: int, gate: nn.Tensor, *planes: nn.Tensor) -> nn.Tensor:
    return nn.Tensor.placeholder([*x.shape[:-1], gate.shape[0]], x.dtype)


def _infer_v5_add(x: nn.Tensor, fmt: int, base: nn.Tensor, high: nn.Tensor, scales: nn.Tensor,
                  residual: nn.Tensor) -> nn.Tensor:
    return nn.Tensor.placeholder(list(residual.shape), residual.dtype)


def _v5_extern() -> nn.SourceModule:
    arch = cuda_extern.current_arch()
    launcher = host_source_v5(arch)
    functions = {V5_MULTI: _infer_v5_multi, V5_SWIGLU: _infer_v5_swiglu, V5_ADD: _infer_v5_add}
    return cuda_extern.extern("qgemv5", functions, launcher, [])


def _v5_args(w: LinearWeight) -> list:
    """(fmt code, base, high, scales) of one weight as the launcher takes them."""
    fmt = V5_FORMATS[w.fmt]
    if fmt == 16:
        return [fmt, w.base, w.base, w.base]
    return [fmt, w.base, w.base if w.high is None else w.high, w.scales]


def _weight_ok(w: LinearWeight, k: int) -> bool:
    if w.fmt not in V5_FORMATS or w.cols != k or w.rows <= 0:
        return False
    if w.fmt == "bfloat16":
        return w.rows % 8 == 0 and [int(d) for d in w.base.shape] == [w.rows, k]
    if w.scales is None or (w.fmt != "q4_g64_fp16" and w.high is None):
        return False
    return w.rows % 16 == 0 and int(w.base.shape[0]) == w.rows and int(w.base.shape[1]) == k // 2


def fused_supported(x: nn.Tensor, weights: Sequence[LinearWeight], *, op: str = "multi") -> bool:
    """Whether the dispatcher should use the fused ops (`gemv_multi`, `gemv_swiglu`, `gemv_add`) for
    `x` and `weights` here: v5's (`v5_enabled()` and `fused_accepts`) or v4's (the kernel feature
    "gemv4_fused" and `v4_fused_accepts`)."""
    if v5_enabled():
        return fused_accepts(x, weights, op=op)
    return v4_fused_enabled() and v4_fused_accepts(x, weights, op=op)


# ---- v4 fused: the launcher's epilogues (qgemv_host.cc `run`) ------------------------------------

V4_BITS = {"q4_g64_fp16": 4, "q5_g64_fp16": 5, "q6_g64_fp16": 6}


def v4_fused_enabled() -> bool:
    """Whether the fused decode ops run on the v2/v3/v4 launcher (the kernel feature "gemv4_fused":
    v4 with SwiGLU / residual-add epilogues, multi-output launches writing their slices, PDL)."""
    return kernel_feature("gemv4_fused")


def v4_fused_accepts(x: nn.Tensor, weights: Sequence[LinearWeight], *, op: str = "multi") -> bool:
    """Whether the v4 launcher's fused ops take `x` and `weights` on the current target.

    Needs tuned CUDA kernels and x bf16 `[b, 1, K]` (b may be symbolic). `op="multi"`: every weight
    grouped-int (q4/q5/q6/q8) with K columns, rows a multiple of 16, K a multiple of 128 (each weight
    runs the kernel the plain GEMV would). `op="swiglu"` / `"add"`: v4's epilogues, so q4/q5/q6,
    K a multiple of 256; swiglu takes two weights of one format and shape, add one.
    """
    if not tuned_cuda_kernels() or str(x.dtype) != "bfloat16":
        return False
    shape = x.shape
    if len(shape) != 3 or not isinstance(shape[1], int) or shape[1] != 1 or not isinstance(shape[2], int):
        return False
    k, weights = int(shape[2]), list(weights)
    if not weights or not all(w.grouped and w.cols == k and w.rows % 16 == 0 and w.scales is not None
                              and (w.high is not None or w.bits in (4, 8)) for w in weights):
        return False
    if op == "multi":
        return k % 128 == 0
    if k % 256 != 0 or not all(w.fmt in V4_BITS for w in weights):
        return False
    if op == "swiglu":
        return len(weights) == 2 and weights[0].fmt == weights[1].fmt and weights[0].rows == weights[1].rows
    return op == "add" and len(weights) == 1


def norm_supported(x: nn.Tensor, weight: nn.Tensor) -> bool:
    """Whether `rms_norm_pdl` takes this decode-shaped (`[b, 1, K]`) bf16 x and fp32/bf16 weight."""
    shape = x.shape
    return (v4_fused_enabled() and str(x.dtype) == "bfloat16" and str(weight.dtype) in ("float32", "bfloat16")
            and len(shape) == 3 and isinstance(shape[1], int) and shape[1] == 1 and isinstance(shape[2], int)
            and int(shape[2]) % 8 == 0 and int(shape[2]) <= NORM_MAX_K and [int(d) for d in weight.shape] == [int(shape[2])])


def rms_norm_pdl(x: nn.Tensor, weight: nn.Tensor, eps: float, offset: bool) -> nn.Tensor:
    """`rms(x) * (w + offset)` as a kernel of the decode GEMVs' PDL chain (`qgemv_cuda.cu`)."""
    return _extern(tvm.target.Target.current(), dense=True)[NORM_SYMBOL](x, weight, float(eps), 1.0 if offset else 0.0)


# ---- int8 activations: the norm writes them, the q4 SwiGLU reads them (docs/kernels/decode-gemv-v4.md,
# "eighth pass") --------------------------------------------------------------------------------------


def int8_enabled() -> bool:
    """Whether decode norms feeding q4 SwiGLUs also write int8 activations for them (the kernel
    feature "gemv_int8"; NINFER_GEMV_INT8=0 at run time keeps the bf16 entries, for measurements)."""
    return kernel_feature("gemv_int8")


def norm_swiglu_int8_supported(x: nn.Tensor, weight: nn.Tensor, gate: LinearWeight | None,
                               up: LinearWeight | None) -> bool:
    """Whether `rms_norm_xq` + `gemv_swiglu(..., xq)` take this decode norm and these weights: the
    norm kernel's input, K a multiple of 256, and a q4 SwiGLU that v4 runs."""
    return (int8_enabled() and not v5_enabled() and gate is not None and up is not None and norm_supported(x, weight)
            and int(x.shape[-1]) % 256 == 0 and gate.fmt == "q4_g64_fp16"
            and v4_fused_accepts(x, [gate, up], op="swiglu"))


def rms_norm_xq(x: nn.Tensor, weight: nn.Tensor, eps: float, offset: bool) -> tuple[nn.Tensor, nn.Tensor]:
    """`rms_norm_pdl`, also returning rows 0..3 of its output as int8 activations (`xq_bytes` uint8)."""
    args = [x, weight, relax.prim_value(tirx.FloatImm("float64", float(eps))),
            relax.prim_value(tirx.FloatImm("float64", 1.0 if offset else 0.0))]
    _extern(tvm.target.Target.current(), dense=True)  # registers the launcher
    outs = _infer_norm_xq(x, weight, eps, 1.0 if offset else 0.0)
    return _call_outputs(NORM_XQ_SYMBOL, args, outs)


def mlp_int8_supported(x: nn.Tensor, weight: nn.Tensor, gate: LinearWeight | None, up: LinearWeight | None,
                       down: LinearWeight | None) -> bool:
    """Whether the whole decode feed-forward half runs on int8 activations (the opt-in kernel feature
    "gemv_int8_mlp"): `norm_swiglu_int8_supported`,
    and a q4 / q5 down projection whose input the SwiGLU can hand over as int8 activations too
    (`gemv_swiglu_xq` + `gemv_add_i8`; its K, the SwiGLU's N, a multiple of 256)."""
    if not kernel_feature("gemv_int8_mlp") or down is None or gate is None:
        return False
    if not norm_swiglu_int8_supported(x, weight, gate, up):
        return False
    n = gate.rows
    return (down.fmt in ("q4_g64_fp16", "q5_g64_fp16") and down.cols == n and n % 256 == 0 and n <= XQ_MAX_OUTPUTS
            and down.rows % 16 == 0 and down.scales is not None and (down.high is not None or down.bits == 4))


def add_int8_input_supported(x: nn.Tensor, weight: LinearWeight | None, feature: str) -> bool:
    """Whether a residual-add projection of the decode input `x` reads it as int8 activations that its
    producer writes (under the kernel feature `feature`): a q4 / q5 weight that v4 runs, K a multiple
    of 256. `gemv_add_i8` then reads them at <= 4 rows, x otherwise."""
    if not (kernel_feature(feature) and int8_enabled() and not v5_enabled()) or weight is None:
        return False
    k = int(x.shape[-1])
    return (weight.fmt in ("q4_g64_fp16", "q5_g64_fp16") and weight.cols == k and k % 256 == 0
            and v4_fused_accepts(x, [weight], op="add"))


def gemv_swiglu_xq(x: nn.Tensor, gate: LinearWeight, up: LinearWeight, xq: nn.Tensor) -> tuple[nn.Tensor, nn.Tensor]:
    """`gemv_swiglu(x, gate, up, xq)` (q4), also returning its output as int8 activations for
    `gemv_add_i8` (written whenever that call reads them: <= 4 rows, NINFER_GEMV_INT8 not 0)."""
    args = [x, xq, gate.bits, *_v4_planes(gate), *_v4_planes(up)]
    _extern(tvm.target.Target.current())  # registers the launcher
    y, yq = _call_outputs(SWIGLU_I8X_SYMBOL, args, _infer_qgemv_swiglu_i8x(*args))
    return y, yq


def gemv_add_i8(x: nn.Tensor, xq: nn.Tensor, weight: LinearWeight, residual: nn.Tensor,
                handover: bool = False) -> nn.Tensor:
    """`gemv_add(x, weight, residual)` reading x as the int8 activations `xq` at <= 4 rows (q4 / q5);
    `handover`: `xq` from `gemv_swiglu_xq`, which writes it at the launcher's handover rows only."""
    symbol = ADD_I8H_SYMBOL if handover else ADD_I8_SYMBOL
    return _extern(tvm.target.Target.current())[symbol](x, xq, *_v4_planes(weight), weight.bits, residual)


def _v4_planes(w: LinearWeight) -> list:
    return [w.base, w.base if w.high is None else w.high, w.scales]


def _v4_multi(x: nn.Tensor, outputs: list[list[LinearWeight]], xq: nn.Tensor | None = None) -> tuple[nn.Tensor, ...]:
    args: list = [x, len(outputs), *(len(ws) for ws in outputs)]
    for ws in outputs:
        for w in ws:
            args += [w.bits, *_v4_planes(w)]
    _extern(tvm.target.Target.current())  # registers the launcher
    if xq is not None:
        args.insert(1, xq)
        return _call_outputs(MULTI_I8_SYMBOL, args, _infer_qgemv_multi_i8(*args))
    return _call_outputs(MULTI_SYMBOL, args, _infer_qgemv_multi(*args))


def norm_multi_int8_supported(x: nn.Tensor, weight: nn.Tensor, outputs: Sequence[Sequence[LinearWeight | None]]) -> bool:
    """Whether `rms_norm_xq` + `gemv_multi(..., xq)` take this decode norm and these projections of its
    output (the opt-in kernel feature "gemv_int8_multi"): the norm kernel's input, K a multiple of
    256, weights the v4 multi launch takes, both q4 and q5 among them (the mixed launch is the one with
    an int8 entry; the launcher falls back to the bf16 entries on x where it cannot run it)."""
    weights = [w for ws in outputs for w in ws]
    if not (kernel_feature("gemv_int8_multi") and int8_enabled() and not v5_enabled() and weights
            and all(w is not None for w in weights) and norm_supported(x, weight) and int(x.shape[-1]) % 256 == 0):
        return False
    fmts = {w.fmt for w in weights}
    return {"q4_g64_fp16", "q5_g64_fp16"} <= fmts and v4_fused_accepts(x, weights)


def fused_accepts(x: nn.Tensor, weights: Sequence[LinearWeight], *, op: str = "multi") -> bool:
    """Whether the v5 fused ops take `x` and `weights` on the current target.

    Needs: tuned CUDA kernels for the current target; x bf16 `[b, 1, K]` (b may be symbolic) with K
    a multiple of 128; 1..8 weights, all with K columns, each q4/q5/q6 (rows a multiple of 16) or
    dense bf16 (rows a multiple of 8). `op="swiglu"` also needs exactly two grouped-int weights of one
    format and shape, `op="add"` exactly one weight. (`gemv_multi` also allows at most 8 outputs.)
    """
    if not tuned_cuda_kernels() or str(x.dtype) != "bfloat16":
        return False
    shape = x.shape
    if len(shape) != 3 or not isinstance(shape[1], int) or shape[1] != 1 or not isinstance(shape[2], int):
        return False
    k = int(shape[2])
    weights = list(weights)
    if k % V5_KSTEP != 0 or not 1 <= len(weights) <= V5_MAX_WEIGHTS or not all(_weight_ok(w, k) for w in weights):
        return False
    if op == "swiglu":
        gate, up = weights if len(weights) == 2 else (None, None)
        return gate is not None and gate.grouped and gate.fmt == up.fmt and gate.rows == up.rows
    if op == "add":
        return len(weights) == 1
    return op == "multi"


def gemv_multi(x: nn.Tensor, outputs: Sequence[Sequence[LinearWeight]],
               xq: nn.Tensor | None = None) -> tuple[nn.Tensor, ...]:
    """One launch: output i is `[b, 1, sum of its weights' rows]`, the concatenation of x @ W^T over
    its weights (all weights share K). fp32 accumulation, one bf16 rounding per output element.
    `xq`: x as the norm's int8 activations (`rms_norm_xq`), read by the mixed q4 + q5 launch at <= 4
    rows (`norm_multi_int8_supported`)."""
    outputs = [list(ws) for ws in outputs]
    weights = [w for ws in outputs for w in ws]
    if not v5_enabled() and outputs and all(outputs) and v4_fused_accepts(x, weights):
        return _v4_multi(x, outputs, xq)
    if xq is not None:
        raise ValueError("gemv_multi: int8 activations need the v4 multi launch (see norm_multi_int8_supported)")
    if not outputs or not all(outputs) or len(outputs) > V5_MAX_OUTPUTS or not fused_accepts(x, weights):
        raise ValueError("gemv_multi: unsupported inputs (see fused_accepts)")
    args: list = [x, len(outputs), *(len(ws) for ws in outputs)]
    for w in weights:
        args += _v5_args(w)
    _v5_extern()  # registers the launcher
    return _call_outputs(V5_MULTI, args, _infer_v5_multi(*args))


def gemv_swiglu(x: nn.Tensor, gate: LinearWeight, up: LinearWeight, xq: nn.Tensor | None = None) -> nn.Tensor:
    """`silu(x Wg^T) * (x Wu^T)` from the two fp32 accumulators of the same rows, one bf16 rounding.
    `xq`: x as the norm's int8 activations (`rms_norm_xq`), read instead of x at <= 4 rows."""
    if not v5_enabled() and v4_fused_accepts(x, [gate, up], op="swiglu"):
        if xq is not None:
            return _extern(tvm.target.Target.current())[SWIGLU_I8_SYMBOL](x, xq, gate.bits, *_v4_planes(gate),
                                                                          *_v4_planes(up))
        return _extern(tvm.target.Target.current())[SWIGLU_SYMBOL](x, gate.bits, *_v4_planes(gate), *_v4_planes(up))
    if not fused_accepts(x, [gate, up], op="swiglu"):
        raise ValueError("gemv_swiglu: unsupported inputs (see fused_accepts)")
    return _v5_extern()[V5_SWIGLU](x, *_v5_args(gate), *_v5_args(up)[1:])


def gemv_add(x: nn.Tensor, weight: LinearWeight, residual: nn.Tensor) -> nn.Tensor:
    """`residual + x W^T` (fp32 sum, one bf16 rounding); residual is bf16 `[b, 1, rows]`."""
    if not v5_enabled() and v4_fused_accepts(x, [weight], op="add") and str(residual.dtype) == "bfloat16":
        return _extern(tvm.target.Target.current())[ADD_SYMBOL](x, *_v4_planes(weight), weight.bits, residual)
    if not fused_accepts(x, [weight], op="add") or str(residual.dtype) != "bfloat16":
        raise ValueError("gemv_add: unsupported inputs (see fused_accepts)")
    return _v5_extern()[V5_ADD](x, *_v5_args(weight), residual)


def _plain_v5(x: nn.Tensor, base: nn.Tensor, high: nn.Tensor | None, scales: nn.Tensor, fmt: str) -> LinearWeight | None:
    """The plain projection as a v5 weight when v5 runs it (enabled; bf16 q4/q5/q6 from V5_PLAIN_MIN_WEIGHTS)."""
    if not v5_enabled() or fmt not in V5_FORMATS or fmt == "bfloat16":
        return None
    rows, k = int(base.shape[0]), int(base.shape[1]) * 2
    w = LinearWeight(fmt, rows, k, base, high, scales)
    if rows * k < V5_PLAIN_MIN_WEIGHTS or not fused_accepts(x, [w]):
        return None
    return w
