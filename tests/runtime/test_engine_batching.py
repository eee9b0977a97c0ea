"""Batch invariance: a request gives the same tokens alone or among 7 others arriving at other steps."""

from __future__ import annotations

import dataclasses

import pytest

from ninfer_runtime.engine import GenerationParams
from ninfer_runtime.sampling import SamplingParams

from .engine_helpers import GREEDY, alone, drain, prompts, staggered, text_of, tokens_of

LENGTHS = (5, 70, 33, 1, 100, 17, 64, 45)  # 1..4 prefill chunks of 32
ARRIVALS = (0, 0, 1, 3, 4, 6, 9, 12)


def _check_invariant(engine, tokenizer, params_list):
    requests = list(zip(prompts(LENGTHS), params_list, strict=True))
    reference = [alone(engine, p, params) for p, params in requests]
    handles, peak = staggered(engine, requests, ARRIVALS)
    assert peak >= 6, "the requests should overlap"
    for i, (handle, ref) in enumerate(zip(handles, reference, strict=True)):
        events = drain(handle)
        assert handle.output_ids == tokens_of(ref), f"request {i} differs when batched"
        assert tokens_of(events) == handle.output_ids
        assert events[-1].finish_reason == ref[-1].finish_reason == "length"
        assert text_of(events) == text_of(ref) == tokenizer.decode(handle.output_ids, skip_special_tokens=True)
    return handles


def test_greedy_is_batch_invariant(make_engine, tiny_tokenizer):
    engine = make_engine()
    params = [GenerationParams(max_tokens=12 + 3 * i, sampling=GREEDY, ignore_eos=True) for i in range(8)]
    _check_invariant(engine, tiny_tokenizer, params)


def test_seeded_sampling_is_batch_invariant(make_engine, tiny_tokenizer):
    engine = make_engine()
    base = SamplingParams(temperature=0.8, top_p=0.9, top_k=20)
    params = [
        GenerationParams(max_tokens=12 + 3 * i, ignore_eos=True, sampling=dataclasses.replace(
            base, seed=1000 + i, presence_penalty=0.5 if i % 2 else 0.0, repetition_penalty=1.1 if i % 3 == 0 else 1.0))
        for i in range(8)
    ]
    handles = _check_invariant(engine, tiny_tokenizer, params)
    assert [h.seed for h in handles] == [1000 + i for i in range(8)]


def test_seed_changes_samples_and_unseeded_requests_record_theirs(make_engine):
    engine = make_engine()
    prompt = prompts((20,))[0]
    sampled = SamplingParams(temperature=0.8, top_p=0.9, top_k=20)
    runs = [tokens_of(alone(engine, prompt, GenerationParams(max_tokens=16, ignore_eos=True,
                                                             sampling=dataclasses.replace(sampled, seed=s))))
            for s in (1, 2)]
    assert runs[0] != runs[1]
    handle = engine.submit(prompt, GenerationParams(max_tokens=16, ignore_eos=True, sampling=sampled))
    engine.run_until_idle()
    assert isinstance(handle.seed, int)
    again = alone(engine, prompt, GenerationParams(max_tokens=16, ignore_eos=True,
                                                    sampling=dataclasses.replace(sampled, seed=handle.seed)))
    assert tokens_of(again) == handle.output_ids


@pytest.mark.parametrize("chunk", [7, 32])
def test_chunked_prefill_matches_runner(make_engine, chunk):
    """The first token is the argmax of the runner's own (one-shot) prefill logits."""
    import numpy as np

    engine = make_engine(prefill_chunk=chunk)
    prompt = prompts((75,))[0]
    seq = engine.runner.pool.acquire()
    logits = engine.runner.prefill(seq, prompt)
    engine.runner.pool.release(seq)
    events = alone(engine, prompt, GenerationParams(max_tokens=1, sampling=GREEDY, logprobs=0))
    assert events[0].token == int(np.argmax(logits))
    assert engine.describe()["prefill_chunk"] == chunk


def test_rows_drawn_side_by_side_give_the_tokens_drawn_alone(make_engine, tiny_tokenizer, monkeypatch):
    """The draw threads (hosts with cores to spare) change nothing: each row's token depends on its
    row, its history and (seed, position) only."""
    from concurrent.futures import ThreadPoolExecutor

    import ninfer_runtime.engine as engine_mod

    pool = ThreadPoolExecutor(4)
    widths = []
    real_map = pool.map
    monkeypatch.setattr(pool, "map", lambda fn, items: (widths.append(len(items)), real_map(fn, items))[1])
    monkeypatch.setattr(engine_mod, "_draw_pool", pool)
    try:
        base = SamplingParams(temperature=0.9, top_p=0.95, repetition_penalty=1.05)
        params = [GenerationParams(max_tokens=10 + 2 * i, ignore_eos=True, sampling=dataclasses.replace(base, seed=50 + i))
                  for i in range(8)]
        _check_invariant(make_engine(), tiny_tokenizer, params)
    finally:
        pool.shutdown()
    assert max(widths) >= 6  # most of the batch was drawn at once


def test_draw_threads_take_every_core_up_to_a_full_batch():
    from ninfer_runtime.engine import draw_threads

    assert draw_threads(1) == 0
    assert draw_threads(2) == 2 and draw_threads(4) == 4 and draw_threads(16) == 8


def test_a_draw_that_fails_ends_its_request_alone(make_engine, monkeypatch):
    """A row whose draw raises (drawn beside others) finishes its request with the error; the
    other rows of that step take their tokens as usual."""
    from concurrent.futures import ThreadPoolExecutor

    import ninfer_runtime.engine as engine_mod

    real = engine_mod.sample

    def flaky(logits, params, **kw):  # noqa: ANN001, ANN202, ANN003
        if params.seed == 13 and len(kw["output"]) == 2:
            raise ValueError("the logits are not finite (NaN)")
        return real(logits, params, **kw)

    pool = ThreadPoolExecutor(2)
    monkeypatch.setattr(engine_mod, "sample", flaky)
    monkeypatch.setattr(engine_mod, "_draw_pool", pool)
    try:
        engine = make_engine()
        base = SamplingParams(temperature=0.8, top_p=0.9)
        handles = [engine.submit(p, GenerationParams(max_tokens=6, ignore_eos=True,
                                                     sampling=dataclasses.replace(base, seed=s)))
                   for p, s in zip(prompts((10, 12, 14)), (11, 13, 15), strict=True)]
        engine.run_until_idle()
    finally:
        pool.shutdown()
    events = drain(handles[1])
    assert events[-1].finish_reason == "error" and "sampling failed: the logits are not finite" in events[-1].error
    assert len(handles[1].output_ids) == 2
    assert [len(handles[i].output_ids) for i in (0, 2)] == [6, 6]
