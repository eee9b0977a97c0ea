"""Scheduler policy on a bare pool (no model): FIFO admission, chunk boundaries, preemption."""

from __future__ import annotations

from ninfer_runtime.pools import ContextPool, PoolPlan
from ninfer_runtime.scheduler import Scheduled, Scheduler


def _scheduler(pages: int = 8, slots: int = 3, chunk: int = 5) -> Scheduler:
    pool = ContextPool(PoolPlan(num_pages=pages, num_slots=slots, page_size=4, bytes_per_page=1, bytes_per_slot=1))
    return Scheduler(pool, max_active=slots, prefill_chunk=chunk)


def _req(arrival: int, prompt_len: int) -> Scheduled:
    return Scheduled(prompt=list(range(prompt_len)), output=[], arrival=arrival)


def test_fifo_admission_without_backfill():
    s = _scheduler(pages=8)
    big, small = _req(0, 20), _req(1, 3)  # 5 pages + 1 spare, then 1 + 1
    s.enqueue(big)
    s.enqueue(small)
    assert s.admit() == [big, small]
    assert s.pool.free_pages == 8 - 5 - 1
    huge, tiny = _req(2, 16), _req(3, 1)  # huge needs 5 pages: tiny must not jump it
    s.enqueue(huge)
    s.enqueue(tiny)
    assert s.admit() == [] and list(s.waiting) == [huge, tiny]
    s.drop(big)
    assert s.admit() == [huge, tiny]
    assert not s.waiting and s.pool.free_slots == 0


def test_prefill_chunks_are_aligned_and_oldest_first():
    s = _scheduler(chunk=5)
    a, b = _req(0, 12), _req(1, 3)
    for r in (a, b):
        s.enqueue(r)
    s.admit()
    spans = []
    while (job := s.next_prefill()) is not None:
        req, tokens = job
        spans.append((req.arrival, req.cache.length, len(tokens)))
        req.cache.length += len(tokens)
    assert spans == [(0, 0, 5), (0, 5, 5), (0, 10, 2), (1, 0, 3)]
    a.output.append(7)
    assert a.decode_ready and not a.replaying and a.next_input() == 7


def _decoded(req: Scheduled, tokens: int) -> None:
    """Pretend the request has cached `tokens` and sampled one more."""
    req.cache.length = tokens
    req.output[:] = [1] * (tokens + 1 - len(req.prompt))


def test_preemption_takes_the_newest_and_requeues_it_in_arrival_order():
    s = _scheduler(pages=5, slots=2, chunk=8)
    old, new, waiting = _req(0, 7), _req(1, 4), _req(2, 1)
    for r in (old, new, waiting):
        s.enqueue(r)
    assert s.admit() == [old, new]  # two slots
    _decoded(old, 8)
    _decoded(new, 5)
    plan = s.reserve_decode()
    assert plan.batch == [old, new] and not plan.preempted and s.pool.free_pages == 0
    _decoded(old, 12)  # old needs a fourth page: the newest running request makes room
    plan = s.reserve_decode()
    assert plan.preempted == [new] and plan.batch == [old]
    assert list(s.waiting) == [new, waiting] and new.cache is None and new.preemptions == 1
    assert s.pages_to_admit(new) == 3 and s.admit() == []  # prompt + 2 outputs + a spare page
    s.drop(old)
    assert s.admit() == [new, waiting]
    assert new.in_prefill and new.cache.length == 0 and len(new.cache.pages) == 2
    new.cache.length = 4
    assert new.decode_ready and new.replaying and new.next_input() == 1
    s.drop(new)
    s.drop(waiting)
    s.pool.check_all_free()


def test_alone_and_still_short_is_exhausted():
    s = _scheduler(pages=2, chunk=8)
    r = _req(0, 8)
    s.enqueue(r)
    assert s.admit() == [r]
    r.cache.length = 8
    r.output.append(1)
    plan = s.reserve_decode()
    assert plan.exhausted == [r] and not s.running
    s.pool.check_all_free()
