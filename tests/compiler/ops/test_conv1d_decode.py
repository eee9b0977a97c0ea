"""The decode conv1d kernel (`ops/conv1d_decode.py`): Triton's interpreter against the float64
composition of ops/conv1d.py's semantics, several steps in a row, and an h200 library whose
decode graph calls it in place."""

from __future__ import annotations

import numpy as np
import pytest

from ..conftest import h200_library

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

C, K = 300, 4  # more than one program's channels, the last program partly masked


def reference(x, w, state, slots, lens, layer):
    state = state.copy()
    y = np.zeros_like(x)
    for b in range(x.shape[0]):
        history = state[layer, slots[b]] if lens[b] > 0 else np.zeros((K - 1, C))
        ext = np.concatenate([history, x[b][None]], 0)
        a = (w * ext).sum(0)
        y[b] = a / (1 + np.exp(-a))
        state[layer, slots[b]] = ext[1:]
    return y, state


def test_interpreter_matches_conv1d_semantics_over_steps():
    from ninfer_compiler.ops.conv1d_decode import BLOCK, conv1d_decode_kernel
    from ninfer_compiler.ops.triton_aot import interpreted

    rng = np.random.default_rng(2)
    B, L, S = 3, 2, 5

    def bf16(a):
        return torch.tensor(np.asarray(a), dtype=torch.float32).bfloat16()

    w = torch.tensor(rng.standard_normal((K, C)), dtype=torch.float32)
    state = bf16(rng.standard_normal((L, S, K - 1, C)))  # stale everywhere: sequence 1 starts fresh
    slots, lens = torch.tensor([4, 0, 2], dtype=torch.int32), torch.tensor([7, 0, 3], dtype=torch.int32)
    kernel = interpreted(conv1d_decode_kernel)
    for _ in range(3):  # each step continues the history the previous one wrote
        x = bf16(rng.standard_normal((B, C)))
        y = torch.full((B, C), float("nan"), dtype=torch.float32)  # fp32: the interpreter truncates bf16
        before = state.clone()
        kernel[(-(-C // BLOCK), B)](x, w, state, slots, lens, y, 1, S, C=C, K=K, BLOCK=BLOCK)
        ref_y, ref_state = reference(x.double().numpy(), w.double().numpy(), before.double().numpy(),
                                     slots.numpy(), lens.numpy(), 1)
        np.testing.assert_allclose(y.double().numpy(), ref_y, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(state.double().numpy(), ref_state)  # history rows: exact copies
        np.testing.assert_array_equal(state[0].float().numpy(), before[0].float().numpy())  # other layers untouched
        lens = lens + 1


def test_h200_library_calls_it_in_place(tmp_path):
    from ninfer_compiler.ops.conv1d import causal_conv1d_with_state

    def main(x, w, state, slots, lens):
        return causal_conv1d_with_state(x, w, state, slots, lens, 1)

    inputs = {"x": (["b", 1, C], "bfloat16"), "w": ([K, C], "bfloat16"), "state": ([2, "s", K - 1, C], "bfloat16"),
              "slots": (["b"], "int32"), "lens": (["b"], "int32")}
    text, lib = h200_library(main, inputs, tmp_path / "model.so")
    assert "call_inplace_packed" in text and "ninfer_conv1d_decode" in text and "causal_conv1d_gpu" not in text
    assert b"ninfer_conv1d_decode" in lib.read_bytes()
