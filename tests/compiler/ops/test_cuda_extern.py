"""Triton kernels compiled ahead of time and launched from a package (`ops/triton_aot.py`,
`ops/cuda_extern.py`, `ops/cuda_driver.h`).

Structural (no GPU here): the image holds SASS for exactly the arch asked for, wrapped in a
fatbin the library checks understand; numerics of a kernel are checked with Triton's
interpreter; a Relax module calling an extern exports as one library whose AOT check passes
and which carries the launcher symbol.
"""

from __future__ import annotations

import numpy as np
import pytest

from ninfer_compiler.codegen.fatbin import parse_fatbin

from ..codegen.conftest import require_tool
from ..conftest import _op_module

triton = pytest.importorskip("triton")
tl = triton.language


@triton.jit
def _scale_kernel(x, y, n, factor, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    v = tl.load(x + i, mask=mask).to(tl.float32)
    tl.store(y + i, (v * factor).to(y.dtype.element_ty), mask=mask)


SIGNATURE = {"x": "*bf16", "y": "*bf16", "n": "i32", "factor": "fp32"}
LAUNCHER = r"""
#include "ninfer_cuda.h"
namespace {
void scale(tvm::ffi::TensorView x, double factor, tvm::ffi::TensorView y) {
  uint64_t xp = ninfer_cuda::pointer(x, "x"), yp = ninfer_cuda::pointer(y, "y");
  int32_t n = static_cast<int32_t>(x.numel());
  float f = static_cast<float>(factor);
  ninfer_cuda::launch("_scale_kernel", (n + 127) / 128, 1, 1, {&xp, &yp, &n, &f}, x.device().device_id);
}
}  // namespace
TVM_FFI_DLL_EXPORT_TYPED_FUNC(ninfer_test_scale, scale);
"""


@pytest.mark.parametrize("arch", ["sm_90a", "sm_120a", "sm_121a"])
def test_compile_kernel_gives_sass_for_exactly_the_arch(arch):
    from ninfer_compiler.ops.triton_aot import compile_kernel, cubin_arch

    require_tool("nvcc", "the CUDA toolkit wraps cubins into fatbins")
    img = compile_kernel(_scale_kernel, signature=SIGNATURE, constants={"BLOCK": 128}, arch=arch)
    assert img.name == "_scale_kernel" and img.threads == 128
    assert cubin_arch(img.cubin) == int(arch[3:-1])
    entries, _ = parse_fatbin(img.fatbin, 0)
    assert [(e.kind, e.arch) for e in entries] == [("elf", arch)]
    again = compile_kernel(_scale_kernel, signature=SIGNATURE, constants={"BLOCK": 128}, arch=arch)
    assert again == img  # served from the cache, same bytes


def test_compile_kernel_names_untyped_arguments():
    from ninfer_compiler.codegen.toolchain import ToolchainError
    from ninfer_compiler.ops.triton_aot import compile_kernel

    with pytest.raises(ToolchainError, match="factor"):
        compile_kernel(_scale_kernel, signature={"x": "*bf16", "y": "*bf16", "n": "i32"},
                       constants={"BLOCK": 128}, arch="sm_90a")


def test_image_table_embeds_each_distinct_image_once():
    from ninfer_compiler.ops.cuda_extern import image_table
    from ninfer_compiler.ops.triton_aot import KernelImage

    a, b = KernelImage("k", b"", b"\x01\x02", 0, 4), KernelImage("k", b"", b"\x03", 0, 8)
    table = image_table({"k_small": a, "k_big": a, "k_other": b})
    assert table.count("const unsigned char kImage") == 2
    assert '{"k_small", "k", kImage0, 0u, 128u}' in table and '{"k_big", "k", kImage0, 0u, 128u}' in table
    assert '{"k_other", "k", kImage1, 0u, 256u}' in table


def test_fill_launcher_fills_and_names_what_is_missing():
    from ninfer_compiler.ops.cuda_extern import fill_launcher

    assert fill_launcher("f(@N@, @N_ROWS@);", {"N": 4, "@N_ROWS@": 8}) == "f(4, 8);"
    with pytest.raises(ValueError, match="N_ROWS"):
        fill_launcher("f(@N@, @N_ROWS@);", {"N": 4})
    with pytest.raises(ValueError, match="EXTRA"):
        fill_launcher("f(@N@);", {"N": 4, "EXTRA": 1})


def test_image_table_rejects_duplicate_names():
    from ninfer_compiler.ops.cuda_extern import image_table
    from ninfer_compiler.ops.triton_aot import KernelImage

    img = KernelImage("k", b"\0", b"\0", 0, 4)
    with pytest.raises(ValueError, match="duplicate"):
        image_table([img, img])


def test_extern_library_passes_the_aot_check(tmp_path):
    from tvm.relax.frontend import nn

    from ninfer_compiler.build import compile_module, export_module
    from ninfer_compiler.codegen.export import export_library
    from ninfer_compiler.codegen.fatbin import inspect_library
    from ninfer_compiler.codegen.targets import tvm_target
    from ninfer_compiler.codegen.toolchain import cuda_build
    from ninfer_compiler.ops.cuda_extern import current_arch, extern
    from ninfer_compiler.ops.triton_aot import compile_kernel
    from ninfer_runtime import targets

    require_tool("nvcc", "the CUDA toolkit builds device code")

    def scale(x: nn.Tensor) -> nn.Tensor:
        img = compile_kernel(_scale_kernel, signature=SIGNATURE, constants={"BLOCK": 128},
                             arch=current_arch())
        mod = extern("test_scale", {"ninfer_test_scale": lambda x, f: nn.Tensor.placeholder(x.shape, x.dtype)},
                     LAUNCHER, [img])
        return mod["ninfer_test_scale"](x, 2.0)

    target = targets.load("h200")
    ttarget = tvm_target(target)
    with ttarget:
        mod, _ = export_module(_op_module(scale, {"x": ([4, 1000], "bfloat16")}), {})
    assert "ninfer_test_scale" in mod.script()
    with cuda_build(ttarget):
        exe = compile_module(mod, ttarget)
    lib = export_library(exe, tmp_path / "model.so", target)
    code = inspect_library(lib)
    assert code.problems("sm_90a") == []
    assert code.sass_archs == {"sm_90a"} and not code.ptx_archs
    assert b"ninfer_test_scale" in lib.read_bytes() and b"_scale_kernel" in lib.read_bytes()


def test_interpreter_runs_the_kernel(monkeypatch):
    """Triton's CPU interpreter runs the same kernel source (how kernels are unit-tested here)."""
    torch = pytest.importorskip("torch")
    from ninfer_compiler.ops.triton_aot import interpreted

    rng = np.random.default_rng(0)
    x = torch.tensor(rng.standard_normal(300), dtype=torch.bfloat16)
    y = torch.full((300,), float("nan"), dtype=torch.float32)  # the interpreter truncates to bf16
    kernel = interpreted(_scale_kernel)
    kernel[(3,)](x, y, 300, 2.5, BLOCK=128)
    np.testing.assert_array_equal(y.numpy(), x.float().numpy() * np.float32(2.5))


@pytest.mark.parametrize(("value", "expected"), [(None, "0 none"), ("", "0 none"), ("100", "0 100"), ("0", "0 0"),
                                                  ("101", "-2 none"), ("-5", "-2 none"), ("50%", "-2 none")])
def test_smem_carveout_knob(tmp_path, value, expected):
    """NINFER_SMEM_CARVEOUT (cuda_launch.h, both launchers): unset leaves every kernel to the driver,
    a percentage is set on each kernel loaded, anything else is refused (the launchers turn that into
    an error naming the variable) without touching the kernel."""
    import os
    import subprocess

    from ninfer_compiler.ops import cuda_extern

    require_tool("g++", "the host C++ compiler builds the launchers")
    program = tmp_path / "carveout.cc"
    program.write_text(
        cuda_extern.LAUNCH_HEADER.read_text() + """
#include <cstdio>
struct FakeDriver {
  mutable int attr = -1, value = -1;
  int func_set_attribute(void*, int a, int v) const { attr = a; value = v; return 0; }
};
int main() {
  FakeDriver d;
  const int rc = ninfer_launch::apply_smem_carveout(d, nullptr);
  if (d.attr >= 0 && d.attr != ninfer_launch::kFuncPreferredSharedCarveout) return 3;
  if (d.value >= 0) std::printf("%d %d\\n", rc, d.value); else std::printf("%d none\\n", rc);
  return 0;
}
""")
    subprocess.run(["g++", "-std=c++17", "-Wall", "-Werror", str(program), "-o", str(tmp_path / "carveout")], check=True)
    env = {k: v for k, v in os.environ.items() if k != "NINFER_SMEM_CARVEOUT"}
    if value is not None:
        env["NINFER_SMEM_CARVEOUT"] = value
    out = subprocess.run([str(tmp_path / "carveout")], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == expected
