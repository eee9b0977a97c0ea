"""Tokens to text: stop strings across token boundaries, split UTF-8 characters, stop tokens,
output and context limits, logprobs."""

from __future__ import annotations

import numpy as np
import pytest

from ninfer_runtime.engine import GenerationParams, RequestError

from .engine_helpers import GREEDY, alone, prompts, text_of, tokens_of

LONG = GenerationParams(max_tokens=40, sampling=GREEDY, ignore_eos=True)


def _stop_across_tokens(events) -> tuple[str, int, int]:
    """A 4-char stop string made of the end of token i's text and the start of token i+1's, whose
    first occurrence in the text is right there: (stop, its offset, i + 1)."""
    full = text_of(events)
    offset = 0
    for i in range(len(events) - 1):
        a, b = events[i].text, events[i + 1].text
        offset += len(a)
        if len(a) >= 2 and len(b) >= 2:
            stop = a[-2:] + b[:2]
            if full.find(stop) == offset - 2:
                return stop, offset - 2, i + 1
    raise AssertionError("no token boundary with two characters of text on each side")


def test_stop_string_split_across_tokens(make_engine, tiny_tokenizer):
    engine = make_engine()
    prompt = prompts((12,), seed=7)[0]
    reference = alone(engine, prompt, LONG)
    stop, offset, last = _stop_across_tokens(reference)
    events = alone(engine, prompt, GenerationParams(max_tokens=40, sampling=GREEDY, ignore_eos=True, stop_strings=(stop,)))
    assert tokens_of(events) == tokens_of(reference)[: last + 1]
    assert text_of(events) == text_of(reference)[:offset]
    assert events[-2].token == reference[last].token and not events[-2].finished
    assert (events[-1].token, events[-1].text, events[-1].finish_reason) == (None, "", "stop_string")


def _split_characters(tokenizer) -> str:
    """Text with characters that this tokenizer spells as several byte tokens."""
    picked = [ch for ch in "é你好😀ü€" if len(tokenizer.encode(ch)) > 1]
    assert picked, "the tokenizer has no multi-token character"
    return "a" + "".join(picked) + "b" + "".join(picked)


def test_multibyte_characters_stream_whole(make_engine, tiny_tokenizer):
    """Force a text whose characters span tokens (through allowed_tokens); no piece is broken."""
    text = _split_characters(tiny_tokenizer)
    forced = tiny_tokenizer.encode(text)

    def next_forced(output: list[int]) -> np.ndarray:
        mask = np.zeros(512, bool)  # the model's vocabulary
        mask[forced[len(output)]] = True
        return mask

    engine = make_engine()
    events = alone(engine, prompts((5,))[0], GenerationParams(max_tokens=len(forced), sampling=GREEDY,
                                                               allowed_tokens=next_forced))
    assert tokens_of(events) == forced
    assert text_of(events) == text == tiny_tokenizer.decode(forced)
    assert all("\ufffd" not in e.text for e in events)
    assert any(e.text == "" for e in events), "some character should have been held back"


def test_greedy_output_streams_as_decoded(make_engine, tiny_tokenizer):
    engine = make_engine()
    for prompt in prompts((3, 30, 61), seed=11):
        events = alone(engine, prompt, LONG)
        ids = tokens_of(events)
        assert text_of(events) == tiny_tokenizer.decode(ids, skip_special_tokens=True)
    raw = alone(engine, prompt, GenerationParams(max_tokens=40, sampling=GREEDY, ignore_eos=True,
                                                 skip_special_tokens=False))
    assert text_of(raw) == tiny_tokenizer.decode(tokens_of(raw))


def test_stop_tokens_eos_and_limits(make_engine, tiny_tokenizer):
    prompt = prompts((9,), seed=2)[0]
    engine = make_engine()
    ref = tokens_of(alone(engine, prompt, LONG))
    k = next(i for i in range(3, len(ref)) if ref[i] not in ref[:i])
    stopped = alone(engine, prompt, GenerationParams(max_tokens=40, sampling=GREEDY, stop_token_ids=(ref[k],)))
    assert tokens_of(stopped) == ref[: k + 1]
    assert stopped[-1].finish_reason == "stop" and stopped[-1].token == ref[k]
    assert text_of(stopped) == tiny_tokenizer.decode(ref[:k], skip_special_tokens=True)  # stop text not emitted
    # the same token as the model's eos; ignore_eos keeps going
    eos_engine = make_engine(eos_token_ids=(ref[k],))
    assert tokens_of(alone(eos_engine, prompt, GenerationParams(max_tokens=40, sampling=GREEDY))) == ref[: k + 1]
    assert tokens_of(alone(eos_engine, prompt, LONG)) == ref
    # output limit
    limited = alone(engine, prompt, GenerationParams(max_tokens=5, sampling=GREEDY, ignore_eos=True))
    assert tokens_of(limited) == ref[:5] and limited[-1].finish_reason == "length"
    # context limit: prompt + output never exceeds max_context
    small = make_engine(max_context=14)
    capped = alone(small, prompt, LONG)
    assert tokens_of(capped) == ref[:5] and capped[-1].finish_reason == "context_capacity"
    with pytest.raises(RequestError, match="max_context is 14"):
        small.submit(prompts((14,))[0], LONG)


def test_logprobs(make_engine):
    engine = make_engine()
    prompt = prompts((10,), seed=1)[0]
    seq = engine.runner.pool.acquire()
    logits = engine.runner.prefill(seq, prompt).astype(np.float64)
    engine.runner.pool.release(seq)
    expected = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())

    top = alone(engine, prompt, GenerationParams(max_tokens=6, sampling=GREEDY, ignore_eos=True, logprobs=5))
    first = top[0]
    assert first.logprob == pytest.approx(expected[first.token], abs=1e-5)
    assert [t for t, _ in first.top_logprobs] == np.argsort(-expected, kind="stable")[:5].tolist()
    for e in top:
        assert len(e.top_logprobs) == 5 and e.top_logprobs[0] == (e.token, pytest.approx(e.logprob))
        assert e.logprob <= 0
    chosen = alone(engine, prompt, GenerationParams(max_tokens=3, sampling=GREEDY, logprobs=0))
    assert all(e.logprob is not None and e.top_logprobs == [] for e in chosen if e.token is not None)
    off = alone(engine, prompt, GenerationParams(max_tokens=3, sampling=GREEDY))
    assert all(e.logprob is None and e.top_logprobs is None for e in off)
