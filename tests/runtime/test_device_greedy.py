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
    decode, decode_greedy = engine.runner.decode, engine.runner.decode_greedy_async

    def counted(name, fn):
        def call(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return call

    monkeypatch.setattr(engine.runner, "decode", counted("logits", decode))
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
