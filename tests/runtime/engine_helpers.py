"""Shared by the engine tests: reference runs, staggered arrivals, event bookkeeping."""

from __future__ import annotations

import numpy as np

from ninfer_runtime.engine import Engine, GenerationParams, RequestHandle, TokenEvent
from ninfer_runtime.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0, greedy=True)


def prompts(lengths: tuple[int, ...], seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(2, 500, size=n).tolist() for n in lengths]


def alone(engine: Engine, prompt: list[int], params: GenerationParams) -> list[TokenEvent]:
    """The events of one request with nothing else in the engine."""
    return list(engine.generate(prompt, params))


def tokens_of(events: list[TokenEvent]) -> list[int]:
    return [e.token for e in events if e.token is not None]


def text_of(events: list[TokenEvent]) -> str:
    return "".join(e.text for e in events)


def staggered(engine: Engine, requests: list[tuple[list[int], GenerationParams]],
              arrival_steps: tuple[int, ...]) -> tuple[list[RequestHandle], int]:
    """Submit request i just before step `arrival_steps[i]`; step until idle. Returns the handles
    and the most requests seen running in one step."""
    handles: list[RequestHandle | None] = [None] * len(requests)
    peak, step = 0, 0
    while True:
        for i, at in enumerate(arrival_steps):
            if at == step:
                handles[i] = engine.submit(*requests[i])
        busy = engine.step()
        peak = max(peak, engine.metrics()["active"])
        step += 1
        if not busy and step > max(arrival_steps):
            return handles, peak


def drain(handle: RequestHandle) -> list[TokenEvent]:
    """Events already delivered to a handle whose request has finished."""
    assert handle.finished
    return list(handle.events())
