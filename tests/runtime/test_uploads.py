"""The decode graph inputs' page-locked uploads (`ninfer_runtime.uploads`), against a driver that
runs in host memory: slot layout, the copies, the wait before a slot is written again, the context
rebinding, and the fallback where the driver fails."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from ninfer_runtime import uploads


class FakeDriver:
    """The driver calls the stager makes, on host memory; copies run when the event is waited for
    (as a GPU that is still busy would), so a slot rewritten too early shows as a wrong copy."""

    def __init__(self, fail: str = "") -> None:
        self.fail, self.calls, self.pending, self.keep = fail, [], [], []
        self.ctx = 0x1234

    def __call__(self, name: str, *args) -> None:  # noqa: ANN002
        self.calls.append(name)
        if name == self.fail:
            raise uploads.DriverError(f"{name} failed with CUDA error 2")
        if name == "cuMemHostAlloc":
            buf = ctypes.create_string_buffer(args[1])
            self.keep.append(buf)
            args[0]._obj.value = ctypes.addressof(buf)
        elif name == "cuEventCreate":
            args[0]._obj.value = 0x77
        elif name == "cuCtxGetCurrent":
            args[0]._obj.value = self.ctx
        elif name == "cuCtxSetCurrent":
            self.ctx = args[0].value
        elif name == "cuMemcpyHtoDAsync_v2":
            self.pending.append((args[0].value, args[1].value, args[2]))
        elif name == "cuEventSynchronize":
            self.run()

    def run(self) -> None:
        for dst, src, n in self.pending:
            ctypes.memmove(dst, src, n)
        self.pending.clear()


def test_uploads_land_and_a_slot_waits_for_the_copies_before_it() -> None:
    drv = FakeDriver()
    stager = uploads.PinnedStager([8 * 4, 3 * 8 * 4], drv)
    ids, pos = np.zeros(8, np.int32), np.zeros((3, 8), np.int32)
    first = np.arange(8, dtype=np.int32)
    stager.upload(0, first, ids.ctypes.data)
    stager.upload(1, np.full((3, 8), 5, np.int32), pos.ctypes.data)
    stager.queued()
    assert drv.calls.count("cuEventSynchronize") == 0  # nothing waited for yet
    # the next step's upload into slot 0: the step before's copies run first (its bytes, not these)
    stager.upload(0, first + 100, ids.ctypes.data)
    assert drv.calls.count("cuEventSynchronize") == 1
    np.testing.assert_array_equal(ids, first)
    np.testing.assert_array_equal(pos, np.full((3, 8), 5))
    stager.queued()
    drv.run()
    np.testing.assert_array_equal(ids, first + 100)
    with pytest.raises(ValueError, match="do not fit"):
        stager.upload(0, np.zeros(9, np.int32), ids.ctypes.data)


def test_another_threads_context_is_rebound() -> None:
    drv = FakeDriver()
    stager = uploads.PinnedStager([64], drv)
    drv.ctx = 0x9999  # what cuCtxGetCurrent answers on another thread
    out = np.zeros(4, np.int32)
    stager.upload(0, np.arange(4, dtype=np.int32), out.ctypes.data)
    assert "cuCtxSetCurrent" in drv.calls and drv.ctx == 0x1234


@pytest.mark.parametrize("fail", ["cuMemHostAlloc", "cuEventCreate", "cuCtxGetCurrent"])
def test_a_failing_driver_means_plain_copies(monkeypatch, fail: str) -> None:
    monkeypatch.setattr(uploads, "_load_driver", lambda: FakeDriver(fail))
    assert uploads.stager_for([64], "cuda") is None
    monkeypatch.setattr(uploads, "_load_driver", lambda: FakeDriver())
    assert uploads.stager_for([64], "cuda") is not None
    assert uploads.stager_for([64], "1") is None  # not a CUDA device
    monkeypatch.setenv("NINFER_PINNED_UPLOADS", "0")
    assert uploads.stager_for([64], "cuda") is None


def test_no_context_is_a_driver_error() -> None:
    drv = FakeDriver()
    drv.ctx = 0
    with pytest.raises(uploads.DriverError, match="no current CUDA context"):
        uploads.PinnedStager([64], drv)
