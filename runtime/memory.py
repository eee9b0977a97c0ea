"""The startup memory plan: weights first, then one context pool sized once.

Nothing is allocated per request: the pool (KV pages of the full-attention layers plus one
recurrent/conv state slot per active sequence) is sized here from a byte budget and never grows,
so running out is a scheduling event (wait, preempt, finish) instead of an out-of-memory crash.

`context_capacity = "auto"`:

* CPU: room for `num_slots` sequences at the full `max_context` (the most the engine can ever
  use), but at most half of the host memory available at startup minus the headroom. Host memory
  is shared with the OS and other processes, so auto never plans for more than it can use.
* CUDA: what is free on the device once the weights are loaded, minus the headroom (which also
  covers the compiled functions' workspace), but no more than `num_slots` full-length sequences
  can use.
"""

from __future__ import annotations

from dataclasses import dataclass

from .pools import PoolPlan


def available_host_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (None where it cannot be read)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


class CapacityError(ValueError):
    """The device cannot hold the context pool the configuration asks for."""


def auto_context_bytes(*, device_kind: str, bytes_per_page: int, bytes_per_slot: int, page_size: int,
                       max_context: int, num_slots: int, headroom_bytes: int,
                       device_free_bytes: int | None = None) -> int:
    """The pool budget `context_capacity = "auto"` stands for (see the module docstring)."""
    pages_per_seq = -(-max_context // page_size)
    slots = num_slots * bytes_per_slot
    want = slots + num_slots * pages_per_seq * bytes_per_page
    floor = slots + pages_per_seq * bytes_per_page  # one full-length sequence
    if device_kind == "cuda":
        if device_free_bytes is None:
            raise CapacityError("context_capacity = auto needs the device's free memory; give a byte size instead")
        budget = min(want, device_free_bytes - headroom_bytes)
        if budget < floor:
            raise CapacityError(
                f"the GPU has {device_free_bytes / 2**30:.2f} GiB free after the weights; with "
                f"{headroom_bytes / 2**30:.2f} GiB headroom that is less than one {max_context}-token sequence "
                f"plus {num_slots} state slots ({floor / 2**30:.2f} GiB): lower max_context or max_active")
        return budget
    available = available_host_bytes()
    if available is None:
        return want
    cap = (available - headroom_bytes) // 2
    return max(floor, min(want, cap))


@dataclass(frozen=True)
class MemoryPlan:
    """What `ModelRunner` planned at startup; the startup report prints it."""

    device: str
    weights_bytes: int
    capacity_policy: str  # "auto" or "explicit"
    budget_bytes: int
    pool: PoolPlan
    max_context: int
    max_active: int

    @property
    def pool_bytes(self) -> int:
        return self.pool.total_bytes

    @property
    def token_capacity(self) -> int:
        """KV tokens the pool holds across all sequences (each sequence also needs a slot)."""
        return self.pool.token_capacity

    def as_dict(self) -> dict:
        p = self.pool
        return {
            "device": self.device,
            "weights_bytes": self.weights_bytes,
            "capacity_policy": self.capacity_policy,
            "budget_bytes": self.budget_bytes,
            "pool_bytes": p.total_bytes,
            "kv_pages": p.num_pages,
            "page_size": p.page_size,
            "kv_bytes_per_page": p.bytes_per_page,
            "kv_bytes": p.num_pages * p.bytes_per_page,
            "state_slots": p.num_slots,
            "state_bytes_per_slot": p.bytes_per_slot,
            "state_bytes": p.num_slots * p.bytes_per_slot,
            "token_capacity": p.token_capacity,
            "max_context": self.max_context,
            "max_active": self.max_active,
        }


def human_bytes(n: int) -> str:
    """B/KiB/MiB/GiB with two decimals (1024 base), as the report rows print bytes."""
    if n < 1024:
        return f"{n} B"
    value, unit = n / 1024, "KiB"
    for bigger in ("MiB", "GiB"):
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{value:.2f} {unit}"


def report_rows(info: dict) -> list[tuple[str, str, str]]:
    """(group, label, value) rows of the startup memory report."""
    return [
        ("memory", "weights", human_bytes(info["weights_bytes"])),
        ("memory", "KV capacity policy", info["capacity_policy"]),
        ("memory", "context pool", f"{human_bytes(info['pool_bytes'])} ({info['kv_pages']} KV pages of "
                                   f"{info['page_size']} tokens + {info['state_slots']} state slots)"),
        ("memory", "KV capacity", f"{info['token_capacity']} tokens"),
        ("memory", "max context", f"{info['max_context']} tokens per request"),
    ]
