"""Test-wide settings that must precede any import of the code under test."""

import os

# Triton kernels run in Triton's CPU interpreter in the tests (no GPU here or in CI); compiling
# them ahead of time still works (`ops/triton_aot.py` compiles in a child process then).
os.environ.setdefault("TRITON_INTERPRET", "1")


def _interpreter_bf16() -> None:
    """Make Triton 3.9's interpreter treat bf16 as the GPU does.

    It keeps bf16 as raw uint16 and multiplies those integers in `tl.dot` (we widen bf16
    operands to the float32 they encode first, exactly), and it truncates float32 -> bf16
    casts (we round to nearest even, the GPU's `.to(tl.bfloat16)`).
    """
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

    original_cast = interpreter.InterpreterBuilder.cast_impl

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            bits = np.ascontiguousarray(src.data, dtype=np.float32).view(np.uint32).astype(np.uint64)
            rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
            return interpreter.TensorHandle(rounded, dst_type.scalar)
        return original_cast(self, src, dst_type)

    interpreter.InterpreterBuilder.cast_impl = cast_impl
    interpreter.InterpreterBuilder.create_fp_trunc = lambda self, src, dst_type: self.cast_impl(src, dst_type)


_interpreter_bf16()
