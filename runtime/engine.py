"""The engine: one loaded model, up to `max_active` requests generating at once.

    engine = Engine(runner, tokenizer)
    handle = engine.submit(prompt_ids, GenerationParams(max_tokens=64))
    for event in handle.events():   # drives the engine, or waits for its thread after start()
        print(event.text, end="")

`submit` validates and queues (RequestError / QueueFull at once); `step` runs one scheduling
iteration (see `scheduler` for the policy: continuous batching, chunked prefill interleaved with
decode, preemption with exact recomputation); `start` runs steps on a background thread while
there is work. Results do not depend on what else is batched: decode rows and sampling are
per-request (sampling keyed by (seed, absolute position)), and prefill chunk boundaries depend
only on the request (bf16 / quantized CUDA packages pick some kernels by row count, so there a
row agrees across batch sizes to rounding; docs/engine.md). Plain greedy decode steps are queued
ahead (`_decode`). docs/engine.md describes the policy, memory plan and API.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .memory import report_rows
from .metrics import EngineMetrics
from .requests import (
    FINISH_REASONS,
    GenerationParams,
    QueueFull,
    Request,
    RequestError,
    RequestHandle,
    RequestStats,
    TextStream,
    TokenEvent,
    check_request,
)
from .runner import ModelRunner, PendingGreedy
from .sampling import TokenChoice, sample
from .scheduler import Scheduler
from .text import Tokenizer

__all__ = [
    "FINISH_REASONS", "Engine", "GenerationParams", "QueueFull", "RequestError", "RequestHandle",
    "RequestStats", "TokenEvent",
]

_log = logging.getLogger("ninfer.engine")


def draw_threads(cores: int | None = None) -> int:
    """Threads that draw one step's sampling rows side by side (0: one after another, on one core).
    A draw is NumPy work on a vocabulary-sized row that releases the GIL, and the step loop waits
    for the draws, so every core can take a row: on the 2-core build machine eight 248,320-token
    rows took 26.9 ms in turn and 16.3 ms in two threads (peaked rows), 156.8 and 87.8 ms (flat)."""
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return 0 if cores <= 1 else min(8, cores)


_draw_pool: ThreadPoolExecutor | None = None
_draw_pool_lock = threading.Lock()


def _draw_executor() -> ThreadPoolExecutor | None:
    global _draw_pool
    with _draw_pool_lock:
        if _draw_pool is None and draw_threads():
            _draw_pool = ThreadPoolExecutor(draw_threads(), thread_name_prefix="ninfer-draw")
        return _draw_pool


@dataclasses.dataclass
class _QueuedDecode:
    """A decode step queued on the device whose greedy choices the engine has not read yet."""

    batch: list[Request]
    fresh: list[bool]  # rows whose choice is a new token (the others recompute known ones)
    choices: PendingGreedy


class Engine:
    """Serves requests on a `ModelRunner` with continuous batching (thread-safe submit/cancel)."""

    def __init__(self, runner: ModelRunner, tokenizer: Tokenizer, *, max_active: int = 8, max_queue: int = 16,
                 prefill_chunk: int | None = None, eos_token_ids: tuple[int, ...] | None = None,
                 max_context: int | None = None) -> None:
        slots = runner.pool.plan.num_slots
        if not 1 <= max_active <= slots:
            raise ValueError(f"max_active must be in 1..{slots} (the runner's state slots), got {max_active}")
        if max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_queue}")
        if prefill_chunk is not None and prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1, got {prefill_chunk}")
        self.runner = runner
        self.tokenizer = tokenizer
        self.max_active = max_active
        self.max_queue = max_queue
        # Larger chunks than the package was compiled for are split by it anyway; clamp.
        self.prefill_chunk = min(prefill_chunk or runner.prefill_chunk, runner.prefill_chunk)
        self.eos_token_ids = tuple(tokenizer.eos_token_ids if eos_token_ids is None else eos_token_ids)
        self.vocab_size = int(runner.manifest.raw["model"]["vocab_size"])
        self.max_context = min(runner.max_context, max_context or runner.max_context)
        # One request's prompt + output can never exceed either limit.
        self.token_limit = min(self.max_context, runner.pool.plan.token_capacity)
        self.pool = runner.pool
        self._scheduler = Scheduler(self.pool, max_active=max_active, prefill_chunk=self.prefill_chunk)
        self._step_lock = threading.Lock()  # one step at a time; guards scheduler and pool
        self._cond = threading.Condition()  # guards inbox, cancels, live count; wakes the thread
        self._inbox: list[Request] = []
        self._cancels: list[Request] = []
        self._requests: dict[int, Request] = {}  # id(handle) -> request, while live
        self._live = 0
        self._arrivals = itertools.count()
        self._ids = itertools.count(1)
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._metrics = EngineMetrics()
        self._queued: _QueuedDecode | None = None  # the decode step whose tokens are read next

    # -- submitting ---------------------------------------------------------------------------

    def submit(self, prompt: list[int], params: GenerationParams | None = None, *,
               deadline: float | None = None, request_id: str | None = None,
               on_event: Callable[[TokenEvent], None] | None = None) -> RequestHandle:
        """Validate and queue a request. `deadline` is a `time.monotonic()` value; `on_event` is
        called (on the engine's thread) with each event as well as queueing it on the handle."""
        params = GenerationParams() if params is None else params
        try:
            ids = check_request(prompt, params, deadline, vocab_size=self.vocab_size,
                                max_context=self.max_context, token_limit=self.token_limit)
        except RequestError:
            self._metrics.add(rejected=1)
            raise
        sampling = params.sampling
        seed = sampling.seed if sampling.seed is not None else secrets.randbits(64)
        logprobs = params.logprobs if params.logprobs is not None else sampling.logprobs
        sampling = dataclasses.replace(sampling, seed=seed, logprobs=logprobs)
        stop_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else set(self.eos_token_ids))
        with self._cond:
            if self._live >= self.max_active + self.max_queue:
                self._metrics.add(rejected=1)
                raise QueueFull(f"the engine is full ({self.max_active} active + {self.max_queue} queued "
                                "requests); try again later")
            handle = RequestHandle(self, request_id or f"req-{next(self._ids)}", len(ids), seed, on_event)
            req = Request(prompt=ids, output=handle.output_ids, arrival=next(self._arrivals), handle=handle,
                          params=params, sampling=sampling, stop_ids=frozenset(stop_ids), token_limit=self.token_limit,
                          text=TextStream(self.tokenizer, tuple(params.stop_strings), params.skip_special_tokens),
                          deadline=deadline, submitted_at=time.perf_counter(),
                          device_draws=self.runner.device_sampling)
            self._live += 1
            self._requests[id(handle)] = req
            self._inbox.append(req)
            self._metrics.add(submitted=1, prompt_tokens=len(ids))
            self._cond.notify_all()
        return handle

    # -- cancelling ---------------------------------------------------------------------------

    def _cancel(self, handle: RequestHandle) -> None:
        with self._cond:
            req = self._requests.get(id(handle))
            if req is None or req.cancel_requested:
                return
            req.cancel_requested = True
            self._cancels.append(req)
            self._cond.notify_all()
        # Free it now unless a step is in flight (that step reaps it before it ends).
        if self._step_lock.acquire(blocking=False):
            try:
                self._take_inbox()
                self._reap()
            finally:
                self._step_lock.release()

    # -- stepping -----------------------------------------------------------------------------

    def step(self) -> bool:
        """One scheduler iteration; False when there was nothing to do."""
        with self._step_lock:
            self._take_inbox()
            self._reap()
            sched = self._scheduler
            if not sched.has_work():
                self._read_queued()
                return False
            plan = sched.reserve_decode()
            if plan.preempted:
                self._metrics.add(preemptions=len(plan.preempted))
                for req in plan.preempted:
                    req.handle.stats.preemptions += 1
            for req in plan.exhausted:
                self._finish(req, "context_capacity")
            now = time.perf_counter()
            for req in sched.admit():
                if req.admitted_at is None:
                    req.admitted_at = now
                    req.handle.stats.queue_s = now - req.submitted_at
            if plan.batch:
                self._decode(plan.batch)
            else:
                self._read_queued()
            job = sched.next_prefill()
            if job is not None:
                self._prefill(*job)
            self._reap()
            return True

    def run_until_idle(self) -> None:
        """Step until every submitted request has finished."""
        while self.step():
            pass

    def _take_inbox(self) -> None:
        with self._cond:
            inbox, self._inbox = self._inbox, []
        for req in inbox:
            self._scheduler.enqueue(req)

    def _reap(self) -> None:
        """Finish cancelled and expired requests (their pages and slots return to the pool)."""
        with self._cond:
            cancels, self._cancels = self._cancels, []
        for req in cancels:
            if not req.finished:
                self._finish(req, "cancelled")
        now = time.monotonic()
        for req in self._scheduler.live():
            if req.deadline is not None and now >= req.deadline:
                self._finish(req, "deadline")

    def _decode(self, batch: list[Request]) -> None:
        """One decode step for `batch`. Batches whose tokens are all chosen on the device (plain
        greedy, and plain draws where the package draws) are queued there and their tokens read
        after the next step is queued (that step takes them on the device where a request looks
        ahead), so the host's work overlaps the GPU's; other batches run as one synchronous step
        with the logits of the rows that need them on the host."""
        on_device = self.runner.device_greedy and all(req.chosen_on_device for req in batch)
        if not on_device:
            self._read_queued()  # every row's token on the host first
            batch = [req for req in batch if not req.finished]
            if batch:
                self._decode_logits(batch)
            return
        before, rows, tokens = self._queued, {}, []
        for i, req in enumerate(batch):
            token = req.next_input()
            if token is None:  # the queued step is computing it
                rows[i] = before.batch.index(req)
                token = 0
            tokens.append(token)
        fresh = [req.cache.length >= req.total_tokens - 1 for req in batch]
        # a drawn row's uniform is keyed by the position of the token it draws: past the tokens
        # read so far and the one a queued step is computing
        draws = {i: req.sampling.device_row(req.total_tokens + req.inflight)
                 for i, req in enumerate(batch) if not req.sampling.plain_greedy}
        try:
            choices = self.runner.decode_greedy_async([req.cache for req in batch], tokens,
                                                      feed=before.choices if rows else None, feed_rows=rows,
                                                      draws=draws)
        except Exception as exc:
            _log.exception("decode step failed")
            self._read_queued()
            for req in batch:
                self._finish(req, "error", error=f"decode failed: {exc}")
            return
        for req, new in zip(batch, fresh, strict=True):
            req.inflight += new
        self._queued = _QueuedDecode(batch, fresh, choices)
        if before is not None:
            self._read(before)

    def _read_queued(self) -> None:
        queued, self._queued = self._queued, None
        if queued is not None:
            self._read(queued)

    def _read(self, queued: _QueuedDecode) -> None:
        """Take a queued step's tokens (rows finished meanwhile are skipped: what was queued after
        their last token is discarded)."""
        try:
            ids, logprobs = queued.choices.result()
        except Exception as exc:
            _log.exception("decode step failed")
            ids = logprobs = None
            error = f"decode failed: {exc}"
        for i, req in enumerate(queued.batch):
            if not queued.fresh[i]:
                req.handle.stats.recomputed_tokens += 1
                self._metrics.add(recomputed_tokens=1)
                continue
            req.inflight -= 1
            if req.finished:
                continue
            if ids is None:
                self._finish(req, "error", error=error)
            else:
                self._accept(req, TokenChoice(int(ids[i]), float(logprobs[i])))

    def _decode_logits(self, batch: list[Request]) -> None:
        """A synchronous step for a batch with rows that sample: plain draws (no penalties,
        constraints or alternatives) are drawn on the device where the package can (`sample`),
        the other rows' logits come to the host; plain greedy rows take the device's choice
        (device-greedy packages)."""
        tokens = [req.next_input() for req in batch]
        seqs = [req.cache for req in batch]
        host = [i for i, req in enumerate(batch) if not (req.sampling.plain_greedy and req.params.allowed_tokens is None)]
        draws = {}
        if self.runner.device_sampling:
            draws = {i: batch[i].sampling.device_row(batch[i].total_tokens) for i in host
                     if batch[i].sampling.plain_draw and batch[i].params.allowed_tokens is None}
            host = [i for i in host if i not in draws]
        ids, drawn = None, {}
        try:
            if draws:
                ids, logprobs, rows, drawn = self.runner.decode_drawn(seqs, tokens, draws, host, reuse=True)
                logits = dict(zip(host, rows, strict=True))
            elif self.runner.device_greedy:
                ids, logprobs, rows = self.runner.decode_rows(seqs, tokens, host, reuse=True)
                logits = dict(zip(host, rows, strict=True))
            else:
                logits = dict(enumerate(self.runner.decode(seqs, tokens)))
        except Exception as exc:
            _log.exception("decode step failed")
            for req in batch:
                self._finish(req, "error", error=f"decode failed: {exc}")
            return
        sampled = []
        for i, req in enumerate(batch):
            if req.cache.length != req.total_tokens:
                req.handle.stats.recomputed_tokens += 1
                self._metrics.add(recomputed_tokens=1)
            elif i in logits:
                sampled.append((req, logits[i]))
            elif i in drawn:
                self._accept(req, TokenChoice(*drawn[i]))
            else:
                self._accept(req, TokenChoice(int(ids[i]), float(logprobs[i])))
        self._sample(sampled)

    def _prefill(self, req: Request, tokens: list[int]) -> None:
        try:
            logits = self.runner.prefill(req.cache, tokens)
        except Exception as exc:
            _log.exception("prefill of %s failed", req.handle.id)
            self._finish(req, "error", error=f"prefill failed: {exc}")
            return
        self._metrics.add(prefill_tokens=len(tokens))
        if req.output:  # recomputing after a preemption: these logits were used already
            req.handle.stats.recomputed_tokens += len(tokens)
            self._metrics.add(recomputed_tokens=len(tokens))
        elif req.cache.length == len(req.prompt):
            self._sample([(req, logits)])

    # -- tokens out ---------------------------------------------------------------------------

    def _allowed_mask(self, req: Request, vocab: int) -> np.ndarray | None:
        mask = req.params.allowed_tokens(list(req.output))
        if mask is None:
            return None
        mask = np.asarray(mask)
        if mask.dtype != np.bool_ or mask.ndim != 1 or mask.size > vocab:
            raise ValueError(f"allowed_tokens must return a bool mask of at most {vocab} entries, got "
                             f"{mask.dtype} of shape {mask.shape}")
        if mask.size < vocab:
            mask = np.concatenate([mask, np.zeros(vocab - mask.size, bool)])
        if not mask.any():
            raise ValueError("allowed_tokens allows no token")
        return mask

    def _sample(self, rows: list[tuple[Request, np.ndarray]]) -> None:
        """Choose each request's next token from its logits row on the host (~2-4 ms a 248,320-token
        row with a peaked distribution, ~16 ms a nearly flat one, on the build machine). Each draw
        depends only on its row, its request's history and (seed, position), so the rows of a step
        are drawn side by side (`draw_threads`); the tokens are then taken in row order."""
        ready = []
        for req, logits in rows:
            if req.cancel_requested:
                continue  # reaped at the end of this step
            try:  # (the request's callback runs here, on the step's thread)
                mask = None if req.params.allowed_tokens is None else self._allowed_mask(req, logits.shape[-1])
            except Exception as exc:
                self._finish(req, "error", error=f"allowed_tokens: {exc}")
                continue
            ready.append((req, logits, mask))

        def draw(item: tuple[Request, np.ndarray, np.ndarray | None]) -> TokenChoice | Exception:
            req, logits, mask = item
            try:
                return sample(logits, req.sampling, position=req.total_tokens, prompt=req.prompt,
                              output=req.output, allowed=mask)
            except Exception as exc:  # e.g. non-finite logits
                return exc

        pool = _draw_executor() if len(ready) > 1 else None
        choices = list(pool.map(draw, ready)) if pool is not None else [draw(item) for item in ready]
        for (req, _, _), choice in zip(ready, choices, strict=True):
            if isinstance(choice, Exception):
                _log.error("sampling for %s failed", req.handle.id, exc_info=choice)
                self._finish(req, "error", error=f"sampling failed: {choice}")
            else:
                self._accept(req, choice)

    def _accept(self, req: Request, choice: TokenChoice) -> None:
        """The chosen token becomes the request's next output (stop checks, stats, delivery)."""
        if req.cancel_requested:
            return  # reaped at the end of this step
        if math.isnan(choice.logprob) or not 0 <= choice.token < self.vocab_size:
            self._finish(req, "error", error=f"no valid token at this step: the model's logits were not finite "
                                             f"(token {choice.token}, log-probability {choice.logprob})")
            return
        now = time.perf_counter()
        stats = req.handle.stats
        token = choice.token
        req.output.append(token)
        stats.generated_tokens += 1
        self._metrics.add(generated_tokens=1)
        if req.first_token_at is None:
            req.first_token_at = now
            stats.ttft_s = now - req.submitted_at
            stats.prefill_s = now - (req.admitted_at or req.submitted_at)
            self._metrics.observe_ttft(stats.ttft_s)
        else:
            self._metrics.observe_itl(now - req.last_token_at)
        req.last_token_at = now
        want = req.sampling.logprobs
        event = TokenEvent(token, "", logprob=choice.logprob if want is not None else None,
                           top_logprobs=list(choice.top) if want is not None else None)
        if token in req.stop_ids:
            event.text = req.text.finish()  # the stop token's own text is never emitted
            self._finish(req, "stop", event)
            return
        event.text, matched = req.text.push(token)
        if matched:
            req.handle._deliver(event)
            self._finish(req, "stop_string", TokenEvent(None, ""))
            return
        reason = None
        if len(req.output) >= req.params.max_tokens:
            reason = "length"
        elif req.total_tokens >= self.token_limit:
            reason = "context_capacity"
        if reason is None:
            req.handle._deliver(event)
        else:
            event.text += req.text.finish()
            self._finish(req, reason, event)

    def _finish(self, req: Request, reason: str, event: TokenEvent | None = None, *, error: str | None = None) -> None:
        """End a request: pages and slot back to the pool, stats closed, final event delivered."""
        if req.finished:
            return
        self._scheduler.drop(req)
        if event is None:
            # Release text held back for a possible stop string or an unfinished character,
            # so the streamed text always adds up to the decoded output.
            event = TokenEvent(None, "" if reason == "stop_string" else req.text.finish())
        event.finished, event.finish_reason, event.error = True, reason, error
        now = time.perf_counter()
        stats = req.handle.stats
        if req.admitted_at is None:
            stats.queue_s = now - req.submitted_at
        elif req.first_token_at is None:
            stats.prefill_s = now - req.admitted_at
        else:
            stats.decode_s = now - req.first_token_at
        self._metrics.finish(reason)
        with self._cond:
            self._live -= 1
            self._requests.pop(id(req.handle), None)
        req.handle._deliver(event)

    # -- background thread --------------------------------------------------------------------

    @property
    def is_running(self) -> bool:
        """Whether the background thread is stepping the engine."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    def start(self) -> None:
        """Step on a background thread whenever there is work (submit and cancel wake it)."""
        with self._cond:
            if self.is_running:
                return
            self._stopping = False
            self._thread = threading.Thread(target=self._loop, name="ninfer-engine", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop the background thread after its current step; requests stay queued (`step` or
        `start` resumes them)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        self._thread = None

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and not (self._inbox or self._cancels or self._scheduler.has_work()):
                    self._cond.wait()
                if self._stopping:
                    return
            try:
                self.step()
            except Exception as exc:  # a bug, not a bad request: fail what is live, keep serving
                _log.exception("engine step failed")
                self._fail_all(f"engine step failed: {exc}")

    def _fail_all(self, message: str) -> None:
        with self._step_lock:
            self._take_inbox()
            self._queued = None
            for req in self._scheduler.live():
                self._finish(req, "error", error=message)

    # -- conveniences -------------------------------------------------------------------------

    def generate(self, prompt: list[int], params: GenerationParams | None = None, *,
                 deadline: float | None = None) -> Iterator[TokenEvent]:
        """Submit one request and iterate its events (closing the iterator early cancels it)."""
        handle = self.submit(prompt, params, deadline=deadline)
        return self._stream(handle)

    @staticmethod
    def _stream(handle: RequestHandle) -> Iterator[TokenEvent]:
        try:
            yield from handle.events()
        finally:
            if not handle.finished:
                handle.cancel()

    def describe(self) -> dict:
        """The startup report: the runner's memory plan plus the engine's limits."""
        info = self.runner.describe()
        info.update(max_active=self.max_active, max_queue=self.max_queue, prefill_chunk=self.prefill_chunk,
                    max_context=self.max_context, request_token_limit=self.token_limit)
        return info

    def report(self) -> list[tuple[str, str, str]]:
        """(group, label, value) rows of the startup report, for `ninfer run` / `serve` logs."""
        info = self.describe()
        rows = report_rows(info)
        rows.append(("engine", "concurrency", f"{info['max_active']} active, {info['max_queue']} queued, "
                                              f"prefill chunk {info['prefill_chunk']}"))
        return rows

    def metrics(self) -> dict:
        """Live gauges and totals since startup (never blocks on a running step)."""
        sched, pool = self._scheduler, self.pool
        with self._cond:
            inbox = len(self._inbox)
        plan = pool.plan
        return {
            "active": len(sched.running),
            "queued": len(sched.waiting) + inbox,
            "max_active": self.max_active,
            "max_queue": self.max_queue,
            "kv_pages_free": pool.free_pages,
            "kv_pages_total": plan.num_pages,
            "state_slots_free": pool.free_slots,
            "state_slots_total": plan.num_slots,
            "page_size": plan.page_size,
            "token_capacity": plan.token_capacity,
            "tokens_free": pool.free_pages * plan.page_size,
            "pool_bytes": plan.total_bytes,
            **self._metrics.snapshot(),
        }
