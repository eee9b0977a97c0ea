"""Pool accounting: every page and slot comes back (finish, cancel, failure), exhaustion waits or
preempts with identical results, and a request larger than the pool ends cleanly."""

from __future__ import annotations

import numpy as np
import pytest

from ninfer_runtime.engine import GenerationParams, RequestError
from ninfer_runtime.package import read_manifest

from .engine_helpers import GREEDY, alone, drain, prompts, staggered, text_of, tokens_of


def _small_pool(make_runner, tiny_package, pages: int):
    cache = read_manifest(tiny_package).cache
    return make_runner(context_bytes=8 * cache.bytes_per_slot() + pages * cache.bytes_per_page())


def test_cancel_and_failures_return_everything(make_engine, tiny_tokenizer):
    engine = make_engine(max_active=3)
    pool = engine.pool
    long_prompt, short = prompts((100, 6))
    params = GenerationParams(max_tokens=50, sampling=GREEDY, ignore_eos=True)
    in_decode = engine.submit(short, params)
    in_prefill = engine.submit(long_prompt, params)  # 4 chunks, one per step after short's
    for _ in range(3):
        engine.step()
    assert in_prefill.output_ids == [] and len(in_decode.output_ids) >= 2
    queued = [engine.submit(short, params) for _ in range(2)]  # max_active 3: one must wait
    engine.step()
    assert engine.metrics()["queued"] == 1
    free_before = pool.free_pages
    in_prefill.cancel()  # no step in flight: freed at once
    assert in_prefill.finished and in_prefill.finish_reason == "cancelled"
    assert pool.free_pages == free_before + pool.pages_for(100)
    in_decode.cancel()
    queued[1].cancel()
    for handle in (in_prefill, in_decode, queued[1]):
        final = drain(handle)[-1]
        assert (final.token, final.finished, final.finish_reason) == (None, True, "cancelled")

    def broken(output):
        if len(output) == 3:
            raise KeyError("grammar state lost")
        return None

    failing = engine.submit(short, GenerationParams(max_tokens=9, sampling=GREEDY, allowed_tokens=broken))
    nothing = engine.submit(short, GenerationParams(max_tokens=9, allowed_tokens=lambda out: np.zeros(4, bool)))
    ids_not_mask = engine.submit(short, GenerationParams(max_tokens=9, allowed_tokens=lambda out: np.array([5, 6])))
    engine.run_until_idle()
    assert ids_not_mask.finish_reason == "error" and "bool mask" in ids_not_mask.error
    assert failing.finish_reason == "error" and "grammar state lost" in failing.error
    assert len(failing.output_ids) == 3
    assert nothing.finish_reason == "error" and "allows no token" in nothing.error
    assert queued[0].finish_reason == "length"
    pool.check_all_free()
    assert engine.metrics()["requests_finished"] == {"cancelled": 3, "error": 3, "length": 1}


def test_model_failure_fails_the_batch_and_the_engine_keeps_serving(make_engine, monkeypatch):
    engine = make_engine()
    a, b = prompts((8, 12))
    params = GenerationParams(max_tokens=6, sampling=GREEDY, ignore_eos=True)
    expected = tokens_of(alone(engine, a, params))
    original, original_queued = engine.runner.decode, engine.runner.decode_greedy_async
    lost = lambda seqs, toks, **kw: (_ for _ in ()).throw(RuntimeError("device lost"))  # noqa: E731
    monkeypatch.setattr(engine.runner, "decode", lost)
    monkeypatch.setattr(engine.runner, "decode_greedy_async", lost)
    handles = [engine.submit(p, params) for p in (a, b)]
    engine.run_until_idle()
    assert [h.finish_reason for h in handles] == ["error", "error"]
    assert "device lost" in handles[0].error
    engine.pool.check_all_free()
    monkeypatch.setattr(engine.runner, "decode", original)
    monkeypatch.setattr(engine.runner, "decode_greedy_async", original_queued)
    assert tokens_of(alone(engine, a, params)) == expected

    # a step that was queued fine but whose tokens cannot be read: its requests fail, later ones run
    class Unreadable:
        def __init__(self, pending) -> None:
            self.pending, self.n = pending, pending.n

        @property
        def on_device(self) -> bool:
            return False

        def result(self):
            raise RuntimeError("read-back failed")

    calls = []

    def unreadable_third(seqs, toks, **kw):
        calls.append(len(seqs))
        pending = original_queued(seqs, toks, **kw)
        return Unreadable(pending) if len(calls) == 3 else pending

    monkeypatch.setattr(engine.runner, "decode_greedy_async", unreadable_third)
    handle = engine.submit(a, params)
    engine.run_until_idle()
    assert handle.finish_reason == "error" and "read-back failed" in handle.error
    assert handle.output_ids == expected[:3]  # the prefill's token and the first two steps'
    engine.pool.check_all_free()
    assert tokens_of(alone(engine, a, params)) == expected


def test_exhausted_pool_preempts_and_recomputes_identically(make_engine, make_runner, tiny_package, tiny_tokenizer):
    """12 pages (192 tokens) for 4 requests that each grow to ~90 tokens."""
    reference_engine = make_engine()
    engine = make_engine(runner=_small_pool(make_runner, tiny_package, pages=12))
    assert engine.pool.plan.token_capacity == 192
    requests = [(p, GenerationParams(max_tokens=50, sampling=GREEDY, ignore_eos=True))
                for p in prompts((40, 33, 45, 38), seed=3)]
    reference = [alone(reference_engine, p, params) for p, params in requests]
    handles, _ = staggered(engine, requests, (0, 0, 1, 2))
    assert engine.metrics()["preemptions"] > 0
    assert sum(h.stats.recomputed_tokens for h in handles) > 0
    for handle, ref in zip(handles, reference, strict=True):
        assert handle.output_ids == tokens_of(ref)
        assert handle.finish_reason == "length"
        assert text_of(drain(handle)) == text_of(ref)
    engine.pool.check_all_free()


def test_request_larger_than_the_pool(make_engine, make_runner, tiny_package):
    reference_engine = make_engine()
    engine = make_engine(runner=_small_pool(make_runner, tiny_package, pages=12))
    big, small = prompts((150, 20), seed=4)
    with pytest.raises(RequestError, match="context pool holds only 192 tokens"):
        engine.submit(prompts((200,))[0], GenerationParams())
    params = GenerationParams(max_tokens=100, sampling=GREEDY, ignore_eos=True)
    small_params = GenerationParams(max_tokens=30, sampling=GREEDY, ignore_eos=True)
    handles, _ = staggered(engine, [(big, params), (small, small_params)], (0, 1))
    assert handles[0].finish_reason == "context_capacity"
    assert len(big) + len(handles[0].output_ids) == 192
    assert handles[0].output_ids == tokens_of(alone(reference_engine, big, params))[:42]
    assert handles[1].finish_reason == "length"
    assert handles[1].output_ids == tokens_of(alone(reference_engine, small, small_params))
    engine.pool.check_all_free()


def test_admission_waits_for_pages(make_engine, make_runner, tiny_package):
    """A request whose prompt does not fit next to the running one waits, then runs."""
    engine = make_engine(runner=_small_pool(make_runner, tiny_package, pages=12))
    first, second = prompts((120, 100), seed=5)
    params = GenerationParams(max_tokens=4, sampling=GREEDY, ignore_eos=True)
    h1 = engine.submit(first, params)
    h2 = engine.submit(second, params)
    engine.step()
    m = engine.metrics()
    assert (m["active"], m["queued"]) == (1, 1)
    engine.run_until_idle()
    assert h1.finish_reason == h2.finish_reason == "length"
    assert h2.stats.queue_s > 0 and h2.stats.preemptions == 0
