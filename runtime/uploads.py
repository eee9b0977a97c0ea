"""The decode step's small transfers queued on the stream instead of blocking copies.

Why: TVM's `Tensor.copyfrom` is a synchronous `cudaMemcpy` from pageable memory followed by a
stream synchronisation: 30-80 us of host time per array on the H200 machine, and a decode step
uploads three (tokens, positions, cached lengths) before its graph can be queued while the GPU
idles. Here each input has a slot of page-locked host memory and its copy is queued with
`cuMemcpyHtoDAsync` on the legacy default stream, which TVM's CUDA graphs launch on, so the graph
runs after the copies and the host does not wait for them. A slot is written again only after the
copies queued from it have run (an event recorded after them).

The same holds the other way (`DeviceQueue`): a step's greedy choices are copied into
page-locked memory behind the step and read when the host needs them (an event per read-back
slot), and a token the previous step chose on the device is copied into the next step's input on
the device, so a generation loop can queue step n + 1 before it reads step n's tokens.

Only the CUDA driver is used (`libcuda`, through ctypes); where it or page-locked memory is not
available, or `NINFER_PINNED_UPLOADS=0`, `stager_for` and `queue_for` return None and the caller
copies as before (synchronously).
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
                           ("cuMemcpyDtoHAsync_v2", [vp, u64, sz, vp]),
                           ("cuMemcpyDtoDAsync_v2", [u64, u64, sz, vp]),
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


class _Pinned:
    """`nbytes` of page-locked memory and `events` events of the context current at creation
    (freed when the object is collected); calls rebind that context where another one is current."""

    def __init__(self, driver: _Driver, nbytes: int, events: int) -> None:
        self._driver = driver
        ctx = ctypes.c_void_p()
        driver("cuCtxGetCurrent", ctypes.byref(ctx))
        if not ctx.value:
            raise DriverError("no current CUDA context")
        self._ctx = ctx
        base = ctypes.c_void_p()
        driver("cuMemHostAlloc", ctypes.byref(base), nbytes, 0)
        self._base = base.value
        self._events: list[ctypes.c_void_p] = []
        try:
            for _ in range(events):
                event = ctypes.c_void_p()
                driver("cuEventCreate", ctypes.byref(event), EVENT_DISABLE_TIMING)
                self._events.append(event)
        except DriverError:
            _free(driver, self._base, [e.value for e in self._events])
            raise
        self._memory = (ctypes.c_uint8 * nbytes).from_address(self._base)
        weakref.finalize(self, _free, driver, self._base, [e.value for e in self._events])

    def _current(self) -> None:
        ctx = ctypes.c_void_p()
        self._driver("cuCtxGetCurrent", ctypes.byref(ctx))
        if ctx.value != self._ctx.value:  # (another thread: TVM binds the context per call)
            self._driver("cuCtxSetCurrent", self._ctx)


class PinnedStager(_Pinned):
    """Page-locked slots of `sizes[i]` bytes; `upload(i, array, device_ptr)` queues a copy of
    `array` from slot i to `device_ptr`; `queued()` marks the end of one step's copies."""

    def __init__(self, sizes: list[int], driver: _Driver) -> None:
        self._sizes = list(sizes)
        self._offsets = np.concatenate([[0], np.cumsum([-(-s // 64) * 64 for s in sizes])]).astype(int)
        super().__init__(driver, int(self._offsets[-1]), 1)
        self._event = self._events[0]
        self._pending = False  # copies queued since the event was last waited for

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


class ReadBack:
    """One queued read-back: `wait()` returns its arrays once the copies have run."""

    def __init__(self, queue: DeviceQueue, slot: int, shapes: list[tuple[int, np.dtype]]) -> None:
        self._queue, self._slot, self._shapes = queue, slot, shapes
        self._arrays: list[np.ndarray] | None = None

    @property
    def done(self) -> bool:
        return self._arrays is not None

    def wait(self) -> list[np.ndarray]:
        if self._arrays is None:
            self._arrays = self._queue._collect(self._slot, self._shapes)
        return self._arrays


class DeviceQueue(_Pinned):
    """Copies on the legacy default stream, behind the work queued before them: device to device
    (`copy`), and device to page-locked host memory (`read_back`, `slots` of `slot_bytes` used
    in turn, each with its event; a slot is reused only after what was read into it is taken)."""

    def __init__(self, driver: _Driver, slot_bytes: int, slots: int = 4) -> None:
        self._slot_bytes = -(-slot_bytes // 64) * 64
        super().__init__(driver, self._slot_bytes * slots, slots)
        self._owners: list[ReadBack | None] = [None] * slots
        self._next = 0

    def copy(self, dst_ptr: int, src_ptr: int, nbytes: int) -> None:
        """Queue a device-to-device copy."""
        self._current()
        self._driver("cuMemcpyDtoDAsync_v2", ctypes.c_uint64(dst_ptr), ctypes.c_uint64(src_ptr), nbytes,
                     LEGACY_STREAM)

    def read_back(self, sources: list[tuple[int, int, np.dtype]]) -> ReadBack:
        """Queue copies of `(device_ptr, count, dtype)` arrays into the next slot; the caller keeps
        the source memory unchanged until they have run (the stream's order does that for a step's
        outputs)."""
        shapes = [(count, np.dtype(dtype)) for _, count, dtype in sources]
        need = sum(_padded(c * d.itemsize) for c, d in shapes)
        if need > self._slot_bytes:
            raise ValueError(f"read-back of {need} bytes (each array 16-byte aligned) does not fit a "
                             f"{self._slot_bytes}-byte slot")
        slot = self._next
        self._next = (slot + 1) % len(self._owners)
        owner = self._owners[slot]
        if owner is not None and not owner.done:
            owner.wait()  # (its arrays leave the slot before new ones land there)
        self._current()
        at = self._base + slot * self._slot_bytes
        for (ptr, count, _), (_, dtype) in zip(sources, shapes, strict=True):
            nbytes = count * dtype.itemsize
            self._driver("cuMemcpyDtoHAsync_v2", ctypes.c_void_p(at), ctypes.c_uint64(ptr), nbytes, LEGACY_STREAM)
            at += _padded(nbytes)
        self._driver("cuEventRecord", self._events[slot], LEGACY_STREAM)
        ticket = self._owners[slot] = ReadBack(self, slot, shapes)
        return ticket

    def _collect(self, slot: int, shapes: list[tuple[int, np.dtype]]) -> list[np.ndarray]:
        self._current()
        self._driver("cuEventSynchronize", self._events[slot])
        out, at = [], slot * self._slot_bytes
        for count, dtype in shapes:
            nbytes = count * dtype.itemsize
            out.append(np.frombuffer(self._memory, dtype=dtype, count=count, offset=at).copy())
            at += _padded(nbytes)
        return out


def _padded(nbytes: int) -> int:
    """Bytes an array takes in a read-back slot (each starts 16-byte aligned)."""
    return -(-nbytes // 16) * 16


def _free(driver: _Driver, base: int, events: list[int]) -> None:
    try:
        for event in events:
            driver("cuEventSynchronize", ctypes.c_void_p(event))
            driver("cuEventDestroy_v2", ctypes.c_void_p(event))
        driver("cuMemFreeHost", ctypes.c_void_p(base))
    except DriverError:  # (at interpreter exit the context may be gone already)
        pass


def _build(device_kind: str, make):  # noqa: ANN001, ANN202
    """`make(driver)` for CUDA devices, or None: another device, no driver, no page-locked memory
    or events, or NINFER_PINNED_UPLOADS=0 (the caller then copies synchronously)."""
    if device_kind != "cuda" or os.environ.get("NINFER_PINNED_UPLOADS", "1") == "0":
        return None
    driver = _load_driver()
    if driver is None:
        return None
    try:
        return make(driver)
    except DriverError:
        return None


def queue_for(slot_bytes: int, device_kind: str) -> DeviceQueue | None:
    """A read-back and device-copy queue for CUDA devices, or None (read synchronously)."""
    return _build(device_kind, lambda driver: DeviceQueue(driver, slot_bytes))


def stager_for(sizes: list[int], device_kind: str) -> PinnedStager | None:
    """A stager for CUDA devices, or None (copy with `Tensor.copyfrom`)."""
    return _build(device_kind, lambda driver: PinnedStager(sizes, driver))
