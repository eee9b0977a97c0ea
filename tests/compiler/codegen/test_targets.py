"""Target descriptions -> TVM targets."""

from __future__ import annotations

import pytest

from ninfer_compiler.codegen.targets import host_arch, tvm_target
from ninfer_runtime import targets


@pytest.mark.parametrize(("name", "arch", "triple"), [
    ("h200", "sm_90a", "x86_64-linux-gnu"),
    ("rtx5090", "sm_120a", "x86_64-linux-gnu"),
    ("dgx-spark", "sm_121a", "aarch64-linux-gnu"),
])  # fmt: skip
def test_cuda_targets(name, arch, triple):
    t = tvm_target(targets.load(name))
    assert t.kind.name == "cuda" and str(t.arch) == arch
    assert str(t.host.attrs["mtriple"]) == triple
    assert int(t.attrs["max_shared_memory_per_block"]) == 49152  # static shared memory limit
    assert int(t.attrs["thread_warp_size"]) == 32


def test_cpu_target_and_host_arch():
    assert tvm_target(targets.load("cpu")).kind.name == "llvm"
    assert host_arch("aarch64-linux-gnu") == "aarch64"
