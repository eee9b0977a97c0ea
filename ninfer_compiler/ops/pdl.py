"""Programmatic Dependent Launch in the decode chain's Triton kernels, and the order of its two steps.

Every kernel of the decode chain (the CUDA GEMVs and norms of `qgemv_cuda.cu`, the Triton kernels
here) reads only step-invariant data (weights, the recurrent state and history last written in the
previous step, the step's slot table) before `griddepcontrol.wait`, and everything a kernel of the
step writes after it. `launch_dependents` lets the next launch of the stream start. By default a
kernel waits, then triggers, so only the next launch can run ahead of the one that is computing;
with the kernel feature `pdl_early` it triggers first, so the next launch can start (and issue its
weight copies) while this one still waits for its own predecessor. Either order is safe: a launch's
wait returns only once its predecessor has finished, which itself waited for the one before.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .common import kernel_features

WAIT_FIRST, TRIGGER_FIRST = 1, 2  # the kernels' `PDL` constexpr (0 / False: launched without PDL)


def pdl_mode() -> int:
    """The `PDL` constant of the decode chain's Triton kernels for the package being compiled."""
    return TRIGGER_FIRST if kernel_features()["pdl_early"] else WAIT_FIRST


def cuda_defines() -> tuple[str, ...]:
    """The matching nvcc switch of the CUDA kernels (`qgemv_cuda.cu` `pdl_enter`)."""
    return ("NINFER_PDL_EARLY=1",) if kernel_features()["pdl_early"] else ()


@triton.jit
def pdl_enter(MODE: tl.constexpr):
    """Wait for the previous kernel and let the next one start, in the order MODE names."""
    if MODE == 2:
        gdc_launch_dependents()
        gdc_wait()
    else:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def pdl_trigger_early(MODE: tl.constexpr):
    """Let the next kernel start now where MODE triggers first (`pdl_enter` repeats it to no effect): for a
    kernel that may stall before its `pdl_enter` (e.g. at a cluster barrier, whose release semantics wait
    for every load in flight)."""
    if MODE == 2:
        gdc_launch_dependents()
