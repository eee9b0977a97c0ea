"""The decode graph's small inputs uploaded without a blocking copy each.

Why: TVM's `Tensor.copyfrom` is a synchronous `cudaMemcpy` from pageable memory followed by a
stream synchronisation: 30-80 us of host time per array on the H200 machine, and a decode step
uploads three (tokens, positions, cached lengths) before its graph can be queued while the GPU
idles. Here each input has a slot of page-locked host memory and its copy is queued with
`cuMemcpyHtoDAsync` on the legacy default stream, which TVM's CUDA graphs launch on, so the graph
runs after the copies and the host does not wait for them. A slot is written again only after the
copies queued from it have run (an event recorded after them).

Only the CUDA driver is used (`libcuda`, through ctypes); where it or page-locked memory is not
available, or `NINFER_PINNED_UPLOADS=0`, `stager_for` returns None and the caller copies as before.
"""

from __future__ import annotations

import ctypes
import os
import weakref

import numpy as np

LEGACY_STREAM = None  # CUstream 0: the legacy default stream
EVENT_DISABLE_TIMING = 2


class DriverError(RuntimeError):
    """A CUDA driver call failed (the result code is in the message)."""


class _Driver:
    """The few driver entry points the stager needs."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        u64, vp, sz = ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t
        self._fns = {}
        for name, args in (("cuMemHostAlloc", [ctypes.POINTER(vp), sz, ctypes.c_uint]),
                           ("cuMemFreeHost", [vp]),
                           ("cuMemcpyHtoDAsync_v2", [u64, vp, sz, vp]),
                           ("cuEventCreate", [ctypes.POINTER(vp), ctypes.c_uint]),
                           ("cuEventRecord", [vp, vp]),
                           ("cuEventSynchronize", [vp]),
                           ("cuEventDestroy_v2", [vp]),
                           ("cuCtxGetCurrent", [ctypes.POINTER(vp)]),
                           ("cuCtxSetCurrent", [vp])):
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, ctypes.c_int
            self._fns[name] = fn

    def __call__(self, name: str, *args) -> None:  # noqa: ANN002
        rc = self._fns[name](*args)
        if rc != 0:
            raise DriverError(f"{name} failed with CUDA error {rc}")


def _load_driver() -> _Driver | None:
    try:
        return _Driver(ctypes.CDLL("libcuda.so.1"))
    except (OSError, AttributeError):
        return None


class PinnedStager:
    """Page-locked slots of `sizes[i]` bytes; `upload(i, array, device_ptr)` queues a copy of
    `array` from slot i to `device_ptr`; `queued()` marks the end of one step's copies."""

    def __init__(self, sizes: list[int], driver: _Driver) -> None:
        self._driver, self._sizes = driver, list(sizes)
        self._offsets = np.concatenate([[0], np.cumsum([-(-s // 64) * 64 for s in sizes])]).astype(int)
        ctx = ctypes.c_void_p()
        driver("cuCtxGetCurrent", ctypes.byref(ctx))
        if not ctx.value:
            raise DriverError("no current CUDA context")
        self._ctx = ctx
        base = ctypes.c_void_p()
        driver("cuMemHostAlloc", ctypes.byref(base), int(self._offsets[-1]), 0)
        self._base = base.value
        event = ctypes.c_void_p()
        try:
            driver("cuEventCreate", ctypes.byref(event), EVENT_DISABLE_TIMING)
        except DriverError:
            driver("cuMemFreeHost", ctypes.c_void_p(self._base))
            raise
        self._event = event
        self._pending = False  # copies queued since the event was last waited for
        self._memory = (ctypes.c_uint8 * int(self._offsets[-1])).from_address(self._base)
        weakref.finalize(self, _release, driver, self._base, event.value)

    def _current(self) -> None:
        ctx = ctypes.c_void_p()
        self._driver("cuCtxGetCurrent", ctypes.byref(ctx))
        if ctx.value != self._ctx.value:  # (another thread: TVM binds the context per call)
            self._driver("cuCtxSetCurrent", self._ctx)

    def upload(self, slot: int, array: np.ndarray, device_ptr: int) -> None:
        array = np.ascontiguousarray(array)
        start = int(self._offsets[slot])
        if array.nbytes > self._sizes[slot]:
            raise ValueError(f"upload slot {slot}: {array.nbytes} bytes do not fit in {self._sizes[slot]}")
        self._current()
        if self._pending:  # the slots may still be read by the copies of the step before
            self._driver("cuEventSynchronize", self._event)
            self._pending = False
        view = np.frombuffer(self._memory, dtype=np.uint8, count=array.nbytes, offset=start)
        view[:] = array.reshape(-1).view(np.uint8)
        self._driver("cuMemcpyHtoDAsync_v2", ctypes.c_uint64(device_ptr), ctypes.c_void_p(self._base + start),
                     array.nbytes, LEGACY_STREAM)

    def queued(self) -> None:
        """After a step's uploads: the event the next step's slot writes wait for."""
        self._driver("cuEventRecord", self._event, LEGACY_STREAM)
        self._pending = True


def _release(driver: _Driver, base: int, event: int) -> None:
    try:
        driver("cuEventSynchronize", ctypes.c_void_p(event))
        driver("cuEventDestroy_v2", ctypes.c_void_p(event))
        driver("cuMemFreeHost", ctypes.c_void_p(base))
    except DriverError:  # (at interpreter exit the context may be gone already)
        pass


def stager_for(sizes: list[int], device_kind: str) -> PinnedStager | None:
    """A stager for CUDA devices, or None (copy with `Tensor.copyfrom`): another device, no driver,
    no page-locked memory, or NINFER_PINNED_UPLOADS=0."""
    if device_kind != "cuda" or os.environ.get("NINFER_PINNED_UPLOADS", "1") == "0":
        return None
    driver = _load_driver()
    if driver is None:
        return None
    try:
        return PinnedStager(sizes, driver)
    except DriverError:
        return None
