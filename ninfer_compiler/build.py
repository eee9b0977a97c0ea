"""Export an `nn.Module` model's entry functions and compile them to a VM executable.

A model class provides `get_export_spec()` (the `export_tvm` spec of its entry functions)
and `upper_bounds()` (`{function: {symbolic dim: max}}`, which lets memory planning give
dynamic intermediates static storage). Parameters are passed at run time as one packed
tuple in the order of `CompiledModel.param_names`; weights never go into the library.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import tvm
from tvm import relax
from tvm.relax.frontend import nn

from .passes.pipeline import relax_pipeline


@dataclass
class ParamSpec:
    """Name, shape and dtype of one packed parameter, in call order."""

    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass
class CompiledModel:
    """A compiled executable plus what a caller needs to feed it."""

    executable: Any  # tvm.relax.VMExecutable
    params: list[ParamSpec]
    entry_functions: list[str]
    export_seconds: float = 0.0
    compile_seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def param_names(self) -> list[str]:
        return [p.name for p in self.params]

    @property
    def param_dtypes(self) -> dict[str, str]:
        return {p.name: p.dtype for p in self.params}


def export_module(
    model: nn.Module, upper_bounds: dict[str, dict[str, int]] | None = None
) -> tuple[tvm.IRModule, list[ParamSpec]]:
    """Trace `model`'s entry functions to Relax and attach the dynamic-dimension bounds.

    `upper_bounds` (`{function: {dim: max}}`) defaults to `model.upper_bounds()`.
    """
    mod, named_params, ext_mods = model.export_tvm(spec=model.get_export_spec(), allow_extern=True)
    if ext_mods:  # our CUDA kernels' host launchers, compiled (or taken from the cache) and linked in
        from .codegen.toolchain import host_objects

        mod = relax.transform.AttachExternModules(host_objects(ext_mods))(mod)
    bounds_by_func = model.upper_bounds() if upper_bounds is None else upper_bounds
    for func_name, bounds in bounds_by_func.items():
        gv = mod.get_global_var(func_name)
        mod[gv] = mod[gv].with_attr("tir_var_upper_bound", bounds)
    params = [
        ParamSpec(name, tuple(int(d) for d in p.shape), str(p.dtype)) for name, p in named_params
    ]
    return mod, params


def compile_module(mod: tvm.IRModule, target: tvm.target.Target | str = "llvm") -> Any:
    """Compile a Relax module with our pipeline for `target`."""
    target = tvm.target.Target(target) if isinstance(target, str) else target
    with target:
        return tvm.compile(mod, target=target, relax_pipeline=relax_pipeline(target))


def build_model(
    model: nn.Module,
    target: tvm.target.Target | str = "llvm",
    upper_bounds: dict[str, dict[str, int]] | None = None,
) -> CompiledModel:
    """Export and compile `model`; times both steps (compile time is part of our reports)."""
    target = tvm.target.Target(target) if isinstance(target, str) else target
    start = time.perf_counter()
    with target:  # the ops choose their kernel variant (CPU or GPU) from the current target
        mod, params = export_module(model, upper_bounds)
    exported = time.perf_counter()
    executable = compile_module(mod, target)
    done = time.perf_counter()
    return CompiledModel(
        executable=executable,
        params=params,
        entry_functions=list(model.get_export_spec()),
        export_seconds=exported - start,
        compile_seconds=done - exported,
    )


def load_vm(executable: Any, device: tvm.runtime.Device | None = None) -> relax.VirtualMachine:
    """A VM over a freshly compiled executable (tests and tools; the runtime loads the .so)."""
    return relax.VirtualMachine(executable, device or tvm.cpu())
