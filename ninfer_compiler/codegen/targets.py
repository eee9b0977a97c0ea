"""Our target descriptions -> TVM targets (device and host)."""

from __future__ import annotations

import platform

import tvm

from ninfer_runtime.targets import Target

# Limits shared by sm_90a, sm_120a and sm_121a. Shared memory is capped at the 48 KiB a kernel
# gets without opting in: dlight sizes its static shared buffers from this number, and static
# shared memory above 48 KiB does not compile (the opt-in maximum is in the target file).
CUDA_LIMITS = {
    "max_threads_per_block": 1024,
    "thread_warp_size": 32,
    "registers_per_block": 65536,
    "max_shared_memory_per_block": 49152,
}


def host_arch(triple: str) -> str:
    """`aarch64-linux-gnu` -> `aarch64`; `native` -> this machine's."""
    return platform.machine() if triple == "native" else triple.split("-")[0]


def is_cross(target: Target) -> bool:
    """Whether the target's host code is for another CPU than this machine's."""
    return host_arch(target.host_triple) != platform.machine()


def tvm_target(target: Target) -> tvm.target.Target:
    """The TVM target for `target`: LLVM for the CPU, CUDA with an LLVM host for GPUs."""
    if target.device == "cpu":
        return tvm.target.Target("llvm")
    if not target.cuda_arch:
        raise ValueError(f"target {target.name}: no cuda_arch")
    shared = min(CUDA_LIMITS["max_shared_memory_per_block"], target.max_shared_memory_per_block or 49152)
    host = {"kind": "llvm"}
    if target.host_triple != "native":
        host["mtriple"] = target.host_triple
    return tvm.target.Target(
        {"kind": "cuda", "arch": target.cuda_arch, **CUDA_LIMITS, "max_shared_memory_per_block": shared,
         "host": host}
    )
