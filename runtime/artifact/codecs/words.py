"""Word tables and exact conversions (bf16, binary16, E4M3FN, E2M1)."""

from __future__ import annotations

import numpy as np

E2M1_MAGNITUDES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)


def _e4m3fn_table() -> np.ndarray:
    """Value of every E4M3FN word (spec 3.3 table), written out rather than taken from a library."""
    table = np.empty(256, dtype=np.float32)
    for word in range(256):
        sign = -1.0 if word & 0x80 else 1.0
        e, m = (word >> 3) & 0xF, word & 0x7
        if e == 15 and m == 7:
            value = float("nan")
        elif e == 0:
            value = m * 2.0**-9
        else:
            value = (1 + m / 8) * 2.0 ** (e - 7)
        table[word] = sign * value
    return table


E4M3FN_VALUES = _e4m3fn_table()
E2M1_VALUES = np.concatenate([E2M1_MAGNITUDES, -E2M1_MAGNITUDES])


def bf16_words_to_f32(words: np.ndarray) -> np.ndarray:
    """Exact bf16 -> binary32: the word becomes the high half (NaN payloads kept)."""
    return (np.asarray(words, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_words(x: np.ndarray) -> np.ndarray:
    """binary32 -> bf16 words, round to nearest even; NaN stays NaN (quiet bit forced)."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    nan_words = ((u >> 16) | np.uint32(0x0040)).astype(np.uint16)
    is_nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    return np.where(is_nan, nan_words, rounded)


def f16_words_to_f32(words: np.ndarray) -> np.ndarray:
    """Exact binary16 -> binary32 of raw words."""
    return np.asarray(words, dtype=np.uint16).view(np.float16).astype(np.float32)
