"""Compile-time model options shared by all architectures: dtypes and weight formats."""

from __future__ import annotations

from dataclasses import dataclass, field
from fnmatch import fnmatchcase

DENSE_DTYPES = {
    "float32": "float32",
    "fp32": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
}
QUANTIZED_FORMATS = ("q4_g64_fp16", "q5_g64_fp16", "q6_g64_fp16", "q8_g32_fp16", "nvfp4", "fp8_e4m3fn_row_bf16")


def canonical_format(fmt: str) -> str:
    """`bf16` -> `bfloat16` etc.; quantized names unchanged; anything else is an error."""
    if fmt in DENSE_DTYPES:
        return DENSE_DTYPES[fmt]
    if fmt in QUANTIZED_FORMATS:
        return fmt
    known = ", ".join([*DENSE_DTYPES, *QUANTIZED_FORMATS])
    raise ValueError(f"unknown weight format {fmt!r} (known: {known})")


@dataclass(frozen=True)
class WeightPlan:
    """Storage format of every parameter, chosen by module path (`layers.3.mlp.down`).

    `overrides` are `(fnmatch pattern, format)` pairs, first match wins. Unmatched linear
    layers and embedding tables use `default`; unmatched parameters that must stay dense
    (norms, the GDN convolution) use `dense_default`, which when empty is `default` if that
    is dense, else `bfloat16` (what quantized artifacts store for them). Formats are dense
    dtypes (`float32`, `bfloat16`, `float16`) or the artifact's grouped-int formats
    (`q4_g64_fp16`, ...). Parameters whose format the model fixes (GDN `a_log`, `dt_bias`:
    fp32) ignore the plan.
    """

    default: str = "float32"
    overrides: tuple[tuple[str, str], ...] = ()
    dense_default: str = ""

    def __post_init__(self) -> None:
        canonical_format(self.default)
        for _, fmt in self.overrides:
            canonical_format(fmt)
        if self.dense_default and canonical_format(self.dense_default) not in DENSE_DTYPES.values():
            raise ValueError(f"dense_default must be a dense dtype, got {self.dense_default!r}")

    def _override(self, path: str) -> str | None:
        for pattern, fmt in self.overrides:
            if fnmatchcase(path, pattern):
                return canonical_format(fmt)
        return None

    def format_of(self, path: str) -> str:
        """Format of a linear layer or embedding table."""
        return self._override(path) or canonical_format(self.default)

    def dense_dtype_of(self, path: str) -> str:
        """Dtype of a parameter that must stay dense (norms, convolution)."""
        fmt = self._override(path)
        if fmt is None:
            fmt = canonical_format(self.dense_default or self.default)
            if fmt not in DENSE_DTYPES.values():
                fmt = "bfloat16"
        if fmt not in DENSE_DTYPES.values():
            raise ValueError(f"parameter {path!r} must be dense, but the weight plan says {fmt!r}")
        return fmt


@dataclass(frozen=True)
class ModelOptions:
    """How to compile one model: activation dtype, weight formats, KV page size."""

    dtype: str = "float32"
    weights: WeightPlan = field(default_factory=WeightPlan)
    page_size: int = 16

    def __post_init__(self) -> None:
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"activation dtype must be float32, bfloat16 or float16, got {self.dtype!r}")
        if self.page_size < 1:
            raise ValueError(f"page_size must be positive, got {self.page_size}")
