"""Planes: the stored words of quantized tensors, without any float round trip."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class GroupedPlanes:
    """q4/q5/q6/q8 planes: signed logical codes [N, K] and binary16 scale words [N, groups]."""

    fmt: str
    codes: np.ndarray  # int8 [N, K]
    scales: np.ndarray  # uint16 [N, groups_per_row], all-padding groups included (0)


@dataclass
class NvFp4Planes:
    """nvfp4 planes: E2M1 words [N, K], natural E4M3FN block scales [N, K/16], divisor word."""

    codes: np.ndarray  # uint8 [N, K], 0..15
    scales: np.ndarray  # uint8 [N, K // 16], unswizzled
    divisor: np.ndarray  # uint32 0-d, raw binary32 word


@dataclass
class Fp8RowPlanes:
    """fp8 row-scaled planes: E4M3FN codes [N, K] and one bf16 scale word per row."""

    codes: np.ndarray  # uint8 [N, K]
    scales: np.ndarray  # uint16 [N]


Planes = GroupedPlanes | NvFp4Planes | Fp8RowPlanes
