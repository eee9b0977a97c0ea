"""The engine: requests in, tokens out, over one loaded package.

`Engine.submit` queues a request (prompt token ids + generation parameters) and returns a
handle; `Engine.step` runs one scheduling iteration; `Engine.generate` drives a single request to
completion and yields its token events (what `ninfer run` uses).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from .pools import PoolExhausted, SequenceCache
from .runner import ModelRunner
from .sampling import SamplingParams, TokenChoice, sample


class RequestError(ValueError):
    """A request the engine cannot accept (too long, bad parameters); the message says why."""


@dataclass(frozen=True)
class GenerationParams:
    max_tokens: int = 128
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop_token_ids: tuple[int, ...] = ()


@dataclass
class TokenEvent:
    token: int
    choice: TokenChoice
    finished: bool = False
    finish_reason: str | None = None


@dataclass
class RequestStats:
    prompt_tokens: int = 0
    generated_tokens: int = 0
    submitted_at: float = 0.0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    first_token_at: float | None = None

    @property
    def ttft_seconds(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.submitted_at


@dataclass
class Request:
    prompt: list[int]
    params: GenerationParams
    output: list[int] = field(default_factory=list)
    stats: RequestStats = field(default_factory=RequestStats)
    cache: SequenceCache | None = None
    finish_reason: str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class Engine:
    """Runs requests on a `ModelRunner`; one request at a time in this version."""

    def __init__(self, runner: ModelRunner, eos_token_ids: tuple[int, ...] = ()) -> None:
        self.runner = runner
        self.eos_token_ids = tuple(eos_token_ids)

    def check(self, prompt: list[int], params: GenerationParams) -> None:
        if not prompt:
            raise RequestError("the prompt is empty")
        limit = self.runner.max_context
        if len(prompt) >= limit:
            raise RequestError(f"the prompt has {len(prompt)} tokens; the context limit is {limit} "
                               "(prompt plus at least one output token)")
        if params.max_tokens < 1:
            raise RequestError("max_tokens must be at least 1")
        vocab = self.runner.manifest.raw["model"]["vocab_size"]
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise RequestError(f"prompt token id {bad[0]} is outside the vocabulary of {vocab}")

    def generate(self, prompt: list[int], params: GenerationParams) -> Iterator[TokenEvent]:
        """Prefill, then decode until a stop token, the output limit or the context limit."""
        self.check(prompt, params)
        request = Request(list(prompt), params)
        request.stats.prompt_tokens = len(prompt)
        request.stats.submitted_at = time.perf_counter()
        try:
            request.cache = self.runner.pool.acquire()
        except PoolExhausted as exc:
            raise RequestError(f"no capacity for the request: {exc}") from None
        try:
            yield from self._run(request)
        finally:
            self.runner.pool.release(request.cache)
            self.last_stats = request.stats

    def _run(self, request: Request) -> Iterator[TokenEvent]:
        stops = set(self.eos_token_ids) | set(request.params.stop_token_ids)
        start = time.perf_counter()
        logits = self.runner.prefill(request.cache, request.prompt)
        request.stats.prefill_seconds = time.perf_counter() - start
        decode_start = None
        while True:
            position = request.cache.length
            choice = sample(logits, request.params.sampling, position=position, prompt=request.prompt,
                            output=request.output)
            request.output.append(choice.token)
            request.stats.generated_tokens += 1
            if request.stats.first_token_at is None:
                request.stats.first_token_at = time.perf_counter()
            if choice.token in stops:
                request.finish_reason = "stop-token"
            elif len(request.output) >= request.params.max_tokens:
                request.finish_reason = "output-limit"
            elif request.cache.length + 1 > self.runner.max_context:
                request.finish_reason = "context-capacity"
            event = TokenEvent(choice.token, choice, request.finished, request.finish_reason)
            if request.finished:
                if decode_start is not None:
                    request.stats.decode_seconds = time.perf_counter() - decode_start
                yield event
                return
            yield event
            if decode_start is None:
                decode_start = time.perf_counter()
            logits = self.runner.decode([request.cache], [choice.token])[0]
