"""What a request is: its parameters, the events it streams, its handle and its engine-side state.

`GenerationParams`, `TokenEvent`, `RequestHandle` and the errors are public (re-exported by
`ninfer_runtime.engine`); `Request` and `TextStream` are the engine's private bookkeeping.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from .sampling import SamplingParams
from .scheduler import Scheduled
from .text import StopMatcher, StreamingDetokenizer, Tokenizer

if TYPE_CHECKING:
    from .engine import Engine

_log = logging.getLogger("ninfer.engine")
FINISH_REASONS = ("stop", "stop_string", "length", "context_capacity", "cancelled", "deadline", "error")
MAX_LOGPROBS = 20


class RequestError(ValueError):
    """A request the engine cannot accept (too long, bad parameters); the message says why."""


class QueueFull(RequestError):
    """Every active and queued place is taken; try again later (HTTP 429)."""


@dataclass(frozen=True)
class GenerationParams:
    max_tokens: int = 128
    sampling: SamplingParams = SamplingParams()
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()  # matched on the decoded text across token boundaries; never emitted
    logprobs: int | None = None  # None: off; 0: chosen token only; k: plus top-k alternatives
    # Constrained decoding hook: given the output ids so far, a bool mask over the vocabulary
    # (None = no constraint); called once per sampled token.
    allowed_tokens: Callable[[list[int]], np.ndarray | None] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True  # drop special tokens from the streamed text


@dataclass
class TokenEvent:
    token: int | None  # None for a final event without a token (cancel, deadline, error, stop string)
    text: str  # newly completed text (UTF-8 safe, stop strings withheld), '' if none
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None
    finished: bool = False
    # "stop" (eos/stop token), "stop_string", "length", "context_capacity", "cancelled", "deadline", "error"
    finish_reason: str | None = None
    error: str | None = None


@dataclass
class RequestStats:
    """Per-request counts and wall-clock phases (seconds; under batching they overlap others')."""

    prompt_tokens: int = 0
    generated_tokens: int = 0
    ttft_s: float | None = None  # submit -> first token
    queue_s: float = 0.0  # submit -> first admission
    prefill_s: float = 0.0  # first admission -> first token
    decode_s: float = 0.0  # first token -> finish
    preemptions: int = 0
    recomputed_tokens: int = 0  # tokens computed again after preemptions


class RequestHandle:
    """The caller's side of one request: streamed events, results, cancellation.

    Thread-safe: the engine (possibly on its own thread) appends events; one consumer iterates
    `events()`. Without a background thread `events()` drives the engine itself.
    """

    def __init__(self, engine: Engine, request_id: str, prompt_tokens: int, seed: int | None,
                 on_event: Callable[[TokenEvent], None] | None = None) -> None:
        self.id = request_id
        self.prompt_tokens = prompt_tokens
        self.seed = seed  # the sampling seed actually used (drawn at submit when not given)
        self.output_ids: list[int] = []
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.stats = RequestStats(prompt_tokens=prompt_tokens)
        self._engine = engine
        self._queue: queue.SimpleQueue[TokenEvent] = queue.SimpleQueue()
        self._on_event = on_event
        self._done = threading.Event()
        self._consumed_final = False

    @property
    def finished(self) -> bool:
        return self._done.is_set()

    def cancel(self) -> None:
        """Stop generating; pages and slot return to the pool now (or at the end of the step in
        flight). A finished request ignores it."""
        self._engine._cancel(self)

    def events(self, timeout: float | None = None) -> Iterator[TokenEvent]:
        """Events until (and including) the finished one. `timeout` bounds the wait for each
        event (TimeoutError). Drives the engine when its background thread is not running."""
        while not self._consumed_final:
            event = self._next(timeout)
            if event.finished:
                self._consumed_final = True
            yield event

    def _next(self, timeout: float | None) -> TokenEvent:
        until = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                return self._queue.get_nowait()
            except queue.Empty:
                pass
            if not self._engine.is_running:
                if not self._engine.step() and self._queue.empty():
                    raise RuntimeError(f"request {self.id}: the engine is idle but the request has not finished")
                continue
            wait = 0.05 if until is None else min(0.05, until - time.monotonic())
            if wait <= 0:
                raise TimeoutError(f"request {self.id}: no event within {timeout} s")
            try:
                return self._queue.get(timeout=wait)
            except queue.Empty:
                continue

    def _deliver(self, event: TokenEvent) -> None:
        if event.finished:
            self.finish_reason = event.finish_reason
            self.error = event.error
            self._done.set()
        self._queue.put(event)
        if self._on_event is not None:
            try:
                self._on_event(event)
            except Exception:  # a consumer's callback must not take the engine down
                _log.exception("on_event callback of request %s failed", self.id)

    def __repr__(self) -> str:
        return (f"RequestHandle({self.id!r}, prompt_tokens={self.prompt_tokens}, "
                f"output={len(self.output_ids)}, finish_reason={self.finish_reason!r})")


def check_request(prompt, params: GenerationParams, deadline: float | None, *, vocab_size: int, max_context: int,
                  token_limit: int) -> list[int]:
    """The prompt as a list of ints, or RequestError saying what is wrong (before anything is queued)."""
    if not isinstance(params, GenerationParams):
        raise RequestError(f"params must be GenerationParams, got {type(params).__name__}")
    try:
        ids = list(prompt) if not isinstance(prompt, str | bytes) else [prompt]
    except TypeError:
        ids = [prompt]
    if any(isinstance(t, bool) or not isinstance(t, int | np.integer) for t in ids):
        raise RequestError("the prompt must be a sequence of token ids (integers)")
    ids = [int(t) for t in ids]
    if not ids:
        raise RequestError("the prompt is empty; give at least one token")
    vocab = vocab_size
    for i, t in enumerate(ids):
        if not 0 <= t < vocab:
            raise RequestError(f"prompt token {i} has id {t}, outside the vocabulary (0..{vocab - 1})")
    if len(ids) >= max_context:
        raise RequestError(f"the prompt has {len(ids)} tokens; max_context is {max_context} "
                           "(prompt plus at least one output token)")
    if len(ids) >= token_limit:
        raise RequestError(f"the prompt has {len(ids)} tokens, but the context pool holds only "
                           f"{token_limit} tokens in all; raise context_capacity")
    if isinstance(params.max_tokens, bool) or not isinstance(params.max_tokens, int) or params.max_tokens < 1:
        raise RequestError(f"max_tokens must be an integer >= 1, got {params.max_tokens!r}")
    if not isinstance(params.sampling, SamplingParams):
        raise RequestError(f"sampling must be SamplingParams, got {type(params.sampling).__name__}")
    if isinstance(params.stop_strings, str) or isinstance(params.stop_token_ids, int | str):
        raise RequestError("stop_strings and stop_token_ids must be sequences (a tuple of strings / ids)")
    for t in params.stop_token_ids:
        if isinstance(t, bool) or not isinstance(t, int | np.integer) or not 0 <= t < vocab:
            raise RequestError(f"stop token id {t!r} is outside the vocabulary (0..{vocab - 1})")
    for s in params.stop_strings:
        if not isinstance(s, str) or not s:
            raise RequestError(f"stop strings must be non-empty strings, got {s!r}")
    if params.logprobs is not None and (isinstance(params.logprobs, bool) or not isinstance(params.logprobs, int)
                                        or not 0 <= params.logprobs <= MAX_LOGPROBS):
        raise RequestError(f"logprobs must be None or an integer in [0, {MAX_LOGPROBS}], got {params.logprobs!r}")
    if params.allowed_tokens is not None and not callable(params.allowed_tokens):
        raise RequestError("allowed_tokens must be callable (output ids -> bool mask or None)")
    if deadline is not None and not (isinstance(deadline, int | float) and math.isfinite(deadline)):
        raise RequestError(f"deadline must be a finite time.monotonic() value, got {deadline!r}")
    return ids


class TextStream:
    """Generated ids -> text pieces: never a broken UTF-8 character, never stop-string text."""

    def __init__(self, tokenizer: Tokenizer, stop_strings: tuple[str, ...], skip_special: bool) -> None:
        self._detok = StreamingDetokenizer(tokenizer, skip_special_tokens=skip_special)
        self._stop = StopMatcher(stop_strings)

    def push(self, token: int) -> tuple[str, bool]:
        """Text now safe to emit, and whether a stop string completed (text ends before it)."""
        return self._stop.push(self._detok.push(token))

    def finish(self) -> str:
        """Everything still held back (an unfinished character becomes U+FFFD)."""
        emit, matched = self._stop.push(self._detok.flush())
        return emit if matched else emit + self._stop.flush()


@dataclass(eq=False)
class Request(Scheduled):
    """Engine-side state of one request (the scheduler sees its `Scheduled` part)."""

    handle: RequestHandle | None = None
    params: GenerationParams = field(default_factory=GenerationParams)
    sampling: SamplingParams = field(default_factory=SamplingParams)  # seed and logprobs resolved
    stop_ids: frozenset[int] = frozenset()
    text: TextStream | None = None
    deadline: float | None = None  # time.monotonic() value
    submitted_at: float = 0.0  # time.perf_counter() values below
    admitted_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    cancel_requested: bool = False
    token_limit: int = 0  # prompt + output tokens it may reach (the engine's limit)
    device_draws: bool = False  # the package draws sampled tokens on the device (`sample`)

    @property
    def chosen_on_device(self) -> bool:
        """Its tokens are chosen on the device: plain greedy, or a plain draw where the package
        draws (no constraint, penalty or alternatives needing the logits on the host)."""
        return self.params.allowed_tokens is None and (
            self.sampling.plain_greedy or (self.device_draws and self.sampling.plain_draw))

    def may_look_ahead(self) -> bool:
        """A request whose tokens are chosen on the device and whose queued token cannot be its
        last for a known reason (max_tokens, the token limit); a stop token or string is found
        only when the token is read, and the step queued after it is then discarded."""
        return (self.chosen_on_device and not self.cancel_requested
                and len(self.output) + self.inflight < self.params.max_tokens
                and self.total_tokens + self.inflight < self.token_limit)

    @property
    def finished(self) -> bool:
        return self.handle.finished
