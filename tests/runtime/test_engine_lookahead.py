"""Decode steps queued ahead: a plain greedy request's step n + 1 is queued, fed with step n's
token on the device, before the engine reads step n. The tokens must be exactly those of the
synchronous path; what was queued after a request's last token is discarded, and nothing leaks."""

from __future__ import annotations

import numpy as np
import pytest

from ninfer_runtime.engine import GenerationParams

from .engine_helpers import GREEDY, alone, prompts, staggered, tokens_of

HOST_CHOICE = dict(allowed_tokens=lambda out: None)  # no constraint, but the logits go to the host


class _Log:
    """Wraps the runner's queued decode: records each step queued (with its fed rows) and each read."""

    def __init__(self, runner, monkeypatch) -> None:
        self.events: list[tuple] = []
        queued = runner.decode_greedy_async
        log = self

        class Read:
            def __init__(self, pending, step: int) -> None:
                self.pending, self.step, self.n = pending, step, pending.n

            @property
            def on_device(self) -> bool:
                return self.pending.on_device

            @property
            def tokens(self):
                return self.pending.tokens

            def result(self):
                log.events.append(("read", self.step))
                return self.pending.result()

        def wrapped(seqs, tokens, *, feed=None, feed_rows=None, draws=None):
            step = sum(1 for e in self.events if e[0] == "queue")
            self.events.append(("queue", step, len(seqs), dict(feed_rows or {})))
            return Read(queued(seqs, tokens, feed=feed.pending if feed is not None else None, feed_rows=feed_rows,
                               draws=draws), step)

        monkeypatch.setattr(runner, "decode_greedy_async", wrapped)

    def queued(self) -> int:
        return sum(1 for e in self.events if e[0] == "queue")


def test_the_next_step_is_queued_before_the_last_one_is_read(make_engine, monkeypatch):
    engine = make_engine()
    prompt = prompts((12,), seed=3)[0]
    params = GenerationParams(max_tokens=8, sampling=GREEDY, ignore_eos=True)
    reference = tokens_of(alone(engine, prompt, GenerationParams(max_tokens=8, sampling=GREEDY, ignore_eos=True,
                                                                  **HOST_CHOICE)))
    log = _Log(engine.runner, monkeypatch)
    assert tokens_of(alone(engine, prompt, params)) == reference
    # the first token comes from the prefill; 7 decode steps, none wasted (max_tokens is known ahead)
    assert log.queued() == 7
    order = [(e[0], e[1]) for e in log.events]
    assert order[:3] == [("queue", 0), ("queue", 1), ("read", 0)]
    for k in range(1, 6):  # step k + 1 is queued before step k is read
        assert order.index(("queue", k + 1)) < order.index(("read", k))
    # every step after the first takes its token from the step before, on the device
    assert [e[3] for e in log.events if e[0] == "queue"] == [{}] + [{0: 0}] * 6
    engine.pool.check_all_free()


def test_a_stop_token_found_late_discards_the_step_queued_after_it(make_engine, monkeypatch):
    engine = make_engine()
    a, b = prompts((9, 30), seed=4)
    free = GenerationParams(max_tokens=12, sampling=GREEDY, ignore_eos=True)
    plain = tokens_of(alone(engine, a, free))
    stop = plain[4]  # decoded by the fourth step; its first occurrence ends the request
    first = plain.index(stop)
    assert first >= 1, "the stop token should come from a decode step"
    with_stop = GenerationParams(max_tokens=12, sampling=GREEDY, ignore_eos=True, stop_token_ids=(stop,))
    other = tokens_of(alone(engine, b, free))
    log = _Log(engine.runner, monkeypatch)
    handles, _ = staggered(engine, [(a, with_stop), (b, free)], (0, 0))
    assert handles[0].finish_reason == "stop" and handles[0].output_ids == plain[: first + 1]
    assert handles[1].finish_reason == "length" and handles[1].output_ids == other
    # decode rows: 11 for the other request (its first token from the prefill), and for the stopped
    # one the `first` steps up to its stop token plus the one queued before that token was read
    assert sum(e[2] for e in log.events if e[0] == "queue") == 11 + first + 1
    engine.pool.check_all_free()


def test_a_batch_with_a_host_choice_reads_the_queued_tokens_first(make_engine, monkeypatch):
    engine = make_engine()
    a, b, c = prompts((20, 7, 41), seed=8)
    greedy = GenerationParams(max_tokens=10, sampling=GREEDY, ignore_eos=True)
    host = GenerationParams(max_tokens=6, sampling=GREEDY, ignore_eos=True, **HOST_CHOICE)
    reference = [tokens_of(alone(engine, p, q)) for p, q in ((a, greedy), (b, host), (c, greedy))]
    log = _Log(engine.runner, monkeypatch)
    handles, _ = staggered(engine, [(a, greedy), (b, host), (c, greedy)], (0, 3, 5))
    assert [h.output_ids for h in handles] == reference
    assert all(h.finish_reason == "length" for h in handles)
    # while the host-chosen request ran, nothing was queued ahead: every queued step was read before
    # the next synchronous one, so reads and queues still pair up
    reads = [e[1] for e in log.events if e[0] == "read"]
    assert reads == sorted(set(reads)) and len(reads) == log.queued()
    engine.pool.check_all_free()


@pytest.mark.parametrize("rows", [{0: 1}, {2: 0}, {0: 0, 1: 1}])
def test_runner_feed_is_the_fed_steps_choice_and_bad_rows_are_refused(make_runner, rows):
    runner = make_runner(max_active=4)
    prompt = prompts((15,), seed=9)[0]
    seqs = [runner.pool.acquire() for _ in range(4)]
    try:
        for s in seqs:
            runner.prefill(s, prompt)
        first = runner.decode_greedy_async(seqs[:2], [11, 12])
        ids, _ = first.result()
        if max(rows) >= 2:
            lengths = [s.length for s in seqs]
            with pytest.raises(ValueError, match="outside the batch"):
                runner.decode_greedy_async(seqs[2:4], [1, 2], feed=first, feed_rows=rows)
            assert [s.length for s in seqs] == lengths  # refused before anything ran
            return
        # fed rows take the choice of the fed step's row; the others their own token
        tokens = np.array([30, 31], np.int32)
        fed = runner.decode_greedy_async(seqs[2:4], tokens, feed=first, feed_rows=rows).result()[0]
        want = tokens.copy()
        for d, r in rows.items():
            want[d] = ids[r]
        for i in range(2):  # two sequences in the state the fed ones had: the prompt alone
            runner.pool.release(seqs[i])
            seqs[i] = runner.pool.acquire()
            runner.prefill(seqs[i], prompt)
        ref = runner.decode_greedy_async(seqs[:2], want).result()[0]
        np.testing.assert_array_equal(fed, ref)
    finally:
        for s in seqs:
            runner.pool.release(s)


def test_a_pending_choice_is_on_the_device_only_until_read_or_overwritten():
    import tvm

    from ninfer_runtime.runner import PendingGreedy

    class ReadBack:
        def wait(self):
            return [np.array([7, 8], np.int32), np.array([-0.5, -0.25], np.float32)]

    tokens = tvm.runtime.tensor(np.array([1, 2, 3], np.int32), tvm.cpu())
    logprobs = tvm.runtime.tensor(np.zeros(3, np.float32), tvm.cpu())
    replayed = [False]
    pending = PendingGreedy(2, tokens, logprobs, ReadBack(), lambda: not replayed[0])
    assert pending.on_device
    replayed[0] = True  # the graph ran again: its output tensor holds another step's choices
    assert not pending.on_device
    replayed[0] = False
    ids, lps = pending.result()
    assert ids.tolist() == [7, 8] and lps.tolist() == [-0.5, -0.25]
    assert not pending.on_device and pending.tokens is None
    # without a read-back queue the choices are read at once
    eager = PendingGreedy(2, tokens, logprobs, None)
    assert not eager.on_device and eager.result()[0].tolist() == [1, 2]
