"""The context pool: KV pages and recurrent-state slots, planned once and accounted exactly.

Full-attention layers keep K/V in fixed-size pages shared by all sequences (a page table per
sequence maps its token positions to pages); GDN layers keep one fixed-size state per sequence in
a slot. Both come out of one byte budget decided at startup, so nothing is allocated per request
and running out is a clear, recoverable condition rather than an out-of-memory crash.
"""

from __future__ import annotations

from dataclasses import dataclass, field


class PoolExhausted(Exception):
    """Not enough free pages or slots right now (the request may wait, or be refused)."""


@dataclass
class SequenceCache:
    """One sequence's share of the pool: its state slot, its pages and how many tokens they hold."""

    slot: int
    pages: list[int] = field(default_factory=list)
    length: int = 0  # tokens whose KV / state are in the cache


@dataclass(frozen=True)
class PoolPlan:
    num_pages: int
    num_slots: int
    page_size: int
    bytes_per_page: int
    bytes_per_slot: int

    @property
    def total_bytes(self) -> int:
        return self.num_pages * self.bytes_per_page + self.num_slots * self.bytes_per_slot

    @property
    def token_capacity(self) -> int:
        return self.num_pages * self.page_size

    @classmethod
    def from_budget(cls, budget_bytes: int, *, page_size: int, bytes_per_page: int, bytes_per_slot: int,
                    num_slots: int) -> PoolPlan:
        """Slots for `num_slots` concurrent sequences first, then as many pages as fit."""
        rest = budget_bytes - num_slots * bytes_per_slot
        if rest < bytes_per_page:
            need = num_slots * bytes_per_slot + bytes_per_page
            raise PoolExhausted(f"context budget of {budget_bytes} bytes cannot hold {num_slots} sequence states and one "
                                f"KV page (needs at least {need} bytes)")
        pages = rest // bytes_per_page if bytes_per_page else 0
        return cls(pages, num_slots, page_size, bytes_per_page, bytes_per_slot)


class ContextPool:
    """Free lists of pages and slots; every allocation is returned by `release`."""

    def __init__(self, plan: PoolPlan) -> None:
        self.plan = plan
        self._free_pages = list(range(plan.num_pages - 1, -1, -1))
        self._free_slots = list(range(plan.num_slots - 1, -1, -1))
        self._live: dict[int, SequenceCache] = {}

    @property
    def free_pages(self) -> int:
        return len(self._free_pages)

    @property
    def free_slots(self) -> int:
        return len(self._free_slots)

    def pages_for(self, tokens: int) -> int:
        return -(-tokens // self.plan.page_size)

    def can_admit(self, tokens: int) -> bool:
        return bool(self._free_slots) and self.pages_for(tokens) <= len(self._free_pages)

    def acquire(self) -> SequenceCache:
        if not self._free_slots:
            raise PoolExhausted(f"all {self.plan.num_slots} sequence slots are in use")
        seq = SequenceCache(self._free_slots.pop())
        self._live[id(seq)] = seq
        return seq

    def reserve(self, seq: SequenceCache, tokens: int) -> None:
        """Make sure `seq` has pages for `tokens` positions in total."""
        need = self.pages_for(tokens) - len(seq.pages)
        if need <= 0:
            return
        if need > len(self._free_pages):
            raise PoolExhausted(f"need {need} more KV pages, {len(self._free_pages)} free "
                                f"({self.plan.token_capacity} tokens in the pool)")
        for _ in range(need):
            seq.pages.append(self._free_pages.pop())

    def release(self, seq: SequenceCache) -> None:
        if self._live.pop(id(seq), None) is None:
            return  # already released
        self._free_pages.extend(reversed(seq.pages))
        self._free_slots.append(seq.slot)
        seq.pages = []
        seq.length = 0

    def check_all_free(self) -> None:
        """Assert nothing leaked (tests and shutdown)."""
        assert not self._live, f"{len(self._live)} sequences still hold pool memory"
        assert sorted(self._free_pages) == list(range(self.plan.num_pages)), "KV pages leaked or duplicated"
        assert sorted(self._free_slots) == list(range(self.plan.num_slots)), "state slots leaked or duplicated"
