"""One projection's stored weight as the fused projection kernels see it.

The fused decode GEMVs (`ops/qgemv.py`) and prefill GEMMs (`ops/qgemm.py`) take several weights in
one launch (gate and up of an MLP, the query/key/value/z/gate projections of a layer); a
`LinearWeight` names one of them independently of the module that owns it.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm.relax.frontend import nn

GROUPED = ("q4_g64_fp16", "q5_g64_fp16", "q6_g64_fp16", "q8_g32_fp16")


@dataclass(frozen=True)
class LinearWeight:
    """`W [rows, cols]`: grouped-int planes (`base`, `high` for q5/q6, `scales`) or a dense
    `base` tensor (`fmt` is then its dtype, e.g. `bfloat16`)."""

    fmt: str
    rows: int
    cols: int
    base: nn.Tensor
    high: nn.Tensor | None = None
    scales: nn.Tensor | None = None

    @property
    def grouped(self) -> bool:
        return self.fmt in GROUPED

    @property
    def bits(self) -> int:
        """Code width of a grouped-int weight (16 for a dense bf16 one)."""
        if not self.grouped:
            return 16
        return int(self.fmt[1])


def linear_weight(module: nn.Module) -> LinearWeight | None:
    """The weight of a projection module (`Linear` or grouped-int `QuantizedLinear`), else None
    (nvfp4 and anything else keeps its own unfused path)."""
    base = getattr(module, "base", None)
    if base is not None and getattr(module, "fmt", None) in GROUPED:
        return LinearWeight(module.fmt, module.out_features, module.in_features, base,
                            getattr(module, "high", None), module.scales)
    weight = getattr(module, "weight", None)
    if weight is not None and len(weight.shape) == 2 and str(weight.dtype) == "bfloat16":
        rows, cols = (int(d) for d in weight.shape)
        return LinearWeight("bfloat16", rows, cols, weight)
    return None
