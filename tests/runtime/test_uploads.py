"""The decode step's queued transfers (`ninfer_runtime.uploads`), against a driver that runs in
host memory: the graph inputs' page-locked uploads (slot layout, the copies, the wait before a slot
is written again), the greedy choices' read-backs and device copies, the context rebinding, and the
fallback where the driver fails."""

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
        elif name in ("cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2", "cuMemcpyDtoDAsync_v2"):
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
    assert uploads.queue_for(64, "cuda") is None
    monkeypatch.setattr(uploads, "_load_driver", lambda: FakeDriver())
    assert uploads.stager_for([64], "cuda") is not None
    assert uploads.queue_for(64, "cuda") is not None
    assert uploads.stager_for([64], "1") is None  # not a CUDA device
    assert uploads.queue_for(64, "1") is None
    monkeypatch.setenv("NINFER_PINNED_UPLOADS", "0")
    assert uploads.stager_for([64], "cuda") is None
    assert uploads.queue_for(64, "cuda") is None


def test_no_context_is_a_driver_error() -> None:
    drv = FakeDriver()
    drv.ctx = 0
    with pytest.raises(uploads.DriverError, match="no current CUDA context"):
        uploads.PinnedStager([64], drv)


def test_read_backs_land_in_turn_and_a_slot_is_taken_before_it_is_reused() -> None:
    drv = FakeDriver()
    queue = uploads.DeviceQueue(drv, slot_bytes=64, slots=2)
    x, y, z = (np.arange(5, dtype=np.int32) + base for base in (0, 100, 200))
    logprobs = np.linspace(-1, 0, 5, dtype=np.float32)
    first = queue.read_back([(x.ctypes.data, 5, np.int32), (logprobs.ctypes.data, 5, np.float32)])
    second = queue.read_back([(y.ctypes.data, 3, np.int32)])
    assert drv.calls.count("cuEventSynchronize") == 0 and not first.done  # nothing waited for yet
    third = queue.read_back([(z.ctypes.data, 5, np.int32)])  # slot 0 again: `first` is taken first
    assert drv.calls.count("cuEventSynchronize") == 1 and first.done
    got = first.wait()
    np.testing.assert_array_equal(got[0], x)  # not z, which now goes to the same slot
    np.testing.assert_array_equal(got[1], logprobs)
    assert first.wait() is got  # read once
    np.testing.assert_array_equal(third.wait()[0], z)
    np.testing.assert_array_equal(second.wait()[0], y[:3])
    with pytest.raises(ValueError, match="does not fit"):
        queue.read_back([(x.ctypes.data, 17, np.int32)])
    with pytest.raises(ValueError, match="does not fit"):  # 56 bytes, but 80 with each array aligned
        queue.read_back([(x.ctypes.data, 5, np.int32), (x.ctypes.data, 9, np.int32)])


def test_device_copies_and_feed_runs() -> None:
    from ninfer_runtime.runner import _feed_copies

    drv = FakeDriver()
    queue = uploads.DeviceQueue(drv, slot_bytes=64)
    src, dst = np.arange(8, dtype=np.int32) + 100, np.zeros(8, np.int32)
    rows = {0: 0, 1: 1, 2: 2, 4: 7, 5: 3, 6: 4}  # runs: 0..2 <- 0..2, 4 <- 7, 5..6 <- 3..4
    _feed_copies(queue, dst.ctypes.data, src.ctypes.data, rows)
    assert drv.calls.count("cuMemcpyDtoDAsync_v2") == 3
    drv.run()
    want = np.zeros(8, np.int32)
    for d, r in rows.items():
        want[d] = src[r]
    np.testing.assert_array_equal(dst, want)
