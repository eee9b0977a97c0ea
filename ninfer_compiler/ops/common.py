"""Small helpers shared by the kernels, and the choice between CPU and GPU kernel variants."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from contextvars import ContextVar

import tvm
from tvm import tirx
from tvm.relax.frontend import nn
from tvm.script import tirx as T

# Attributes of a hand-written kernel: no scheduler may touch it; buffers never alias
# (in-place arguments are one buffer, so this still holds).
SCHEDULED_ATTRS = {"tirx.is_scheduled": True, "tirx.noalias": True}

# "gpu-serial" forces the GPU kernels with their thread loops made serial (see `thread_loop`);
# None means: follow the current TVM target.
_FORCED_FLAVOR: ContextVar[str | None] = ContextVar("ninfer_kernel_flavor", default=None)


def kernel_flavor() -> str:
    """Which variant the ops emit: `cpu`, `gpu` or `gpu-serial`.

    Ops are traced while the model is exported; the compile driver exports under
    `with target:`, so a CUDA target selects the thread-bound GPU kernels without any
    argument threading through the model code.
    """
    forced = _FORCED_FLAVOR.get()
    if forced is not None:
        return forced
    target = tvm.target.Target.current(allow_none=True)
    return "gpu" if target is not None and target.kind.name == "cuda" else "cpu"


_REFERENCE_KERNELS: ContextVar[bool] = ContextVar("ninfer_reference_kernels", default=False)


def tuned_cuda_kernels() -> bool:
    """Whether ops on a CUDA target use the tuned extern kernels (Triton and CUDA C++ images).

    Off under `reference_kernels()` or `NINFER_REFERENCE_KERNELS=1`: every op then emits its
    thread-bound TIR kernel, the simple form that GPU checks compare the tuned package with.
    """
    target = tvm.target.Target.current(allow_none=True)
    if target is None or target.kind.name != "cuda":
        return False
    return not (_REFERENCE_KERNELS.get() or os.environ.get("NINFER_REFERENCE_KERNELS") == "1")


# Tuned kernels a package uses only when asked (`kernel_feature`): each was built for every CUDA
# arch and checked on the CPU (Triton's interpreter, bit-level emulation of CUDA fragment code) but
# has not yet run on a GPU of its target; its default turns on once a device run validates it
# (tests/gpu/, docs/performance.md). Everything not listed here is on whenever tuned kernels are.
KERNEL_FEATURES: dict[str, bool] = {
    # decode GEMV v5 (ops/qgemv5_cuda.cu): fused multi-output / SwiGLU / residual-add launches chained
    # with PDL; exact on the H200, but its first timed build was slower than v4 on most launches
    "gemv5": False,
    # decode GEMV v4 with SwiGLU / residual-add epilogues, multi-output launches and the PDL-chained
    # RMS norm (ops/qgemv.py `v4_fused_accepts`): the fused decode ops on the v2/v3/v4 launcher
    "gemv4_fused": True,
    # the decode norms feeding q4 SwiGLUs also write int8 activations, and those SwiGLUs run as int8
    # tensor-core MMAs at <= 4 rows (ops/qgemv.py `norm_swiglu_int8_supported`)
    "gemv_int8": True,
    # ... and the q4 SwiGLU hands its output to a q4 / q5 down projection as int8 activations too
    # (ops/qgemv.py `mlp_int8_supported`) at one row (the launcher's NINFER_XQ_HANDOVER_ROWS): the
    # down projection 26.5 -> 23.2 us for 3.7 us of cross-block handover in the SwiGLU; in the 27B
    # decode graph 6.485 -> 6.287 ms of GPU time per step at one request (docs/kernels/decode-gemv-v4.md,
    # "ninth pass", "thirteenth pass")
    "gemv_int8_mlp": True,
    # ... with the SwiGLU's output quantized by a small PDL-chained kernel of its own
    # (ops/xq_quantize.py: its programs own whole 64-groups) instead of the SwiGLU's in-kernel
    # handover (fence, count-in, the group's last block reloading and quantizing): the SwiGLU 38.5
    # -> 34.4 us of advance a launch, the quantize kernel 1.9, the down projection unchanged; 27B
    # decode on an H100 7.012 -> 6.833 ms of GPU time per step at one request (bench 6.992 -> 6.860),
    # logits within 4.65e-3 (docs/performance.md, twenty-third pass)
    "gemv_int8_mlp_kernel": True,
    # decode RMS norms folded into the residual-add GEMV producing their input (passes/add_norm.py:
    # the GEMV's last block normalizes its output rows): exact, but the last block's norm is slower
    # than the norm kernel it replaces (27B decode 7.26 -> 7.71 ms at one request, 9.21 -> 12.08 at
    # eight; docs/kernels/decode-gemv-v4.md "tenth pass"), so opt-in
    "gemv_add_norm": False,
    # the mixers' q4 + q5 projections of the input norm's output on int8 activations (the norm writes
    # them, `ninfer_qgemv4e_q45_multi_i8` reads them at <= 4 rows; ops/qgemv.py `norm_multi_int8_supported`):
    # on the H200 as exact as the bf16 launch (3.3e-3 vs 3.5e-3 of max |y| against float64) and 1.6-3.3 us
    # faster per launch at 1-4 rows; in the 27B decode graph 6.666 -> 6.630 ms of GPU time per step at one
    # request, the input norms' int8 copy costing back most of it (docs/kernels/decode-gemv-v4.md, "thirteenth pass")
    "gemv_int8_multi": True,
    # the decode norms feeding those int8 launches computed in the launches' prologues at one row
    # (passes/norm_prologue.py: each block normalizes and quantizes the row itself, the norm kernel's
    # math and summation order, so the activations are the same bytes): exact (logits identical), but
    # every block of every wave pays the norm's latency before its first stage, more than the norm
    # kernel's launch boundary saves (27B decode at one request 6.993 -> 7.353 ms on an H100, 5.826 ->
    # 6.445 on an H200; docs/kernels/decode-gemv-v4.md "twenty-second pass"), so opt-in
    "gemv_norm_prologue": False,
    # the fused GDN decode step also writes its output as int8 activations (each program owns whole
    # 64-groups: no cross-block step) and the q4 / q5 output projection reads them at <= 4 rows
    # (ops/qgemv.py `add_int8_input_supported`, ops/gdn_decode_fused.py `xq_store`); 27B decode on the
    # H200 6.561 -> 6.425 ms of GPU time per step at one request, logits within 4.7e-3 of the bf16
    # path, greedy tokens the same (docs/kernels/decode-gemv-v4.md, "thirteenth pass")
    "gemv_int8_gdn_out": True,
    # ... and so does the gated attention decode combine (a program owns one query head: 256
    # outputs) for the attention output projection (ops/attention_decode.py): 27B decode 6.485 ->
    # 6.470 ms of GPU time per step at one request
    "gemv_int8_attn_out": True,
    # the fused GDN decode step launched in the shape measured fastest at the batch (ops/gdn_decode_fused.py
    # SHAPES: the whole state slice per program at one row, column chunks above): per launch on the
    # H200 8.50 -> 7.83 us at 2 rows, 14.77 -> 10.53 at 4, 22.77 -> 17.60 at 8 (docs/kernels/gdn-decode.md)
    "gdn_step_by_batch": True,
    # the decode chain's kernels (ops/pdl.py) let the next launch start before their PDL wait rather
    # than after it, so a GEMV behind a norm, the convolution or the GDN step becomes resident and
    # issues its weight copies while the GEMV before that norm still runs (with the q5 ring at 2
    # stages, which leaves the shared memory for it): 27B decode on an H100, GPU time per step,
    # 7.508 -> 7.200 ms at one request, 9.285 -> 8.717 at eight (docs/performance.md, seventeenth pass)
    "pdl_early": True,
    # ... and at one row in the 2-4-row shape (chunks of 64, 4 warps, 30 K registers a program
    # against the whole slice's 54 K), so the output projection's blocks, whose weight copies run
    # under the step's PDL wait, fit beside its programs on their 48 multiprocessors; per launch
    # alone 6.82 against 6.86 us (docs/kernels/gdn-decode.md); in the 27B decode graph on an H100
    # 7.446 -> 7.406 ms at one request, within a run's spread (docs/performance.md, seventeenth pass)
    "gdn_step_one_row_chunked": False,
    # the fused GDN decode step also applies the short convolution (its q / k history written by the
    # key head's last program after a thread block cluster barrier), so the 48 convolution launches of
    # a 27B decode step go (ops/gdn_decode_fused.py CONV)
    "gdn_step_conv": False,
    # the decode attention's split kernel reads the lengths, the page table and its first tile of keys
    # and values (all but the new token's row) before its PDL wait, under the attention prologue
    # (ops/attention_decode.py EARLY)
    "attention_split_early": False,
    # fp8_e4m3fn_row_bf16 weights (ops/fp8_row.py): the Triton prefill GEMM and decode GEMV, and the
    # tensor-core CUDA decode GEMV; exact on the H200 (2026-12-01, tests/gpu/check_fp8_row.py)
    "fp8_row_triton": True,
    "fp8_row_gemv_tc": True,
}


def kernel_feature(name: str) -> bool:
    """Whether the opt-in tuned kernel `name` is used: its `KERNEL_FEATURES` default, overridden by
    `NINFER_KERNELS` (comma-separated `+name` / `-name`, or `+all`). Off with the reference kernels."""
    if name not in KERNEL_FEATURES:
        raise KeyError(f"unknown kernel feature {name!r}; known: {', '.join(sorted(KERNEL_FEATURES)) or 'none'}")
    if not tuned_cuda_kernels():
        return False
    return kernel_features()[name]


def kernel_features() -> dict[str, bool]:
    """The effective state of every opt-in kernel (recorded in a package's manifest)."""
    state = dict(KERNEL_FEATURES)
    for item in filter(None, (x.strip() for x in os.environ.get("NINFER_KERNELS", "").split(","))):
        sign, name = item[0], item[1:]
        if sign not in "+-" or (name != "all" and name not in state):
            raise ValueError(f"NINFER_KERNELS: {item!r} is not +NAME or -NAME with NAME in "
                             f"{', '.join(sorted(state)) or 'none'} or all")
        for key in state if name == "all" else [name]:
            state[key] = sign == "+"
    return state


@contextlib.contextmanager
def reference_kernels() -> Iterator[None]:
    """Export with the TIR reference kernels only (see `tuned_cuda_kernels`)."""
    token = _REFERENCE_KERNELS.set(True)
    try:
        yield
    finally:
        _REFERENCE_KERNELS.reset(token)


@contextlib.contextmanager
def serial_gpu_kernels() -> Iterator[None]:
    """Emit the GPU kernels with serial loops, so their logic can be checked on the CPU."""
    token = _FORCED_FLAVOR.set("gpu-serial")
    try:
        yield
    finally:
        _FORCED_FLAVOR.reset(token)


def thread_loop(bound: bool) -> Callable:
    """`loop(extent, tag)`: a thread-bound loop on the GPU, or a serial one for CPU checks.

    GPU kernels are written as phases, each a `for tx in loop(NT, "threadIdx.x")` over
    shared buffers. TVM inserts the barriers between phases, so running each phase's
    loop to completion in order (the serial form) computes exactly what the GPU does.
    """

    def loop(extent, tag: str):
        return T.thread_binding(extent, thread=tag) if bound else T.serial(extent)

    return loop


def shared_scope(bound: bool) -> str:
    """Shared memory on the GPU; a plain local array in the serial CPU form."""
    return "shared" if bound else "local"


def pow2_divisor(dim: int, cap: int) -> int:
    """The largest power of two <= `cap` dividing `dim` (threads per block over `dim`)."""
    n = 1
    while n * 2 <= cap and dim % (n * 2) == 0:
        n *= 2
    return n


def i32(value: int) -> tirx.IntImm:
    """A scalar int32 kernel argument (layer index and similar)."""
    return tirx.IntImm("int32", value)


def placeholder_like(t: nn.Tensor) -> nn.Tensor:
    """Output placeholder of an in-place argument (same shape and dtype)."""
    return nn.Tensor.placeholder(t.shape, t.dtype)


def dtype_tag(dtype: str) -> str:
    """Short dtype name for kernel names (`float32` -> `f32`)."""
    return {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}.get(dtype, dtype)
