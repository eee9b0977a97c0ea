"""Shared helpers for compiler tests: compile a single function of nn ops for llvm."""

from __future__ import annotations

import inspect
from collections.abc import Callable

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
