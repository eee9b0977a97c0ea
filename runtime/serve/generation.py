"""One generation request between Sanic's event loop and the engine thread.

`Generation.run()` submits the prompt, then yields `Delta`s as tokens arrive: the engine's blocking
event iterator is drained by a small forwarding thread into an `asyncio.Queue` (through
`call_soon_threadsafe`), so the event loop never blocks. Token ids become text here (streaming
detokenizer, then the reasoning split, per-channel stop strings and the tool-call parser), so the
two dialects only format deltas. Leaving the iterator early (client gone, task cancelled, stop
string) cancels the engine request, which frees its KV pages and state slot.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from ..engine import GenerationParams
from ..text import (
    ReasoningSplitter,
    StopMatcher,
    StreamingDetokenizer,
    StreamingToolCallParser,
    ToolCall,
)
from .constrained import OutputController
from .errors import ApiError

KEEPALIVE = object()  # yielded after `keepalive` seconds without output (SSE comment)
_END = object()


@dataclass
class TokenLogprob:
    token: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class Delta:
    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.tool_calls or self.logprobs)


@dataclass
class Job:
    """What to generate and how to read the output (built by an endpoint)."""

    prompt_ids: list[int]
    params: GenerationParams
    thinking: bool = False  # output starts in the reasoning channel
    raw: bool = False  # legacy completions: no reasoning split, no tool parsing
    tools: list[dict[str, Any]] | None = None  # parse tool calls against this set
    max_name_len: int = 64
    stop: tuple[str, ...] = ()
    controller: OutputController | None = None


@dataclass
class Outcome:
    """The whole result, complete once `run()` is exhausted."""

    reasoning: list[str] = field(default_factory=list)
    content: list[str] = field(default_factory=list)
    tool_calls: list[ToolCall] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None  # engine reason, or "stop_string"
    stop_sequence: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    cached_tokens: int = 0
    queued_at: float = 0.0
    first_token_at: float | None = None
    finished_at: float | None = None
    error: str | None = None

    @property
    def text(self) -> str:
        return "".join(self.content)

    @property
    def reasoning_text(self) -> str:
        return "".join(self.reasoning)

    @property
    def truncated(self) -> bool:
        return self.finish_reason in ("length", "context_capacity")


def normalize_top(top: Any) -> list[tuple[int, float]]:
    """Engine top-logprob alternatives as (token, logprob) pairs, whatever container they came in."""
    if not top:
        return []
    if isinstance(top, dict):
        return [(int(k), float(v)) for k, v in top.items()]
    return [(int(t), float(lp)) for t, lp in top]


class Generation:
    def __init__(self, service: Any, job: Job, *, keepalive: float | None = None) -> None:
        self.service = service
        self.job = job
        self.keepalive = keepalive
        self.outcome = Outcome(prompt_tokens=len(job.prompt_ids))
        self.handle = None
        self._detok = StreamingDetokenizer(service.tokenizer, skip_special_tokens=True)
        self._splitter = None if job.raw else ReasoningSplitter(job.thinking)
        self._stops = (StopMatcher(job.stop), StopMatcher(job.stop))  # reasoning, answer
        self._parser = (StreamingToolCallParser(job.tools, job.max_name_len)
                        if job.tools and not job.raw else None)
        self._last_token_at: float | None = None

    def submit(self) -> None:
        """Queue the request with the engine (429 / 400 / 503 as ApiError)."""
        self.outcome.queued_at = time.perf_counter()
        self.handle = self.service.submit(self.job.prompt_ids, self.job.params)

    def cancel(self) -> None:
        if self.handle is not None and not self.handle.finished:
            self.handle.cancel()

    async def run(self) -> AsyncIterator[Any]:
        """Deltas (and KEEPALIVE markers) until the request ends; raises ApiError on failure."""
        if self.handle is None:
            self.submit()
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        threading.Thread(target=_forward, args=(self.handle, loop, queue), daemon=True,
                         name="ninfer-serve-events").start()
        last_sent = time.perf_counter()
        try:
            while self.outcome.finish_reason is None:
                now = time.perf_counter()
                waits = [] if self.keepalive is None else [last_sent + self.keepalive - now]
                queue_deadline = self._queue_deadline()
                if queue_deadline is not None:
                    if now >= queue_deadline:
                        self._end("deadline", "the request waited too long for admission")
                        break
                    waits.append(queue_deadline - now)
                try:
                    item = await asyncio.wait_for(queue.get(), max(min(waits), 0.001) if waits else None)
                except TimeoutError:
                    if self.keepalive is not None and time.perf_counter() >= last_sent + self.keepalive:
                        last_sent = time.perf_counter()
                        yield KEEPALIVE
                    continue
                last_sent = time.perf_counter()
                if item is _END:
                    self._end("error", "the engine ended the request without a final event")
                    break
                if isinstance(item, BaseException):
                    self._end("error", f"engine failure: {item}")
                    break
                delta = self._on_event(item)
                if delta:
                    yield delta
        finally:
            self.cancel()
            self._record()
        if self.outcome.finish_reason == "error" or (self.outcome.finish_reason == "deadline"
                                                      and not self.outcome.completion_tokens):
            raise self._failure()

    def _queue_deadline(self) -> float | None:
        """When a not yet admitted request gives up (server.queue_timeout_ms); None once admitted."""
        timeout = getattr(self.service, "queue_timeout", None)
        if not timeout or self.outcome.first_token_at is not None:
            return None
        if getattr(getattr(self.handle, "stats", None), "queue_s", 0.0) > 0.0:
            return None  # admitted: prefill and decode are bounded by max_tokens instead
        return self.outcome.queued_at + timeout

    def _failure(self) -> ApiError:
        if self.outcome.finish_reason == "deadline":
            return ApiError(503, "the request waited too long for the engine", code="request_queue_timeout")
        return ApiError(500, self.outcome.error or "generation failed", type="internal_error")

    def _end(self, reason: str, error: str | None = None) -> None:
        self.outcome.finish_reason = reason
        self.outcome.error = error
        self.outcome.finished_at = time.perf_counter()

    def _on_event(self, event: Any) -> Delta:
        out = self.outcome
        delta = Delta()
        now = time.perf_counter()
        text = ""
        if event.token is not None:
            out.completion_tokens += 1
            if out.first_token_at is None:
                out.first_token_at = now
                self.service.metrics.observe_ttft(now - out.queued_at)
            elif self._last_token_at is not None:
                self.service.metrics.observe_itl(now - self._last_token_at)
            self._last_token_at = now
            if self._splitter is not None and self._splitter.in_reasoning:
                out.reasoning_tokens += 1
            if event.logprob is not None and self.job.params.logprobs is not None:
                entry = TokenLogprob(event.token, float(event.logprob), normalize_top(event.top_logprobs))
                out.logprobs.append(entry)
                delta.logprobs.append(entry)
            text = self._detok.push(event.token)
        if event.finished:
            text += self._detok.flush()
        self._route(text, delta, final=event.finished)
        if out.finish_reason is None and event.finished:
            self._end(event.finish_reason or "stop", getattr(event, "error", None))
        return delta

    def _route(self, text: str, delta: Delta, final: bool) -> None:
        """Text -> channels -> stop strings -> tool calls, into `delta` and the outcome."""
        if self._splitter is None:
            reasoning, answer = "", text
        else:
            reasoning, answer = self._splitter.push(text)
            if final:
                r2, a2 = self._splitter.flush()
                reasoning, answer = reasoning + r2, answer + a2
        stop_r, stop_a = self._stops
        if reasoning:
            reasoning, hit = stop_r.push(reasoning)
            if not hit and final:
                reasoning += stop_r.flush()
            delta.reasoning += reasoning
            self.outcome.reasoning.append(reasoning)
            if hit:
                self._stopped(stop_r.matched, delta)
                return
        elif final:
            tail = stop_r.flush()
            delta.reasoning += tail
            self.outcome.reasoning.append(tail)
        answer, hit = stop_a.push(answer)
        if not hit and final:
            answer += stop_a.flush()
        self._answer(answer, delta, final or hit)
        if hit:
            self._stopped(stop_a.matched, delta)

    def _stopped(self, matched: str | None, delta: Delta) -> None:
        if self._parser is not None and self._result_pending():
            self._answer("", delta, True)
        self.outcome.stop_sequence = matched
        self._end("stop_string")
        self.cancel()

    def _result_pending(self) -> bool:
        try:
            self._parser.result  # noqa: B018 - raises until finish()
        except RuntimeError:
            return True
        return False

    def _answer(self, text: str, delta: Delta, final: bool) -> None:
        if self._parser is None:
            delta.content += text
            self.outcome.content.append(text)
            return
        updates = [self._parser.push(text)] if text else []
        if final:
            updates.append(self._parser.finish())
        for update in updates:
            delta.content += update.content
            self.outcome.content.append(update.content)
            delta.tool_calls.extend(update.tool_calls)
            self.outcome.tool_calls.extend(update.tool_calls)

    def _record(self) -> None:
        out = self.outcome
        if out.finish_reason is None:
            out.finish_reason = "cancelled"
        if out.finished_at is None:
            out.finished_at = time.perf_counter()
        stats = getattr(self.handle, "stats", None)
        for name in ("cached_tokens", "prefix_cache_hit_tokens", "cache_hit_tokens"):
            value = getattr(stats, name, None)
            if isinstance(value, int):
                out.cached_tokens = value
                break
        self.service.metrics.observe_outcome(out)


def _forward(handle: Any, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue) -> None:
    """Engine thread's blocking events -> the request's asyncio queue."""
    def put(item: Any) -> bool:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
            return True
        except RuntimeError:  # the loop is closed (shutdown)
            return False

    try:
        for event in handle.events():
            if not put(event):
                return
            if event.finished:
                return
        put(_END)
    except Exception as exc:  # noqa: BLE001 - reported to the request as an engine failure
        put(exc)
