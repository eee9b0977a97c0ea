"""The CUDA-graph decode inputs: uploaded only when they change (on the host device here)."""

from __future__ import annotations

import numpy as np
import tvm

from ninfer_runtime.runner import _GraphInputs


def _arrays(tokens: list[int], length: int, pages: list[int], slot: int) -> list[np.ndarray]:
    table = np.zeros((2, 4), np.int32)
    table[0, : len(pages)] = pages
    positions = np.full((3, 2), length, np.int32)
    return [np.array(tokens, np.int32), positions, table, np.array([length, 0], np.int32),
            np.array([slot, 9], np.int32)]


def test_unchanged_inputs_are_not_uploaded_again_and_changed_ones_are() -> None:
    inputs = _GraphInputs(2, 4, tvm.cpu())
    first = _arrays([5, 0], 7, [3], 1)
    tensors = inputs.write(*first)
    held = list(inputs._held)
    for t, a in zip(tensors, first, strict=True):
        np.testing.assert_array_equal(t.numpy(), a)

    second = _arrays([6, 0], 8, [3], 1)  # new token, position and length; same pages and slot
    inputs.write(*second)
    for i, (t, a) in enumerate(zip(tensors, second, strict=True)):
        np.testing.assert_array_equal(t.numpy(), a)
        assert (inputs._held[i] is held[i]) == (i in (2, 4)), i  # only the table and the slots were skipped

    third = _arrays([6, 0], 8, [3, 4], 1)  # a page boundary: the table is uploaded again
    inputs.write(*third)
    np.testing.assert_array_equal(tensors[2].numpy(), third[2])
    assert inputs._held[2] is not held[2]


def test_a_caller_changing_its_array_in_place_is_still_uploaded() -> None:
    inputs = _GraphInputs(2, 4, tvm.cpu())
    arrays = _arrays([5, 0], 7, [3], 1)
    tensors = inputs.write(*arrays)
    arrays[2][0, 1] = 8  # the same array object, new contents
    inputs.write(*arrays)
    np.testing.assert_array_equal(tensors[2].numpy(), arrays[2])


def _reference(tokens, seqs, bucket: int, max_pages: int, scratch_page: int, scratch_slot: int):
    """The decode graph's inputs as defined: real rows, then padding (length 0, scratch page and slot)."""
    n = len(seqs)
    table = np.full((bucket, max_pages), scratch_page, np.int32)
    for i, s in enumerate(seqs):
        table[i] = 0
        table[i, : len(s.pages)] = s.pages
    lengths = np.array([s.length for s in seqs] + [0] * (bucket - n), np.int32)
    return [np.concatenate([tokens, np.zeros(bucket - n, np.int32)]), np.broadcast_to(lengths, (3, bucket)),
            table, lengths, np.array([s.slot for s in seqs] + [scratch_slot] * (bucket - n), np.int32)]


def test_host_inputs_follow_appends_releases_reorders_and_shrinking_batches() -> None:
    """`_HostInputs.fill` refills the bucket's arrays in place and rewrites a page-table row only
    when its sequence's pages changed; every step it equals the definition above."""
    from ninfer_runtime.pools import ContextPool, PoolPlan
    from ninfer_runtime.runner import _HostInputs

    rng = np.random.default_rng(0)
    pool = ContextPool(PoolPlan(num_pages=600, num_slots=8, page_size=4, bytes_per_page=1, bytes_per_slot=1))
    bucket, max_pages = 8, 64  # (200 steps of at most 8 sequences fit)
    host = _HostInputs(bucket, max_pages, scratch_page=600, scratch_slot=8)
    live = [pool.acquire() for _ in range(5)]
    for s in live:
        s.length = int(rng.integers(1, 20))
        pool.reserve(s, s.length + 1)
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
        tokens = rng.integers(2, 100, len(live)).astype(np.int32)
        lengths = np.array([s.length for s in live], np.int32)
        got = host.fill(tokens, lengths, live)
        for g, w in zip(got, _reference(tokens, live, bucket, max_pages, 600, 8), strict=True):
            np.testing.assert_array_equal(g, w, err_msg=f"step {step}")
        for s in live:
            s.length += 1
