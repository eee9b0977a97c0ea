"""AOT device compilation on a machine without a GPU driver, and the kernel cache."""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import te

from ninfer_compiler.codegen import toolchain
from ninfer_compiler.codegen.fatbin import inspect_library
from ninfer_compiler.codegen.targets import tvm_target
from ninfer_runtime import targets


def _tiny_kernel() -> tvm.IRModule:
    from tvm.s_tir import dlight as dl

    a = te.placeholder((1024,), "float32", name="a")
    b = te.compute((1024,), lambda i: a[i] * 2.0, name="b")
    mod = tvm.IRModule({"main": te.create_prim_func([a, b])})
    with tvm_target(targets.load("h200")):
        return dl.ApplyDefaultSchedule(dl.gpu.Fallback())(mod)


def test_build_embeds_sass_and_caches_it(tmp_path, monkeypatch, nvcc):
    monkeypatch.setenv("NINFER_KERNEL_CACHE_DIR", str(tmp_path / "cache"))
    target = tvm_target(targets.load("h200"))
    before = tvm_ffi.get_global_func(toolchain.CALLBACK, allow_missing=True)
    libs = []
    for i in range(2):
        with toolchain.cuda_build(target) as stats:
            lib = tvm.compile(_tiny_kernel(), target=target)
        libs.append(tmp_path / f"k{i}.so")
        lib.export_library(str(libs[-1]))
        assert stats.modules == 1 and stats.cache_hits == i
    assert toolchain.cuda_codegen_available()
    code = inspect_library(libs[0])
    assert code.problems("sm_90a") == [] and code.sass_archs == {"sm_90a"}
    assert len(list((tmp_path / "cache" / "sm_90a").glob("*.fatbin"))) == 1
    # the previous compile callback is back once the build is over
    after = tvm_ffi.get_global_func(toolchain.CALLBACK, allow_missing=True)
    assert (before is None) == (after is None)
