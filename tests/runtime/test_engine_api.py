"""The Engine contract the server relies on: validation, queue bound, deadlines, the background
thread, cancellation through iterators, metrics and the startup report."""

from __future__ import annotations

import threading
import time

import pytest

from ninfer_runtime import Engine as LazyEngine
from ninfer_runtime.engine import Engine, GenerationParams, QueueFull, RequestError
from ninfer_runtime.sampling import SamplingParams

from .engine_helpers import GREEDY, alone, drain, prompts, tokens_of

OK = prompts((4,))[0]


@pytest.mark.parametrize("prompt, params, deadline, message", [
    ([], GenerationParams(), None, "the prompt is empty"),
    ([1, 512], GenerationParams(), None, r"prompt token 1 has id 512, outside the vocabulary \(0..511\)"),
    ([-1], GenerationParams(), None, "has id -1"),
    ("abc", GenerationParams(), None, "sequence of token ids"),
    ([1.5], GenerationParams(), None, "sequence of token ids"),
    ([3] * 1024, GenerationParams(), None, "the prompt has 1024 tokens; max_context is 1024"),
    (OK, GenerationParams(max_tokens=0), None, "max_tokens must be an integer >= 1"),
    (OK, GenerationParams(logprobs=21), None, r"logprobs must be None or an integer in \[0, 20\]"),
    (OK, GenerationParams(stop_token_ids=(600,)), None, "stop token id 600 is outside"),
    (OK, GenerationParams(stop_strings=("",)), None, "non-empty strings"),
    (OK, GenerationParams(stop_strings="end"), None, "must be sequences"),
    (OK, GenerationParams(sampling={"temperature": 0}), None, "sampling must be SamplingParams"),
    (OK, GenerationParams(allowed_tokens=3), None, "allowed_tokens must be callable"),
    (OK, GenerationParams(), float("nan"), "deadline must be a finite"),
    (OK, {"max_tokens": 3}, None, "params must be GenerationParams"),
])
def test_invalid_requests(make_engine, prompt, params, deadline, message):
    engine = make_engine()
    with pytest.raises(RequestError, match=message):
        engine.submit(prompt, params, deadline=deadline)
    assert engine.metrics()["requests_rejected"] == 1


def test_queue_full(make_engine):
    engine = make_engine(max_active=2, max_queue=1)
    handles = [engine.submit(OK, GenerationParams(max_tokens=3)) for _ in range(3)]
    with pytest.raises(QueueFull, match="2 active \\+ 1 queued") as info:
        engine.submit(OK, GenerationParams(max_tokens=3))
    assert isinstance(info.value, RequestError)
    engine.run_until_idle()
    assert all(h.finished for h in handles)
    engine.submit(OK, GenerationParams(max_tokens=3))  # room again
    engine.run_until_idle()


def test_deadlines(make_engine):
    engine = make_engine()
    expired = engine.submit(OK, GenerationParams(max_tokens=5), deadline=time.monotonic() - 1)
    engine.step()
    final = drain(expired)[-1]
    assert (final.token, final.finish_reason, expired.output_ids) == (None, "deadline", [])
    mid = engine.submit(OK, GenerationParams(max_tokens=1000, ignore_eos=True, sampling=GREEDY),
                        deadline=time.monotonic() + 0.3)
    while not mid.finished:
        engine.step()
        time.sleep(0.005)
    assert mid.finish_reason == "deadline" and 0 < len(mid.output_ids) < 1000
    engine.pool.check_all_free()


def test_background_thread_serves_concurrent_clients(make_engine):
    engine = make_engine()
    params = GenerationParams(max_tokens=15, sampling=GREEDY, ignore_eos=True)
    inputs = prompts((3, 40, 17, 66, 9), seed=9)
    expected = [tokens_of(alone(engine, p, params)) for p in inputs]
    engine.start()
    results: dict[int, list[int]] = {}
    seen_by_callback: dict[int, int] = {}

    def client(i: int) -> None:
        def count(event):
            seen_by_callback[i] = seen_by_callback.get(i, 0) + 1

        handle = engine.submit(inputs[i], params, on_event=count)
        results[i] = tokens_of(list(handle.events(timeout=30)))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [results[i] for i in range(len(inputs))] == expected
    assert all(seen_by_callback[i] == 15 for i in range(len(inputs)))
    # cancel from another thread while the engine thread decodes
    handle = engine.submit(OK, GenerationParams(max_tokens=900, ignore_eos=True))
    events = handle.events(timeout=30)
    next(events), next(events)
    handle.cancel()
    assert [e for e in events][-1].finish_reason == "cancelled"
    engine.stop()
    assert not engine.is_running
    engine.pool.check_all_free()


def test_closing_generate_cancels(make_engine):
    engine = make_engine()
    stream = engine.generate(OK, GenerationParams(max_tokens=50, ignore_eos=True))
    next(stream), next(stream)
    stream.close()
    assert engine.metrics()["requests_finished"] == {"cancelled": 1}
    engine.pool.check_all_free()


def test_metrics_and_report(make_engine):
    engine = make_engine(max_active=4, max_queue=2)
    for p in prompts((5, 9, 14)):
        engine.submit(p, GenerationParams(max_tokens=4, sampling=GREEDY, ignore_eos=True))
    engine.step()
    m = engine.metrics()
    assert m["active"] == 3 and m["state_slots_free"] == m["state_slots_total"] - 3
    engine.run_until_idle()
    m = engine.metrics()
    assert (m["active"], m["queued"], m["requests_finished"]) == (0, 0, {"length": 3})
    assert (m["prompt_tokens"], m["generated_tokens"]) == (28, 12)
    assert m["kv_pages_free"] == m["kv_pages_total"] and m["tokens_free"] == m["token_capacity"]
    assert m["ttft_s"]["count"] == 3 and m["itl_s"]["count"] == 9 and len(m["itl_s"]["samples"]) == 9
    assert m["ttft_s"]["buckets"][-1] == (float("inf"), 3)
    info = engine.describe()
    assert info["capacity_policy"] == "auto" and info["pool_bytes"] > 0
    assert info["token_capacity"] == info["kv_pages"] * info["page_size"]
    assert (info["max_active"], info["max_queue"], info["prefill_chunk"]) == (4, 2, 32)
    labels = [label for _, label, _ in engine.report()]
    assert {"context pool", "KV capacity", "KV capacity policy"} <= set(labels)


def test_engine_settings_are_checked(make_runner, tiny_tokenizer):
    runner = make_runner(max_active=2)
    with pytest.raises(ValueError, match="max_active must be in 1..2"):
        Engine(runner, tiny_tokenizer, max_active=3)
    assert Engine(runner, tiny_tokenizer, max_active=2, prefill_chunk=4096).prefill_chunk == 32
    assert LazyEngine is Engine
    assert SamplingParams().seed is None
