"""Norm modules (parameter `weight`), thin wrappers over `ops.norm`."""

from __future__ import annotations

from tvm.relax.frontend import nn

from ...ops.norm import gated_rms_norm, rms_norm


class OffsetRMSNorm(nn.Module):
    """`rms(x) * (1 + w)`: Qwen3.5's zero-centred norm (`Qwen3_5RMSNorm`)."""

    def __init__(self, dim: int, eps: float, weight_dtype: str = "float32"):
        self.eps = eps
        self.weight = nn.Parameter((dim,), weight_dtype)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        return rms_norm(x, self.weight, self.eps, offset=True)


class GatedRMSNorm(nn.Module):
    """`rms(x) * w * silu(gate)` with a plain weight (`Qwen3_5RMSNormGated`)."""

    def __init__(self, dim: int, eps: float, weight_dtype: str = "float32"):
        self.eps = eps
        self.weight = nn.Parameter((dim,), weight_dtype)

    def forward(self, x: nn.Tensor, gate: nn.Tensor) -> nn.Tensor:
        return gated_rms_norm(x, self.weight, gate, self.eps)
