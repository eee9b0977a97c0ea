"""Bounded, validated reads of an object's bytes through a `ReadFn`."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..errors import ArtifactError

ReadFn = Callable[[int, int], bytes | memoryview]
Rows = tuple[int, int] | None


def memory_reader(buf: bytes | bytearray | memoryview) -> ReadFn:
    """A ReadFn over an in-memory object (tests, freshly encoded tensors)."""
    view = memoryview(buf).cast("B")

    def read(offset: int, length: int) -> memoryview:
        return view[offset : offset + length]

    return read


def _read(read: ReadFn, offset: int, length: int, obj: str | None) -> np.ndarray:
    """Read exactly `length` bytes as uint8; a short or long answer is a damaged object."""
    if length == 0:
        return np.empty(0, dtype=np.uint8)
    data = read(offset, length)
    got = memoryview(data).nbytes
    if got != length:
        raise ArtifactError(
            "short_read", f"read of {length} bytes at offset {offset} returned {got}", obj=obj
        )
    return np.frombuffer(data, dtype=np.uint8)


def _check_zero_gap(read: ReadFn, start: int, end: int, obj: str | None) -> None:
    """Gap bytes between planes must be zero (spec 4.3.2, 4.4, 4.5)."""
    gap = _read(read, start, end - start, obj)
    if gap.any():
        at = start + int(np.flatnonzero(gap)[0])
        raise ArtifactError("padding", f"non-zero gap byte at offset {at}", obj=obj)


def _row_range(rows: Rows, n: int, obj: str | None) -> tuple[int, int]:
    if rows is None:
        return 0, n
    r0, r1 = (int(r) for r in rows)
    if not 0 <= r0 <= r1 <= n:
        raise ArtifactError(
            "row_range", f"rows [{r0}, {r1}) are not a range within [0, {n}]", obj=obj
        )
    return r0, r1


def _first(mask: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i) for i in np.argwhere(mask)[0])
