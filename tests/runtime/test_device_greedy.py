"""Greedy choices made on the device: `ModelRunner.decode_greedy` and the engine's use of it."""

from __future__ import annotations

import dataclasses

import numpy as np

from ninfer_runtime.engine import GenerationParams

from .engine_helpers import GREEDY, alone, prompts, tokens_of


def test_decode_greedy_is_the_argmax_of_the_same_step(make_runner):
    runner = make_runner(max_active=2)
    assert runner.device_greedy
    prompt = prompts((20,), seed=5)[0]
    a, b = runner.pool.acquire(), runner.pool.acquire()
    try:
        for s in (a, b):
            runner.prefill(s, prompt)
        for token in (3, 77, 400):  # a few steps: both sequences stay identical
            logits = runner.decode([a], [token]).astype(np.float64)[0]
            ids, logprobs = runner.decode_greedy([b], [token])
            assert ids.dtype == np.int32 and ids.shape == (1,) and logprobs.shape == (1,)
            assert ids[0] == np.argmax(logits)
            lse = logits.max() + np.log(np.exp(logits - logits.max()).sum())
            np.testing.assert_allclose(logprobs[0], logits[ids[0]] - lse, rtol=1e-5, atol=1e-5)
    finally:
        runner.pool.release(a)
        runner.pool.release(b)


def test_engine_takes_the_device_choice_only_for_plain_greedy(make_engine, monkeypatch):
    engine = make_engine()
    calls = {"greedy": 0, "logits": 0}
    decode, decode_greedy = engine.runner.decode_rows, engine.runner.decode_greedy_async

    def counted(name, fn):
        def call(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return call

    monkeypatch.setattr(engine.runner, "decode_rows", counted("logits", decode))
    monkeypatch.setattr(engine.runner, "decode_greedy_async", counted("greedy", decode_greedy))
    prompt = prompts((12,), seed=6)[0]
    plain = tokens_of(alone(engine, prompt, GenerationParams(max_tokens=8, sampling=GREEDY, ignore_eos=True)))
    assert calls == {"greedy": 7, "logits": 0}  # the first token comes from prefill's logits
    with_alternatives = dataclasses.replace(GREEDY, logprobs=2)  # needs the whole row on the host
    events = alone(engine, prompt, GenerationParams(max_tokens=8, sampling=with_alternatives, ignore_eos=True))
    assert calls == {"greedy": 7, "logits": 7}
    assert tokens_of(events) == plain
    # the chosen token's log-probability agrees between the two paths
    ref = alone(engine, prompt, GenerationParams(max_tokens=8, sampling=dataclasses.replace(GREEDY, logprobs=0),
                                                 ignore_eos=True))
    np.testing.assert_allclose([e.logprob for e in ref if e.token is not None],
                               [e.logprob for e in events if e.token is not None], rtol=1e-4, atol=1e-4)


def test_decode_refuses_a_batch_without_one_token_per_sequence(make_runner):
    """No sequences, or a token count that is not the batch's: a clear error, nothing reserved or advanced."""
    import pytest

    runner = make_runner(max_active=2)
    a = runner.pool.acquire()
    try:
        runner.prefill(a, [5, 6, 7])
        pages = list(a.pages)
        for seqs, tokens in (([], []), ([a], [1, 2]), ([a], [[1]])):
            with pytest.raises(ValueError, match="one token per sequence"):
                runner.decode(seqs, tokens)
        assert a.length == 3 and a.pages == pages
        assert runner.decode([a], [4]).shape[0] == 1 and a.length == 4
    finally:
        runner.pool.release(a)


def test_decode_rows_copies_only_the_rows_asked_for(make_runner):
    runner = make_runner(max_active=6)
    prompt = prompts((18,), seed=2)[0]
    a, b = [runner.pool.acquire() for _ in range(3)], [runner.pool.acquire() for _ in range(3)]
    try:
        for i in range(3):  # a[i] and b[i]: the same prompt
            runner.prefill(a[i], prompt[: 6 + 4 * i])
            runner.prefill(b[i], prompt[: 6 + 4 * i])
        full = runner.decode(a, [5, 6, 7])
        ids, logprobs, rows = runner.decode_rows(b, [5, 6, 7], [2, 0], reuse=True)
        np.testing.assert_array_equal(rows, full[[2, 0]])
        assert rows.base is runner._logits_rows  # (the kept buffer)
        np.testing.assert_array_equal(ids, np.argmax(full, axis=-1))
        assert logprobs.shape == (3,) and runner.decode_rows(b, [1, 2, 3], [])[2].shape == (0, full.shape[1])
        import pytest

        with pytest.raises(ValueError, match="outside the batch"):
            runner.decode_rows(b, [1, 2, 3], [3])
    finally:
        for s in a + b:
            runner.pool.release(s)


def test_a_mixed_batch_samples_only_its_sampling_rows_on_the_host(make_engine, monkeypatch):
    from .engine_helpers import staggered

    engine = make_engine()
    a, b = prompts((14, 9), seed=12)
    greedy = GenerationParams(max_tokens=8, sampling=GREEDY, ignore_eos=True)
    sampled = GenerationParams(max_tokens=8, sampling=dataclasses.replace(GREEDY, temperature=0.9, greedy=False,
                                                                          seed=3), ignore_eos=True)
    reference = [tokens_of(alone(engine, p, q)) for p, q in ((a, greedy), (b, sampled))]
    asked = []
    rows = engine.runner.decode_rows
    monkeypatch.setattr(engine.runner, "decode_rows", lambda seqs, toks, want, **kw: asked.append((len(seqs), list(want)))
                        or rows(seqs, toks, want, **kw))
    handles, _ = staggered(engine, [(a, greedy), (b, sampled)], (0, 0))
    assert [h.output_ids for h in handles] == reference
    assert (2, [1]) in asked and all(len(want) == 1 for _, want in asked)


def test_a_non_finite_step_ends_its_request_with_an_error_and_the_engine_keeps_serving(make_engine, monkeypatch):
    """A device choice with a NaN log-probability (the model's logits were NaN; the greedy kernels
    then choose token 0, never an id past the vocabulary) ends that request with an error naming it;
    the request beside it and the next one generate as usual."""
    engine = make_engine()
    params = GenerationParams(max_tokens=6, sampling=GREEDY, ignore_eos=True)
    reference = [tokens_of(alone(engine, p, params)) for p in prompts((9, 14))]
    poisoned, real = {"left": 1}, engine.runner.decode_greedy_async

    def nan_once(seqs, tokens, **kwargs):
        pending = real(seqs, tokens, **kwargs)
        if len(seqs) == 2 and poisoned["left"]:
            poisoned["left"] -= 1
            ids, logprobs = (a.copy() for a in pending.result())
            ids[0], logprobs[0] = 0, np.nan
            pending._result = (ids, logprobs)  # noqa: SLF001 (the step's first row came out NaN)
        return pending

    monkeypatch.setattr(engine.runner, "decode_greedy_async", nan_once)
    handles = [engine.submit(p, params) for p in prompts((9, 14))]
    engine.run_until_idle()
    first, second = handles
    assert first.finish_reason == "error" and "not finite" in first.error
    assert second.finish_reason == "length" and second.output_ids == reference[1]
    after = engine.submit(prompts((9,))[0], params)
    engine.run_until_idle()
    assert after.finish_reason == "length" and after.output_ids == reference[0]
