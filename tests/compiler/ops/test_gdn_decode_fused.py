"""The fused GDN decode step (`ops/gdn_decode_fused.py`): Triton's interpreter against a numpy
float64 composition of the unfused ops, and an h200 library whose decode graph captures it."""

from __future__ import annotations

import numpy as np
import pytest

from ..conftest import h200_library

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

HK, HV, DK, DV = 2, 4, 16, 32
C = 2 * HK * DK + HV * DV
EPS = 1e-6


def bf16(x: np.ndarray) -> np.ndarray:
    return torch.tensor(x, dtype=torch.float32).bfloat16().float().numpy().astype(np.float64)


def reference(mixed, a, b, a_log, dt_bias, z, w, state, slots, lens, layer):
    state = state.copy()
    out = np.zeros((mixed.shape[0], HV * DV))
    for s in range(mixed.shape[0]):
        row = mixed[s]
        for j in range(HV):
            kh = j // (HV // HK)
            q = row[kh * DK:(kh + 1) * DK]
            k = row[HK * DK + kh * DK:HK * DK + (kh + 1) * DK]
            v = row[2 * HK * DK + j * DV:2 * HK * DK + (j + 1) * DV]
            q = q / np.sqrt((q * q).sum() + EPS) * DK**-0.5
            k = k / np.sqrt((k * k).sum() + EPS)
            x = a[s, j] + dt_bias[j]
            g = -np.exp(a_log[j]) * (x if x > 20 else np.log1p(np.exp(x)))
            beta = bf16(np.array(1 / (1 + np.exp(-b[s, j]))))
            st = state[layer, slots[s], j] if lens[s] > 0 else np.zeros((DK, DV))
            st = st * np.exp(g)
            u = beta * (v - st.T @ k)
            st = st + np.outer(k, u)
            o = bf16(st.T @ q)
            state[layer, slots[s], j] = st
            normed = bf16(o / np.sqrt((o * o).mean() + 1e-5))
            zz = z[s, j * DV:(j + 1) * DV]
            out[s, j * DV:(j + 1) * DV] = normed * w * zz / (1 + np.exp(-zz))
    return out, state


def test_interpreter_matches_the_unfused_math():
    from ninfer_compiler.ops.gdn_decode_fused import L2_EPS, gdn_decode_kernel
    from ninfer_compiler.ops.gdn_gates import SOFTPLUS_THRESHOLD
    from ninfer_compiler.ops.triton_aot import interpreted

    rng = np.random.default_rng(1)
    B, L, S = 3, 2, 5

    def t(x, dt=torch.bfloat16):
        return torch.tensor(np.asarray(x), dtype=dt)

    mixed = t(rng.standard_normal((B, C)))
    a, b = t(rng.standard_normal((B, HV))), t(rng.standard_normal((B, HV)))
    a_log, dt_bias = t(rng.standard_normal(HV) * 0.5, torch.float32), t(rng.standard_normal(HV), torch.float32)
    z = t(rng.standard_normal((B, HV * DV)))
    w = t(rng.standard_normal(DV), torch.float32)
    state = t(rng.standard_normal((L, S, HV, DK, DV)), torch.float32)
    slots, lens = t([4, 0, 2], torch.int32), t([7, 3, 0], torch.int32)  # the third starts fresh
    out = torch.full((B, HV * DV), float("nan"), dtype=torch.float32)  # fp32: the interpreter truncates bf16
    st = state.clone()
    interpreted(gdn_decode_kernel)[(B, HV)](
        mixed, a, b, a_log, dt_bias, z, w, st, slots, lens, out, 1, S, 1e-5,
        HK=HK, HV=HV, DK=DK, DV=DV, Q_SCALE=DK**-0.5, L2_EPS=L2_EPS, SOFTPLUS_T=SOFTPLUS_THRESHOLD)

    def f64(x):
        return x.double().numpy()

    ref_out, ref_state = reference(f64(mixed), f64(a), f64(b), f64(a_log), f64(dt_bias), f64(z), f64(w),
                                   f64(state), slots.numpy(), lens.numpy(), 1)
    np.testing.assert_allclose(st.double().numpy(), ref_state, rtol=1e-4, atol=1e-5)
    # bf16 roundings inside (o, normed) can flip one ulp between float32 and float64 paths
    np.testing.assert_allclose(out.double().numpy(), ref_out, rtol=2e-2, atol=2e-2)
    np.testing.assert_array_equal(st[0].numpy(), state[0].numpy())  # other layers untouched


def test_h200_library_and_decode_graph(tmp_path):
    from ninfer_compiler.ops import gdn_decode_fused as fused

    def main(mixed, a, b, a_log, dt_bias, z, w, state, slots, lens):
        assert fused.supported(mixed, state, DK, DV)
        out, state = fused.gdn_decode_fused(mixed, a, b, a_log, dt_bias, z, w, state, slots, lens, 1, 1e-5,
                                            HK, HV, DK, DV)
        return out, state

    inputs = {"mixed": (["b", 1, C], "bfloat16"), "a": (["b", 1, HV], "bfloat16"), "b": (["b", 1, HV], "bfloat16"),
              "a_log": ([HV], "float32"), "dt_bias": ([HV], "float32"), "z": (["b", 1, HV * DV], "bfloat16"),
              "w": ([DV], "float32"), "state": ([2, "s", HV, DK, DV], "float32"), "slots": (["b"], "int32"),
              "lens": (["b"], "int32")}
    text, lib = h200_library(main, inputs, tmp_path / "model.so")
    assert "call_inplace_packed" in text and "ninfer_gdn_decode" in text
    assert b"ninfer_gdn_decode" in lib.read_bytes()
