"""The startup memory plan: auto sizing on CPU, explicit budgets, the report."""

from __future__ import annotations

import pytest

from ninfer_runtime import memory
from ninfer_runtime.memory import CapacityError, auto_context_bytes, human_bytes
from ninfer_runtime.package import PackageError
from ninfer_runtime.pools import PoolExhausted

SIZES = dict(device_kind="cpu", bytes_per_page=1000, bytes_per_slot=10, page_size=16, max_context=160,
             num_slots=4, headroom_bytes=100)


@pytest.mark.parametrize("available, expected", [
    (None, 4 * 10 + 4 * 10 * 1000),  # unknown: room for every slot at full max_context
    (10**9, 4 * 10 + 4 * 10 * 1000),  # plenty: the same, never more
    (30_100, 15_000),  # tight: half of what is available after the headroom
    (1_000, 4 * 10 + 10 * 1000),  # too tight: still one full-length sequence
])
def test_auto_context_bytes(monkeypatch, available, expected):
    monkeypatch.setattr(memory, "available_host_bytes", lambda: available)
    assert auto_context_bytes(**SIZES) == expected


def test_auto_on_cuda_uses_free_device_memory():
    cuda = {**SIZES, "device_kind": "cuda", "headroom_bytes": 100}
    with pytest.raises(CapacityError, match="give a byte size"):
        auto_context_bytes(**cuda)  # free memory unknown
    full = 4 * 10 + 4 * 10 * 1000  # slots + every slot at full length (from SIZES)
    assert auto_context_bytes(**cuda, device_free_bytes=10**9) == full  # never more than can be used
    assert auto_context_bytes(**cuda, device_free_bytes=20_100) == 20_000  # what is free minus headroom
    with pytest.raises(CapacityError, match="lower max_context or max_active"):
        auto_context_bytes(**cuda, device_free_bytes=5_000)


def test_runner_plans(make_runner):
    auto = make_runner()
    info = auto.describe()
    assert info["capacity_policy"] == "auto"
    assert info["token_capacity"] >= 8 * 1024  # 8 slots at the package's max_context
    assert info["pool_bytes"] == info["kv_bytes"] + info["state_bytes"] <= info["budget_bytes"]
    assert info["weights_bytes"] > 0 and info["state_slots"] == 8
    explicit = make_runner(max_active=2, context_capacity=2 * info["state_bytes_per_slot"] + 10 * info["kv_bytes_per_page"])
    info = explicit.describe()
    assert (info["capacity_policy"], info["kv_pages"], info["state_slots"]) == ("explicit", 10, 2)
    assert make_runner(max_active=2, context_bytes=info["budget_bytes"], context_capacity=1).describe()["kv_pages"] == 10
    with pytest.raises(PoolExhausted, match="cannot hold 8 sequence states"):
        make_runner(context_capacity=1000)
    with pytest.raises(PackageError, match="positive byte count"):
        make_runner(context_capacity=0)


def test_human_bytes():
    assert [human_bytes(n) for n in (512, 1536, 5 << 20, 3 << 30)] == ["512 B", "1.50 KiB", "5.00 MiB", "3.00 GiB"]
