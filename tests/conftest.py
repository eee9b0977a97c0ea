"""Test-wide settings that must precede any import of the code under test."""

import os

# Triton kernels run in Triton's CPU interpreter in the tests (no GPU here or in CI); compiling
# them ahead of time still works (`ops/triton_aot.py` compiles in a child process then).
os.environ.setdefault("TRITON_INTERPRET", "1")


def _interpreter_bf16_dot() -> None:
    """Triton 3.9's interpreter keeps bf16 as raw uint16 and multiplies those integers in
    `tl.dot`; widen bf16 operands to the float32 they encode first (exact) so bf16 kernels can
    be checked here."""
    try:
        import numpy as np
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return
    original = interpreter.InterpreterBuilder.create_dot

    def widened(h):
        if h.dtype.scalar == tl.bfloat16 or h.dtype == tl.bfloat16:
            return (h.data.astype(np.uint32) << 16).view(np.float32)
        return h.data

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if tl.bfloat16 in (a.dtype, b.dtype, a.dtype.scalar, b.dtype.scalar):
            out = np.matmul(widened(a), widened(b), dtype=d.data.dtype) + d.data
            return interpreter.TensorHandle(out, d.dtype.scalar)
        return original(self, a, b, d, input_precision, max_num_imprecise_acc)

    interpreter.InterpreterBuilder.create_dot = create_dot


_interpreter_bf16_dot()
