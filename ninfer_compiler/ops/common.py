"""Small helpers shared by the kernels."""

from __future__ import annotations

from tvm import tirx
from tvm.relax.frontend import nn

# Attributes of a hand-written kernel: no scheduler may touch it; buffers never alias
# (in-place arguments are one buffer, so this still holds).
SCHEDULED_ATTRS = {"tirx.is_scheduled": True, "tirx.noalias": True}


def i32(value: int) -> tirx.IntImm:
    """A scalar int32 kernel argument (layer index and similar)."""
    return tirx.IntImm("int32", value)


def placeholder_like(t: nn.Tensor) -> nn.Tensor:
    """Output placeholder of an in-place argument (same shape and dtype)."""
    return nn.Tensor.placeholder(t.shape, t.dtype)


def dtype_tag(dtype: str) -> str:
    """Short dtype name for kernel names (`float32` -> `f32`)."""
    return {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}.get(dtype, dtype)
