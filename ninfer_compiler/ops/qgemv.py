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
"""

from __future__ import annotations

from pathlib import Path

import tvm
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn.exporter import Exporter

from ..codegen.toolchain import nvcc_fatbin
from .row_split import grouped_format

HERE = Path(__file__).resolve().parent
DEVICE_SOURCE = HERE / "qgemv_cuda.cu"
HOST_SOURCE = HERE / "qgemv_host.cc"
SYMBOL = "ninfer_qgemv"
DENSE_SYMBOL = "ninfer_dense_gemv"
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


def fatbin(arch: str, dense: bool = False) -> bytes:
    """nvcc's fatbin of the kernels for `arch` (SASS only, cached; `dense`: the dense kernels alone)."""
    defines = ("NINFER_GEMV_DENSE_ONLY",) if dense else ()
    return nvcc_fatbin(DEVICE_SOURCE, arch, defines, tag="qgemv")


def host_source(arch: str, dense: bool = False) -> str:
    """The launcher's C++ with the fatbin embedded (and the dense-only switch for `dense`)."""
    data = fatbin(arch, dense)
    body = ",".join(str(b) for b in data)
    return (("#define NINFER_GEMV_DENSE_ONLY 1\n" if dense else "")
            + f"alignas(64) static const unsigned char NINFER_QGEMV_FATBIN[{len(data)}] = {{{body}}};\n"
            + HOST_SOURCE.read_text())


def _infer_qgemv(x: nn.Tensor, base: nn.Tensor, high: nn.Tensor, scales: nn.Tensor, bits: int) -> nn.Tensor:
    return nn.Tensor.placeholder([*x.shape[:-1], base.shape[0]], x.dtype)


def _infer_dense(x: nn.Tensor, weight: nn.Tensor) -> nn.Tensor:
    return nn.Tensor.placeholder([*x.shape[:-1], weight.shape[0]], x.dtype)


def _extern(target: tvm.target.Target, dense: bool = False) -> nn.SourceModule:
    """A launcher module, registered once per export (a symbol may be added only once)."""
    exporter = Exporter.current()
    flag = "_ninfer_dense_gemv" if dense else "_ninfer_qgemv"
    module = getattr(exporter, flag, None)
    if module is not None:
        return module
    mtriple = str(target.host.attrs.get("mtriple", "")) if target.host is not None else ""
    compiler = f"{mtriple}-g++" if mtriple else None
    module = nn.SourceModule(
        {DENSE_SYMBOL: _infer_dense} if dense else {SYMBOL: _infer_qgemv},
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
    bits = grouped_format(fmt).bits
    return _extern(target)[SYMBOL](x, base, base if high is None else high, scales, bits)


def dense_gemv(x: nn.Tensor, weight: nn.Tensor) -> nn.Tensor:
    """`y[b, 0, n] = sum_k x[b, 0, k] * weight[n, k]` (bf16, fp32 accumulation) on the GPU."""
    return _extern(tvm.target.Target.current(), dense=True)[DENSE_SYMBOL](x, weight)
