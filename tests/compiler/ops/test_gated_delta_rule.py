"""GDN kernels (chunked prefill and recurrent step) against a numpy recurrence."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tvm")

from ninfer_compiler.ops.gated_delta_rule import gated_delta_rule  # noqa: E402

HK, HV, DK, DV = 2, 6, 8, 4


def reference(q, k, v, g, beta, state, slots, lens, layer):
    """Token-by-token delta rule on float64 copies; returns (o, new_state)."""
    state = state.astype(np.float64).copy()
    for b in range(len(slots)):
        if lens[b] == 0:
            state[layer, slots[b]] = 0
    B, N = v.shape[:2]
    G = HV // HK
    o = np.zeros(v.shape)
    for b in range(B):
        for h in range(HV):
            s = state[layer, slots[b], h]
            for t in range(N):
                kt, qt = k[b, t, h // G], q[b, t, h // G]
                s = s * np.exp(g[b, t, h])
                u = beta[b, t, h] * (v[b, t, h] - s.T @ kt)
                s = s + np.outer(kt, u)
                o[b, t, h] = s.T @ qt
            state[layer, slots[b], h] = s
    return o, state


def make_inputs(rng, B, N):
    def l2(x):
        return x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6)

    q = (l2(rng.standard_normal((B, N, HK, DK))) / np.sqrt(DK)).astype("float32")
    k = l2(rng.standard_normal((B, N, HK, DK))).astype("float32")
    v = rng.standard_normal((B, N, HV, DV)).astype("float32")
    g = (-np.exp(rng.standard_normal((B, N, HV)) * 0.5) * 0.3).astype("float32")
    beta = (1 / (1 + np.exp(-rng.standard_normal((B, N, HV))))).astype("float32")
    return q, k, v, g, beta


@pytest.mark.parametrize("chunked", [True, False])
def test_gdn_matches_recurrence(op_compiler, chunked):
    def fn(q, k, v, g, beta, state, slots, lens):
        return gated_delta_rule(q, k, v, g, beta, state, slots, lens, layer=1, chunked=chunked)

    run = op_compiler(
        fn,
        {
            "q": (["b", "n", HK, DK], "float32"),
            "k": (["b", "n", HK, DK], "float32"),
            "v": (["b", "n", HV, DV], "float32"),
            "g": (["b", "n", HV], "float32"),
            "beta": (["b", "n", HV], "float32"),
            "state": ([2, "s", HV, DK, DV], "float32"),
            "slots": (["b"], "int32"),
            "lens": (["b"], "int32"),
        },
    )
    rng = np.random.default_rng(0)
    # 150 tokens = chunks of 64 + 64 + 22; then 1 and 3 more tokens on the carried state.
    state = (rng.standard_normal((2, 4, HV, DK, DV)) * 0.1).astype("float32")
    slots = np.array([2, 0], dtype="int32")
    lens = np.array([0, 40], dtype="int32")  # sequence 0 is fresh: its stale slot is ignored
    for n in (150, 1, 3):
        inputs = make_inputs(rng, 2, n)
        (o, _), after = run(*inputs, state, slots, lens)
        ref_o, ref_state = reference(*inputs, state, slots, lens, 1)
        np.testing.assert_allclose(o, ref_o, rtol=2e-4, atol=2e-5)
        np.testing.assert_allclose(after[5], ref_state, rtol=2e-4, atol=2e-5)
        state, lens = after[5], lens + n
