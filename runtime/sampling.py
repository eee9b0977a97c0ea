"""Choosing the next token from logits: greedy, temperature, top-k, top-p, min-p, penalties.

Sampling is per sequence and depends only on that sequence's logits, its own history and
(seed, absolute position), never on which other sequences share the batch: the same request
gives the same tokens alone or batched. A draw is defined on the whole row sorted (stable,
descending) but computed from the head of that order wherever the head decides it (`_draw`), so a
vocabulary-sized row is rarely sorted whole.
"""

from __future__ import annotations

import threading
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
    def _row_not_needed(self) -> bool:
        """Nothing needs the whole logits row on the host: no penalties, no alternatives to report."""
        return (not self.logprobs and self.repetition_penalty == 1.0
                and self.presence_penalty == 0.0 and self.frequency_penalty == 0.0)

    @property
    def plain_greedy(self) -> bool:
        """Greedy with nothing that needs the whole logits row on the host: the device's per-row
        choice is then the same token."""
        return self.is_greedy and self._row_not_needed

    @property
    def plain_draw(self) -> bool:
        """A draw with nothing that needs the whole logits row on the host: packages that draw
        on the device (`sample`) give the same token."""
        return not self.is_greedy and self._row_not_needed

    def device_row(self, position: int) -> list[float]:
        """This draw as a row of the device's `sample` function: temperature, top_k, top_p,
        min_p and the uniform u keyed by (seed, position), as `sample` takes it."""
        return [self.temperature, float(self.top_k), self.top_p, self.min_p, uniform_draw(self.seed, position)]


DEVICE_FILLER = [1.0, 0.0, 1.0, 0.0, 0.0]  # a `sample` row whose draw is dropped: no cut to launch
SELECT_TOPK, SELECT_KEPT = 1, 2  # bits of `sample`'s selections (ops/device_sampling.py)


def device_selections(rows: np.ndarray) -> int:
    """The cuts that `sample` must launch for these rows (`device_row`s): the top-k cut where a
    row has top-k and top-p (top-p's mass is that of the top k), the kept head where a row has
    any cut. Without either, the whole row is the kept head."""
    rows = np.asarray(rows, np.float64).reshape(-1, 5)
    top_k, top_p, min_p = rows[:, 1] > 0, rows[:, 2] < 1.0, rows[:, 3] > 0
    return (SELECT_TOPK if bool((top_k & top_p).any()) else 0) | \
        (SELECT_KEPT if bool((top_k | top_p | min_p).any()) else 0)


@dataclass
class TokenChoice:
    token: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


def apply_penalties(logits: np.ndarray, params: SamplingParams, prompt: Sequence[int], output: Sequence[int]) -> np.ndarray:
    """Repetition (prompt + output, multiplicative), presence and frequency (output only)."""
    if params.repetition_penalty != 1.0 and (prompt or output):
        seen = np.unique(np.asarray(list(prompt) + list(output), dtype=np.int64))
        seen = seen[(seen >= 0) & (seen < logits.size)]
        vals = logits[seen]
        with np.errstate(over="ignore"):  # (overflow to inf: `sample` clips it)
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
    if np.isnan(x).any():
        raise ValueError("the logits are not finite (NaN)")
    np.minimum(x, np.finfo(np.float32).max, out=x)  # (a tiny repetition penalty can overflow a logit)
    y = np.subtract(x, np.float64(x.max()), out=_scratch("y", x.size), dtype=np.float64)
    log_total = np.log(np.sum(np.exp(y, out=_scratch("e", x.size))))  # log-softmax: y - log_total
    if params.is_greedy:
        token = int(np.argmax(x))  # ties -> lowest id
    else:
        z = np.divide(x, np.float64(params.temperature), out=_scratch("z", x.size), dtype=np.float64)
        token = _draw(z, params, uniform_draw(params.seed, position), key=x)  # (z = x / T: x's order is z's)
    choice = TokenChoice(token, float(y[token] - log_total))
    if params.logprobs:
        logprobs = np.subtract(y, log_total, out=_scratch("e", x.size))
        top = _head(logprobs, params.logprobs)[: params.logprobs]
        choice.top = [(int(t), float(logprobs[t])) for t in top]
    return choice


_local = threading.local()


def _scratch(name: str, n: int, dtype: type = np.float64) -> np.ndarray:
    """A row-sized buffer of this thread, reused from draw to draw: fresh vocabulary-sized
    temporaries cost more in page faults than the arithmetic on them."""
    buffers = _local.__dict__.setdefault("buffers", {})
    buf = buffers.get(name)
    if buf is None or buf.size < n:
        buf = buffers[name] = np.empty(n, dtype)
    return buf[:n]


CANDIDATES = 1024  # the head of the sorted distribution a draw tries before sorting all of it


def descending_order(v: np.ndarray) -> np.ndarray:
    """The permutation a stable sort of -v gives (descending, ties by lower index; -0 equals 0;
    no NaN), as an LSD radix sort: v's bits as order-preserving unsigned keys, then one stable
    16-bit pass per digit, lowest first (NumPy sorts 16-bit keys by counting). float32: two passes,
    ~4.5 ms for 248,320 values where the stable float64 sort takes ~26."""
    bits = {np.dtype(np.float32): np.uint32, np.dtype(np.float64): np.uint64}.get(v.dtype)
    if bits is None:
        raise TypeError(f"descending_order takes float32 or float64 values, not {v.dtype}")
    b = np.add(v, v.dtype.type(0)).view(bits)  # (-0 + 0 = +0: the two zeros tie, as they compare)
    sign = bits(1) << bits(8 * b.itemsize - 1)
    desc = np.where(b & sign, b, ~(b | sign))  # ascending desc <=> descending v
    digits = [(desc >> bits(shift)).astype(np.uint16) for shift in range(0, 8 * b.itemsize, 16)]  # (truncating)
    order = np.argsort(digits[0], kind="stable")
    for digit in digits[1:]:
        order = order[np.argsort(digit[order], kind="stable")]
    return order


def _head(z: np.ndarray, m: int, key: np.ndarray | None = None) -> np.ndarray:
    """The first entries (at least `m`) of z's descending order, ties by lower index, exactly as a
    stable sort of -z orders them: every index whose value is >= the m-th largest, sorted. Found
    with a partition, so a vocabulary-sized row is not sorted for a short head. `key`: values in
    the same order as z with the same ties (z = key / T), sorted in its place when the whole row is."""
    if m >= z.size:
        return descending_order(z if key is None else key)
    part = _scratch("part", z.size)
    np.copyto(part, z)
    part.partition(z.size - m)
    idx = np.flatnonzero(np.greater_equal(z, part[z.size - m], out=_scratch("ge", z.size, np.bool_)))
    return idx[np.argsort(-z[idx], kind="stable")]


def _draw(z: np.ndarray, params: SamplingParams, u: float, key: np.ndarray | None = None) -> int:
    """Inverse-CDF draw of `u` over softmax(z) in descending order, cut to the top k, then to the
    smallest head holding top_p of the probability and to the probabilities >= min_p x the
    largest, renormalized. Only the head of the order that decides the token is sorted; where the
    kept set or `u` reaches past it (a nearly flat distribution), the whole row is. Tokens of
    probability 0 (masked to -inf) are never drawn, not even where rounding leaves `u` past the
    kept set's total."""
    if np.isneginf(z).any():
        live = np.flatnonzero(~np.isneginf(z))
        return int(live[_draw(z[live], params, u, None if key is None else key[live])])
    k = params.top_k if 0 < params.top_k < z.size else 0
    order = _head(z, k or CANDIDATES, key)
    if k:
        order = order[:k]
    token = _draw_from(z, order, params, u, complete=bool(k) or order.size == z.size)
    return token if token is not None else _draw_from(z, _head(z, z.size, key), params, u, complete=True)


def _draw_from(z: np.ndarray, order: np.ndarray, params: SamplingParams, u: float, *, complete: bool) -> int | None:
    """The draw over the sorted `order` (the whole distribution if `complete`, else its head, the
    rest of z being smaller); None when the head cannot decide it."""
    e = np.exp(z[order] - z[order[0]])
    if complete:
        p = e / e.sum()
    else:
        rest = np.exp(np.subtract(z, z[order[0]], out=_scratch("rest", z.size)), out=_scratch("rest", z.size))
        p = e / rest.sum()  # (the normalizer is over the whole distribution)
    keep = np.ones(p.size, bool)
    if params.top_p < 1.0:
        cum = np.cumsum(p)
        keep &= (cum - p) < params.top_p
    if params.min_p > 0.0:
        keep &= p >= params.min_p * p[0]
    keep[0] = True
    kept = p.size if keep.all() else int(np.argmin(keep))  # (both cuts keep a prefix of the order)
    if complete or kept < p.size:
        q = p[:kept] / p[:kept].sum()
    elif params.top_p < 1.0:
        return None  # the top-p cut may lie past the head
    else:  # kept: the whole distribution, or every probability >= min_p x the largest
        mass = rest / rest.sum()
        q = p / (mass[mass >= params.min_p * p[0]].sum() if params.min_p > 0.0 else mass.sum())
    cum = np.cumsum(q)
    idx = int(np.searchsorted(cum, u, side="right"))
    if idx >= kept:
        if not complete and kept == p.size:
            return None  # u falls past the head
        idx = kept - 1  # (rounding: u at the kept set's total)
    return int(order[idx])


def uniform_draw(seed: int | None, position: int) -> float:
    """A uniform draw keyed by (seed, absolute position): reproducible, batch-independent."""
    if seed is None:
        return float(np.random.default_rng().random())
    return float(np.random.default_rng([seed & (2**64 - 1), position]).random())
