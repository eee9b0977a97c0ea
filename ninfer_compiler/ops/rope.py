"""Interleaved multimodal RoPE (Qwen3.5 MRoPE) applied to `[B, T, H, D]` heads.

Positions come as `[3, B, T]` int32 rows (temporal, height, width). Frequency pair `j` of the
rotary width `R` follows row H when `j % 3 == 1 and j < 3 * s_H`, row W when
`j % 3 == 2 and j < 3 * s_W`, else row T (spec 1.2). Text tokens carry three equal rows, so
text-only input is 1-D partial RoPE; vision positions need no other kernel. Features
`[R, D)` pass through. Rotation is split-half (NeoX) and computed in fp32.
"""

from __future__ import annotations

import numpy as np
from tvm import te, tirx
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import op

from .common import dtype_tag


def rope_inv_freq(rotary_dim: int, theta: float) -> np.ndarray:
    """`theta^(-2j/R)` in fp32, computed the way HF does (fp32 exponent, fp32 power)."""
    exponent = np.arange(0, rotary_dim, 2, dtype=np.float32) / np.float32(rotary_dim)
    return (np.float32(1.0) / np.power(np.float32(theta), exponent, dtype=np.float32)).astype(
        np.float32
    )


def mrope_axis(j: int, sections: tuple[int, int, int]) -> int:
    """Which position row (0 = T, 1 = H, 2 = W) frequency pair `j` follows."""
    if j % 3 == 1 and j < 3 * sections[1]:
        return 1
    if j % 3 == 2 and j < 3 * sections[2]:
        return 2
    return 0


def apply_mrope(
    x: nn.Tensor,
    positions: nn.Tensor,
    rotary_dim: int,
    theta: float,
    sections: tuple[int, int, int],
) -> nn.Tensor:
    """Rotate the first `rotary_dim` features of every head of `x [B, T, H, D]`."""
    half = rotary_dim // 2
    if sum(sections) != half:
        raise ValueError(f"mrope_section {list(sections)} must sum to rotary_dim/2 = {half}")
    inv_freq = nn.Tensor.from_const(rope_inv_freq(rotary_dim, theta))
    s_h, s_w = sections[1], sections[2]

    def compute(x: te.Tensor, pos: te.Tensor, inv: te.Tensor) -> te.Tensor:
        def f(b, t, h, d):
            in_rot = d < rotary_dim
            j = tirx.indexmod(d, half)
            use_h = tirx.all(tirx.indexmod(j, 3) == 1, j < 3 * s_h)
            use_w = tirx.all(tirx.indexmod(j, 3) == 2, j < 3 * s_w)
            row = tirx.Select(use_h, 1, tirx.Select(use_w, 2, 0))
            angle = pos[row, b, t].astype("float32") * inv[j]
            first = d < half
            partner = tirx.Select(first, d + half, d - half)
            partner = tirx.Select(in_rot, partner, d)
            sign = tirx.Select(first, tirx.const(-1.0, "float32"), tirx.const(1.0, "float32"))
            xv = x[b, t, h, d].astype("float32")
            rotated = xv * tirx.cos(angle) + sign * x[b, t, h, partner].astype("float32") * tirx.sin(
                angle
            )
            return tirx.Select(in_rot, rotated, xv).astype(x.dtype)

        return te.compute(x.shape, f, name="mrope")

    name = f"mrope_r{rotary_dim}_{dtype_tag(x.dtype)}"
    return op.tensor_expr_op(compute, name, [x, positions, inv_freq])
