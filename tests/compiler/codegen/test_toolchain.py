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


LAUNCHER = """
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/function.h>
namespace {
void touch(tvm::ffi::TensorView x, tvm::ffi::TensorView y) { (void)x; (void)y; }
}  // namespace
TVM_FFI_DLL_EXPORT_TYPED_FUNC(%s, touch);
"""


def test_host_launchers_compile_once_into_the_cache(tmp_path, monkeypatch):
    """An export's C++ launchers become objects in the kernel cache: the same source (and compiler
    and flags) is compiled once, another source gets an object of its own."""
    from tvm.relax.frontend import nn

    monkeypatch.setenv("NINFER_KERNEL_CACHE_DIR", str(tmp_path / "cache"))
    compiled = []
    compile_source = nn.SourceModule.compile

    def counted(self, out):  # noqa: ANN001, ANN202
        compiled.append(out)
        compile_source(self, out)

    monkeypatch.setattr(nn.SourceModule, "compile", counted)

    def source(symbol: str) -> nn.SourceModule:
        return nn.SourceModule({symbol: lambda x: x}, source_code=LAUNCHER % symbol, source_format="cpp",
                               compile_options=[*nn.SourceModule.get_compile_options("cpp"), "-fPIC"])

    (tmp_path / "given.o").touch()
    other = nn.ObjectModule({"x": lambda x: x}, tmp_path / "given.o")  # not a source: passed through
    first = toolchain.host_objects([source("ninfer_test_a"), other, source("ninfer_test_b")])
    assert len(compiled) == 2 and first[1] is other
    assert all(isinstance(m, nn.ObjectModule) for m in first)
    assert first[0].filepath != first[2].filepath
    assert {first[0].filepath, first[2].filepath} == set((tmp_path / "cache" / "host").glob("*.o"))
    again = toolchain.host_objects([source("ninfer_test_b")])
    assert len(compiled) == 2 and again[0].filepath == first[2].filepath  # no compiler run
    assert again[0].load().implements_function("ninfer_test_b")
