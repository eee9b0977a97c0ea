"""Shared helpers for compiler tests: compile a single function of nn ops for llvm."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest


def _op_module(fn: Callable, inputs: dict[str, tuple[list, str]]):
    """A parameterless nn.Module whose `main(<inputs>)` calls `fn`."""
    from tvm.relax.frontend import nn
    from tvm.relax.frontend.nn import spec

    class OpModule(nn.Module):
        def get_export_spec(self) -> dict:
            fields = {name: spec.Tensor(shape, dtype) for name, (shape, dtype) in inputs.items()}
            return {"main": {**fields, "$": {"param_mode": "none", "effect_mode": "none"}}}

    def main(*args):
        return fn(*args)

    # The exporter reads argument names from the method signature.
    main.__signature__ = inspect.Signature(
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in inputs]
    )
    module = OpModule()
    module.main = main
    return module


def h200_library(fn: Callable, inputs: dict[str, tuple[list, str]], out: Path) -> tuple[str, Path]:
    """`fn(*inputs)` exported for the h200 target, compiled and linked into the library `out`
    (needs nvcc); returns the exported Relax module's script and the library. Every embedded image
    must be sm_90a SASS with no problem the package checks would report."""
    from ninfer_compiler.build import compile_module, export_module
    from ninfer_compiler.codegen.export import export_library
    from ninfer_compiler.codegen.fatbin import inspect_library
    from ninfer_compiler.codegen.targets import tvm_target
    from ninfer_compiler.codegen.toolchain import cuda_build
    from ninfer_runtime import targets

    from .codegen.conftest import require_tool

    require_tool("nvcc", "the CUDA toolkit builds device code")
    target = targets.load("h200")
    ttarget = tvm_target(target)
    with ttarget:
        mod, _ = export_module(_op_module(fn, inputs), {})
    with cuda_build(ttarget):
        exe = compile_module(mod, ttarget)
    lib = export_library(exe, out, target)
    code = inspect_library(lib)
    assert code.problems("sm_90a") == [] and code.sass_archs == {"sm_90a"}
    return mod.script(), lib


def build_launcher(source: str, out_dir: Path) -> str:
    """Compile one launcher translation unit (`cuda_extern.host_source(...)`) to an object as the
    package build does, but under -Wall -Werror; returns its `nm` listing."""
    import shutil
    import subprocess

    from tvm.relax.frontend import nn

    from .codegen.conftest import require_tool

    require_tool("g++", "the host compiler builds the launchers")
    src, obj = out_dir / "launcher.cc", out_dir / "launcher.o"
    src.write_text(source)
    flags = [f for f in nn.SourceModule.get_compile_options("cpp") if f != "-O3"]
    proc = subprocess.run([shutil.which("g++"), *flags, "-O1", "-fPIC", "-Wall", "-Werror", str(src), "-o", str(obj)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return subprocess.run(["nm", str(obj)], capture_output=True, text=True, check=True).stdout


def compile_op(fn: Callable, inputs: dict[str, tuple[list, str]]) -> Callable:
    """Compile `fn(*inputs)` for llvm; returns `run(*arrays) -> (outputs, inputs_after)`.

    Inputs are copied to device tensors and also returned after the call, so in-place
    kernels can be checked.
    """
    import tvm

    from ninfer_compiler.build import compile_module, load_vm

    model = _op_module(fn, inputs)
    mod, _ = model.export_tvm(spec=model.get_export_spec())
    vm = load_vm(compile_module(mod, "llvm"))

    def run(*arrays: np.ndarray):
        tensors = [tvm.runtime.tensor(a) for a in arrays]
        out = vm["main"](*tensors)
        outs = list(out) if isinstance(out, tvm.ir.Array | tuple | list) else [out]
        return [o.numpy() for o in outs], [t.numpy() for t in tensors]

    return run


@pytest.fixture
def op_compiler() -> Callable:
    pytest.importorskip("tvm")
    return compile_op
