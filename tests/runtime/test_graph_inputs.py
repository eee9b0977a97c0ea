"""The CUDA-graph decode inputs (`_GraphInputs`): refilled in place, equal to their definition
every step, and uploaded only when they change (on the host device here)."""

from __future__ import annotations

import numpy as np
import tvm

from ninfer_runtime.pools import ContextPool, PoolPlan
from ninfer_runtime.runner import _GraphInputs

SCRATCH_PAGE, SCRATCH_SLOT = 600, 8


def _reference(tokens, seqs, bucket: int, max_pages: int) -> list[np.ndarray]:
    """The decode graph's inputs as defined: real rows, then padding (length 0, scratch page and slot)."""
    n = len(seqs)
    table = np.full((bucket, max_pages), SCRATCH_PAGE, np.int32)
    for i, s in enumerate(seqs):
        table[i] = 0
        table[i, : len(s.pages)] = s.pages
    lengths = np.array([s.length for s in seqs] + [0] * (bucket - n), np.int32)
    return [np.concatenate([tokens, np.zeros(bucket - n, np.int32)]), np.broadcast_to(lengths, (3, bucket)),
            table, lengths, np.array([s.slot for s in seqs] + [SCRATCH_SLOT] * (bucket - n), np.int32)]


class _CountingStager:
    """Stands in for the page-locked stager: copies as the plain path does and records what it uploaded."""

    def __init__(self, inputs: _GraphInputs) -> None:
        self.inputs, self.uploaded, self.steps = inputs, [], 0

    def upload(self, slot: int, array: np.ndarray, device_ptr: int) -> None:
        assert device_ptr == self.inputs.tensors[slot].data_ptr()
        self.inputs.tensors[slot].copyfrom(array)
        self.uploaded.append(slot)

    def queued(self) -> None:
        self.steps += 1


def _pool() -> ContextPool:
    return ContextPool(PoolPlan(num_pages=SCRATCH_PAGE, num_slots=SCRATCH_SLOT, page_size=4, bytes_per_page=1,
                                bytes_per_slot=1))


def _step(inputs: _GraphInputs, seqs, tokens) -> list[np.ndarray]:
    lengths = np.array([s.length for s in seqs], np.int32)
    return [t.numpy() for t in inputs.step(np.asarray(tokens, np.int32), lengths, seqs)]


def test_inputs_follow_appends_releases_joins_reorders_and_shrinking_batches() -> None:
    rng = np.random.default_rng(0)
    pool = _pool()
    bucket, max_pages = 8, 64  # (200 steps of at most 8 sequences fit)
    inputs = _GraphInputs(bucket, max_pages, tvm.cpu(), SCRATCH_PAGE, SCRATCH_SLOT)
    live = [pool.acquire() for _ in range(5)]
    for s in live:
        s.length = int(rng.integers(1, 20))
    for step in range(200):
        if step % 17 == 5 and len(live) > 1:  # a request finishes; its slot and pages go back
            pool.release(live.pop(int(rng.integers(len(live)))))
        if step % 23 == 7 and len(live) < bucket:  # a new one joins (it may get the same slot and pages)
            s = pool.acquire()
            s.length = int(rng.integers(1, 8))
            live.append(s)
        if step % 11 == 3:
            rng.shuffle(live)
        for s in live:
            pool.reserve(s, s.length + 1)
        tokens = rng.integers(2, 100, len(live))
        got = _step(inputs, live, tokens)  # what the device tensors hold
        for g, w in zip(got, _reference(tokens, live, bucket, max_pages), strict=True):
            np.testing.assert_array_equal(g, w, err_msg=f"step {step}")
        for s in live:
            s.length += 1


def test_unchanged_inputs_are_not_uploaded_again_and_changed_ones_are() -> None:
    pool = _pool()
    inputs = _GraphInputs(2, 4, tvm.cpu(), SCRATCH_PAGE, SCRATCH_SLOT)
    spy = inputs._stager = _CountingStager(inputs)
    a = pool.acquire()
    a.length = 6
    pool.reserve(a, 7)
    _step(inputs, [a], [5])
    assert sorted(spy.uploaded) == [0, 1, 2, 3, 4] and spy.steps == 1
    spy.uploaded.clear()
    a.length = 7  # new token, position and length; same pages and slot
    _step(inputs, [a], [6])
    assert sorted(spy.uploaded) == [0, 1, 3]
    spy.uploaded.clear()
    a.length = 8
    pool.reserve(a, 9)  # a page boundary: the table goes up again
    got = _step(inputs, [a], [6])
    assert sorted(spy.uploaded) == [1, 2, 3]  # (the same token: ids are skipped)
    np.testing.assert_array_equal(got[2], _reference([6], [a], 2, 4)[2])
    spy.uploaded.clear()
    b = pool.acquire()  # a second sequence joins: the padding row becomes real
    b.length = 1
    pool.reserve(b, 2)
    _step(inputs, [a, b], [6, 7])
    assert sorted(spy.uploaded) == [0, 1, 2, 3, 4]
