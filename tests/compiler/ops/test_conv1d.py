"""Causal conv1d with slot history, against numpy, for prefill and decode shapes."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tvm")

from ninfer_compiler.ops.conv1d import causal_conv1d_with_state  # noqa: E402

C, K = 6, 4


def reference(x, w, state, slots, lens, layer):
    state = state.copy()
    y = np.zeros_like(x)
    for b in range(x.shape[0]):
        history = state[layer, slots[b]] if lens[b] > 0 else np.zeros((K - 1, C), np.float32)
        ext = np.concatenate([history, x[b]], 0)
        for t in range(x.shape[1]):
            a = (w * ext[t : t + K]).sum(0)
            y[b, t] = a / (1 + np.exp(-a))
        state[layer, slots[b]] = ext[-(K - 1) :]
    return y, state


def test_conv_carries_history_across_calls(op_compiler):
    run = op_compiler(
        lambda x, w, state, slots, lens: causal_conv1d_with_state(x, w, state, slots, lens, 1),
        {
            "x": (["b", "n", C], "float32"),
            "w": ([K, C], "float32"),
            "state": ([2, "s", K - 1, C], "float32"),
            "slots": (["b"], "int32"),
            "lens": (["b"], "int32"),
        },
    )
    rng = np.random.default_rng(0)
    w = rng.standard_normal((K, C)).astype("float32")
    # Stale values everywhere: sequence 0 is fresh (seq_lens 0) and must ignore its slot.
    state = rng.standard_normal((2, 5, K - 1, C)).astype("float32")
    slots = np.array([3, 1], "int32")
    lens = np.array([0, 9], "int32")
    for n in (7, 1, 2, 1, 150):  # a prefill chunk, steps shorter than the history, several GPU tiles
        x = rng.standard_normal((2, n, C)).astype("float32")
        (y, _), after = run(x, w, state, slots, lens)
        ref_y, ref_state = reference(x, w, state, slots, lens, 1)
        np.testing.assert_allclose(y, ref_y, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(after[2], ref_state)
        state, lens = after[2], lens + n
