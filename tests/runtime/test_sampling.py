"""The sampler: the same draws as a whole-row stable sort, found from the head of the distribution
(`_head`, `_draw`), over peaked and flat rows, ties, masks, every cut, and the rounding edge."""

from __future__ import annotations

import numpy as np
import pytest

from ninfer_runtime.sampling import CANDIDATES, SamplingParams, _draw, _head, sample, uniform_draw


def _reference_draw(z: np.ndarray, params: SamplingParams, u: float) -> int:
    """The definition: the whole row sorted (stable, descending), cut, renormalized, inverted."""
    live = np.flatnonzero(~np.isneginf(z))
    order = live[np.argsort(-z[live], kind="stable")]
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
    idx = int(np.searchsorted(np.cumsum(p), u, side="right"))
    return int(order[min(idx, int(keep.sum()) - 1)])


def _rows(rng: np.random.Generator):
    """(name, logits) rows: peaked like a language model's, flat, with ties, and masked."""
    for vocab in (7, 300, 5000):
        yield "peaked", (rng.standard_normal(vocab) * 4).astype(np.float32)
        yield "flat", (rng.standard_normal(vocab) * 0.05).astype(np.float32)
        yield "ties", np.round(rng.standard_normal(vocab) * 2).astype(np.float32)
        masked = (rng.standard_normal(vocab) * 3).astype(np.float32)
        masked[rng.random(vocab) < 0.9] = -np.inf
        masked[int(rng.integers(vocab))] = 1.0  # at least one allowed
        yield "masked", masked


PARAMS = [SamplingParams(temperature=t, top_p=tp, top_k=k, min_p=mp)
          for t in (0.3, 1.0, 2.0) for tp in (1.0, 0.9, 0.5) for k in (0, 1, 5, 2000) for mp in (0.0, 0.05)]


def test_draws_are_those_of_the_whole_sorted_row(monkeypatch):
    import ninfer_runtime.sampling as sampling

    sorted_whole = []
    head = sampling._head
    monkeypatch.setattr(sampling, "_head",
                        lambda z, m, *key: sorted_whole.append(m >= z.size > CANDIDATES) or head(z, m, *key))
    rng = np.random.default_rng(0)
    checked = 0
    for name, x in _rows(rng):
        for params in PARAMS:
            z = x.astype(np.float64) / params.temperature
            for u in (*rng.random(3), 0.0, 1.0 - 1e-17, 0.9999999999999999):
                got, want = _draw(z, params, u), _reference_draw(z, params, u)
                assert got == want, (name, x.size, params, u)
                assert not np.isneginf(x[got]), "a masked token was drawn"
                checked += 1
    # both ways were taken: the head alone, and the whole row (the flat 5,000-token rows)
    assert checked > 3000 and any(sorted_whole) and not all(sorted_whole)


def test_head_is_the_stable_sort_prefix():
    rng = np.random.default_rng(1)
    for _ in range(50):
        z = np.round(rng.standard_normal(int(rng.integers(1, 3000))) * 3)  # many ties
        m = int(rng.integers(1, z.size + 2))
        head = _head(z, m)
        full = np.argsort(-z, kind="stable")
        assert head.size >= min(m, z.size)
        np.testing.assert_array_equal(head, full[: head.size])
        if head.size < z.size:
            assert z[full[head.size]] < z[head[-1]]  # nothing left out that ties the last one


def test_sample_reports_log_probabilities_and_alternatives():
    rng = np.random.default_rng(2)
    x = (rng.standard_normal(4000) * 3).astype(np.float32)
    y = x.astype(np.float64) - x.max()
    logprobs = y - np.log(np.exp(y).sum())
    greedy = sample(x, SamplingParams(temperature=0.0, logprobs=5), position=0)
    assert greedy.token == int(np.argmax(x)) and greedy.logprob == float(logprobs[greedy.token])
    assert [t for t, _ in greedy.top] == np.argsort(-logprobs, kind="stable")[:5].tolist()
    params = SamplingParams(temperature=0.8, top_p=0.95, seed=11)
    drawn = sample(x, params, position=3)
    assert drawn.token == _reference_draw(x.astype(np.float64) / 0.8, params, uniform_draw(11, 3))
    assert drawn.logprob == float(logprobs[drawn.token])
    allowed = np.zeros(4000, bool)
    allowed[[5, 17, 3999]] = True
    masked = sample(x, SamplingParams(temperature=1.5, seed=4), position=0, allowed=allowed)
    assert masked.token in (5, 17, 3999)


def test_nan_logits_are_refused_and_overflowing_ones_win():
    x = np.zeros(10, np.float32)
    x[3] = np.nan
    with pytest.raises(ValueError, match="not finite"):
        sample(x, SamplingParams(temperature=1.0, seed=1), position=0)
    x = np.linspace(-1, 1, 10).astype(np.float32)  # a penalty this small sends the seen positive logits to inf
    params = SamplingParams(temperature=1.0, repetition_penalty=1e-39, seed=1)
    choice = sample(x, params, position=0, prompt=[8, 9])  # both at the largest float: half each
    assert choice.token in (8, 9) and abs(choice.logprob - np.log(0.5)) < 1e-12


def test_a_vocabulary_sized_row_is_not_sorted_whole(monkeypatch):
    """A peaked 248,320-token row (the 27B vocabulary): a head of 1,024 decides every draw, and the
    row is never sorted whole (what the sampler did before, ~20 ms a row)."""
    import ninfer_runtime.sampling as sampling

    rng = np.random.default_rng(3)
    x = (rng.standard_normal(248320) * 4).astype(np.float32)
    z = x.astype(np.float64) / 0.7
    sizes = []
    head = sampling._head
    monkeypatch.setattr(sampling, "_head", lambda z, m, *key: sizes.append(m) or head(z, m, *key))
    for params in (SamplingParams(temperature=0.7, top_p=0.9), SamplingParams(temperature=0.7),
                   SamplingParams(temperature=0.7, min_p=0.1), SamplingParams(temperature=0.7, top_k=50)):
        for pos in range(5):
            assert _draw(z, params, uniform_draw(5, pos)) == _reference_draw(z, params, uniform_draw(5, pos))
    assert sizes and max(sizes) <= CANDIDATES


def test_descending_order_is_the_stable_sort_of_the_negated_values():
    from ninfer_runtime.sampling import descending_order

    rng = np.random.default_rng(7)
    rows = [rng.standard_normal(5000) * 3, np.round(rng.standard_normal(5000) * 2),  # many ties
            np.array([0.0, -0.0, 1.0, -1.0, 0.0, -0.0, -np.inf, 1e-40, -1e-40, 1e30]),
            np.array([2.0]), np.zeros(0)]
    for row in rows:
        for dtype in (np.float64, np.float32):
            v = row.astype(dtype)
            np.testing.assert_array_equal(descending_order(v), np.argsort(-v, kind="stable"), err_msg=f"{dtype} {v[:6]}")
    x = (rng.standard_normal(20000) * 0.5).astype(np.float32)  # a float32 row orders its z = x / T
    np.testing.assert_array_equal(descending_order(x), np.argsort(-(x.astype(np.float64) / 0.7), kind="stable"))
    with pytest.raises(TypeError, match="float16"):
        descending_order(np.zeros(3, np.float16))


def test_sample_sorts_a_flat_row_by_its_float32_logits_to_the_same_draws(monkeypatch):
    """`sample` orders a whole row by the float32 logits themselves (two radix passes instead of
    four: z = x / T orders and ties as x does); the draws are the definition's."""
    import ninfer_runtime.sampling as sampling

    keyed = []
    head = sampling._head
    monkeypatch.setattr(sampling, "_head", lambda z, m, key=None: keyed.append(m >= z.size and key is not None)
                        or head(z, m, key))
    rng = np.random.default_rng(5)
    for x in ((rng.standard_normal(6000) * 0.05).astype(np.float32),
              np.round(rng.standard_normal(6000) * 0.2).astype(np.float32)):  # flat, and flat with ties
        for params in (SamplingParams(temperature=0.7, top_p=0.9, seed=3), SamplingParams(temperature=1.3, seed=4),
                       SamplingParams(temperature=0.9, top_p=0.95, min_p=0.01, seed=5)):
            for pos in range(4):
                z = x.astype(np.float64) / params.temperature
                assert sample(x, params, position=pos).token == _reference_draw(z, params, uniform_draw(params.seed, pos))
    assert any(keyed)
