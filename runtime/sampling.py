"""Choosing the next token from logits: greedy, temperature, top-k, top-p, min-p, penalties.

Sampling is per sequence and depends only on that sequence's logits, its own history and
(seed, absolute position), never on which other sequences share the batch: the same request
gives the same tokens alone or batched.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np


class SamplingError(ValueError):
    """Sampling parameters out of range (the message names the field)."""


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    greedy: bool = False
    logprobs: int | None = None  # top alternatives to report (0: only the chosen token)

    def __post_init__(self) -> None:
        checks = [
            ("temperature", 0.0 <= self.temperature <= 2.0, "in [0, 2]"),
            ("top_p", 0.0 < self.top_p <= 1.0, "in (0, 1]"),
            ("top_k", self.top_k >= 0, ">= 0"),
            ("min_p", 0.0 <= self.min_p <= 1.0, "in [0, 1]"),
            ("presence_penalty", -2.0 <= self.presence_penalty <= 2.0, "in [-2, 2]"),
            ("frequency_penalty", -2.0 <= self.frequency_penalty <= 2.0, "in [-2, 2]"),
            ("repetition_penalty", 0.0 < self.repetition_penalty <= 2.0, "in (0, 2]"),
            ("seed", self.seed is None or 0 <= self.seed < 2**64, "in [0, 2^64)"),
            ("logprobs", self.logprobs is None or 0 <= self.logprobs <= 20, "in [0, 20]"),
        ]
        for name, ok, rule in checks:
            if not ok:
                raise SamplingError(f"{name} must be {rule}, got {getattr(self, name)!r}")

    @property
    def is_greedy(self) -> bool:
        return self.greedy or self.temperature == 0.0

    @property
    def plain_greedy(self) -> bool:
        """Greedy with nothing that needs the whole logits row on the host (no penalties, no
        alternatives to report): the device's per-row choice is then the same token."""
        return (self.is_greedy and not self.logprobs and self.repetition_penalty == 1.0
                and self.presence_penalty == 0.0 and self.frequency_penalty == 0.0)


@dataclass
class TokenChoice:
    token: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    m = np.max(x)
    y = x - m
    return y - np.log(np.sum(np.exp(y)))


def apply_penalties(logits: np.ndarray, params: SamplingParams, prompt: Sequence[int], output: Sequence[int]) -> np.ndarray:
    """Repetition (prompt + output, multiplicative), presence and frequency (output only)."""
    if params.repetition_penalty != 1.0 and (prompt or output):
        seen = np.unique(np.asarray(list(prompt) + list(output), dtype=np.int64))
        seen = seen[(seen >= 0) & (seen < logits.size)]
        vals = logits[seen]
        logits[seen] = np.where(vals > 0, vals / params.repetition_penalty, vals * params.repetition_penalty)
    if output and (params.presence_penalty or params.frequency_penalty):
        counts = Counter(t for t in output if 0 <= t < logits.size)
        ids = np.fromiter(counts.keys(), dtype=np.int64)
        freq = np.fromiter(counts.values(), dtype=np.float32)
        logits[ids] -= params.presence_penalty + params.frequency_penalty * freq
    return logits


def sample(logits: np.ndarray, params: SamplingParams, *, position: int, prompt: Sequence[int] = (),
           output: Sequence[int] = (), allowed: np.ndarray | None = None) -> TokenChoice:
    """The next token for one sequence. `allowed` is an optional boolean mask (constrained output)."""
    x = np.array(logits, dtype=np.float32)
    x = apply_penalties(x, params, prompt, output)
    if allowed is not None:
        x = np.where(allowed, x, -np.inf)
    logprobs_full = _log_softmax(x.astype(np.float64))
    if params.is_greedy:
        token = int(np.argmax(x))  # ties -> lowest id
    else:
        z = x.astype(np.float64) / params.temperature
        order = np.argsort(-z, kind="stable")
        if params.top_k:
            order = order[: params.top_k]
        zs = z[order]
        p = np.exp(zs - zs[0])
        p /= p.sum()
        keep = np.ones(p.size, bool)
        if params.top_p < 1.0:
            cum = np.cumsum(p)
            keep &= (cum - p) < params.top_p
        if params.min_p > 0.0:
            keep &= p >= params.min_p * p[0]
        keep[0] = True
        p = np.where(keep, p, 0.0)
        p /= p.sum()
        u = _uniform(params.seed, position)
        idx = int(np.searchsorted(np.cumsum(p), u, side="right"))
        token = int(order[min(idx, p.size - 1)])
    choice = TokenChoice(token, float(logprobs_full[token]))
    if params.logprobs:
        top = np.argsort(-logprobs_full, kind="stable")[: params.logprobs]
        choice.top = [(int(t), float(logprobs_full[t])) for t in top]
    return choice


def _uniform(seed: int | None, position: int) -> float:
    """A uniform draw keyed by (seed, absolute position): reproducible, batch-independent."""
    if seed is None:
        return float(np.random.default_rng().random())
    return float(np.random.default_rng([seed & (2**64 - 1), position]).random())
