"""Continuous batching over the context pool: who waits, who runs, what runs this step.

The scheduler decides and accounts; it never calls the model. Policy:

* Waiting requests are admitted strictly FIFO (by arrival) while fewer than `max_active` run and
  the pool can hold the head request's cached tokens plus one spare page (no backfill, so a
  large request is never starved by small ones). Admission reserves the pages for everything
  the request must (re)compute up front, so a prefill never runs out of memory halfway.
* Each step runs at most one prefill chunk (the oldest running request that still has prompt
  left; chunk boundaries are fixed multiples of `prefill_chunk` from position 0, so chunking never
  depends on what else runs) plus one batched decode for every request that has a token to
  feed. A decode therefore waits for at most one prefill chunk per step.
* Decode pages are allocated lazily. When the pool runs out, the newest running request is
  preempted: its pages and slot go back to the pool and it returns to the front of the queue;
  when readmitted it recomputes its cache from prompt + output (prefill of the prompt, then
  the output tokens replayed through decode exactly as they were first computed), so its
  results are bit-identical to an uninterrupted run.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .pools import ContextPool, PoolExhausted, SequenceCache


@dataclass(eq=False)
class Scheduled:
    """The scheduler's view of a request: its tokens, arrival order and share of the pool."""

    prompt: list[int]
    output: list[int]
    arrival: int
    cache: SequenceCache | None = None
    preemptions: int = 0
    inflight: int = 0  # decode steps queued on the device whose new token is not read yet (0 or 1)

    def may_look_ahead(self) -> bool:
        """Whether a decode may be queued on the token still being computed (the engine decides)."""
        return False

    @property
    def total_tokens(self) -> int:
        return len(self.prompt) + len(self.output)

    @property
    def cached_tokens(self) -> int:
        return self.cache.length if self.cache is not None else 0

    @property
    def in_prefill(self) -> bool:
        return self.cache is not None and self.cache.length < len(self.prompt)

    @property
    def decode_ready(self) -> bool:
        """Running, prompt done, and a token not yet in the cache: a known one (the last sampled
        one, or an output token being replayed after a preemption), or the one a queued step is
        computing where the request may look ahead."""
        if self.cache is None or self.cache.length < len(self.prompt):
            return False
        if self.cache.length < self.total_tokens:
            return True
        return self.inflight == 1 and self.cache.length == self.total_tokens and self.may_look_ahead()

    @property
    def replaying(self) -> bool:
        """The next decode recomputes an already emitted token (its logits are discarded)."""
        return self.cache is not None and self.cache.length < self.total_tokens - 1

    def next_input(self) -> int | None:
        """The token the next step feeds; None: the one a queued step is computing."""
        at = self.cached_tokens
        if at < len(self.prompt):
            return self.prompt[at]
        return self.output[at - len(self.prompt)] if at < self.total_tokens else None


@dataclass
class DecodePlan:
    batch: list[Scheduled] = field(default_factory=list)  # pages reserved for one more token
    preempted: list[Scheduled] = field(default_factory=list)  # moved back to the queue
    exhausted: list[Scheduled] = field(default_factory=list)  # cannot grow even alone: finish them


class Scheduler:
    def __init__(self, pool: ContextPool, *, max_active: int, prefill_chunk: int) -> None:
        self.pool = pool
        self.max_active = max_active
        self.prefill_chunk = prefill_chunk
        self.waiting: deque[Scheduled] = deque()
        self.running: list[Scheduled] = []  # admission order, which is arrival order

    # -- membership ---------------------------------------------------------------------------

    def enqueue(self, req: Scheduled) -> None:
        """Queue a request, keeping the queue in arrival order (preempted ones go back in front)."""
        if not self.waiting or self.waiting[-1].arrival < req.arrival:
            self.waiting.append(req)
            return
        at = next(i for i, w in enumerate(self.waiting) if w.arrival > req.arrival)
        self.waiting.insert(at, req)

    def drop(self, req: Scheduled) -> None:
        """Forget a request (finished, cancelled, failed) and return its pages and slot."""
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self._release(req)

    def live(self) -> list[Scheduled]:
        return [*self.running, *self.waiting]

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def _release(self, req: Scheduled) -> None:
        if req.cache is not None:
            self.pool.release(req.cache)
            req.cache = None

    # -- admission ----------------------------------------------------------------------------

    def pages_to_admit(self, req: Scheduled) -> int:
        """Pages for every token the request must cache before sampling again, plus one page of
        output (capped at the whole pool, so a request that needs it all waits for an empty pool)."""
        need = self.pool.pages_for(req.total_tokens) + 1
        return min(need, self.pool.plan.num_pages)

    def admit(self) -> list[Scheduled]:
        """Move queue heads to running while a slot, a batch row and their pages are free."""
        admitted = []
        while self.waiting and len(self.running) < self.max_active:
            head = self.waiting[0]
            if not self.pool.free_slots or self.pool.free_pages < self.pages_to_admit(head):
                break
            self.waiting.popleft()
            head.cache = self.pool.acquire()
            self.pool.reserve(head.cache, head.total_tokens)
            self.running.append(head)
            admitted.append(head)
        return admitted

    # -- one step -----------------------------------------------------------------------------

    def next_prefill(self) -> tuple[Scheduled, list[int]] | None:
        """The next prompt chunk of the oldest running request still in prefill."""
        for req in self.running:
            if req.in_prefill:
                start = req.cache.length
                end = min(len(req.prompt), (start // self.prefill_chunk + 1) * self.prefill_chunk)
                return req, req.prompt[start:end]
        return None

    def reserve_decode(self) -> DecodePlan:
        """Pages for one more token of every decode-ready request, oldest first, preempting the
        newest running requests while the pool is short."""
        plan = DecodePlan()
        for req in sorted(self.running, key=lambda r: r.arrival):
            if req.cache is None or not req.decode_ready:
                continue  # preempted meanwhile, or still in prefill
            while True:
                try:
                    self.pool.reserve(req.cache, req.cache.length + 1)
                    plan.batch.append(req)
                    break
                except PoolExhausted:
                    if len(self.running) == 1:  # alone and still short: it can never grow
                        self.running.remove(req)
                        self._release(req)
                        plan.exhausted.append(req)
                        break
                    victim = max(self.running, key=lambda r: r.arrival)
                    self.preempt(victim)
                    plan.preempted.append(victim)
                    if victim is req:
                        break
        return plan

    def preempt(self, req: Scheduled) -> None:
        self.running.remove(req)
        self._release(req)
        req.preemptions += 1
        self.enqueue(req)
