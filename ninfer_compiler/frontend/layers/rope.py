"""Rotary position embedding settings of a model (no parameters)."""

from __future__ import annotations

from dataclasses import dataclass

from tvm.relax.frontend import nn

from ...ops.rope import apply_mrope


@dataclass(frozen=True)
class MRope:
    """Interleaved MRoPE over the first `rotary_dim` features of each head.

    Called with `positions [3, B, T]`; text tokens repeat their position on all three rows,
    vision tokens will bring their own (t, h, w) rows without changing this layer.
    """

    rotary_dim: int
    theta: float
    sections: tuple[int, int, int]

    def __call__(self, x: nn.Tensor, positions: nn.Tensor) -> nn.Tensor:
        return apply_mrope(x, positions, self.rotary_dim, self.theta, self.sections)
