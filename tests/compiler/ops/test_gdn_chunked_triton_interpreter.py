"""Chunked GDN Triton kernels (`ops/gdn_chunked_triton.py`) under Triton's CPU interpreter.

tests/conftest.py chooses the interpreter before Triton is imported (`TRITON_INTERPRET=1`); run as
a script with that variable set, the file runs the same cases. Tiny head shapes; T = 1, 63, 64, 130 (partial last chunk, several chunks); two sequences in different
slots with a nonzero initial state or `seq_lens == 0` over a NaN slot; against the float64
token-by-token recurrence. Other slots and layers must stay untouched.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

HK, HV, DK, DV, LAYER = 2, 4, 16, 32, 1
# (tokens, seq_lens per sequence, (BV, warps, prep warps, precision))
CASES = [
    (1, [5], (16, 4, 4, "ieee")),
    (63, [5, 0], (16, 4, 4, "ieee")),
    (64, [0], (32, 4, 4, "ieee")),
    (130, [0, 7], (16, 4, 4, "tf32x3")),
]


def reference(q, k, v, g, beta, state, slots, lens):
    """float64 recurrence `S <- exp(g) S; u = beta (v - S^T k); S += k u^T; o = S^T q`."""
    st = state.astype(np.float64).copy()
    b_, t_, _, _ = q.shape
    o = np.zeros(v.shape)
    for b in range(b_):
        for h in range(HV):
            kh = h // (HV // HK)
            s = np.zeros((DK, DV)) if lens[b] == 0 else st[LAYER, slots[b], h].copy()
            for t in range(t_):
                s *= np.exp(g[b, t, h])
                u = beta[b, t, h] * (v[b, t, h] - s.T @ k[b, t, kh])
                s += np.outer(k[b, t, kh], u)
                o[b, t, h] = s.T @ q[b, t, kh]
            st[LAYER, slots[b], h] = s
    return o, st


def main() -> int:
    """Run every case; print the worst errors and return nonzero on a failure."""
    import torch

    from ninfer_compiler.ops import gdn_chunked_triton as gdn

    rng = np.random.default_rng(0)
    failed = 0
    for n, (t, lens, config) in enumerate(CASES):
        b = len(lens)
        q = rng.standard_normal((b, t, HK, DK))
        q /= np.linalg.norm(q, axis=-1, keepdims=True) * np.sqrt(DK)
        k = rng.standard_normal((b, t, HK, DK))
        k /= np.linalg.norm(k, axis=-1, keepdims=True)
        v = rng.standard_normal((b, t, HV, DV))
        g = -np.exp(rng.uniform(-6, 0, (b, t, HV)))
        beta = rng.uniform(0.05, 1, (b, t, HV))
        state = rng.standard_normal((2, 3, HV, DK, DV)) * 0.3
        slots = np.array([2, 0][:b], dtype=np.int32)
        for i in range(b):
            if lens[i] == 0:
                state[LAYER, slots[i]] = np.nan  # ignored: the sequence starts from zero
        ref_o, ref_s = reference(q, k, v, g, beta, state, slots, lens)
        f32 = [torch.tensor(x, dtype=torch.float32) for x in (q, k, v, g, beta, state)]
        st = f32[5].clone()
        o = torch.full_like(f32[2], float("nan"))
        gdn.run_torch(*f32[:5], st, torch.tensor(slots), torch.tensor(lens, dtype=torch.int32), LAYER,
                      out=o, config=config)
        eo = np.abs(o.numpy() - ref_o).max() / np.abs(ref_o).max()
        touched = np.zeros(state.shape, bool)
        touched[LAYER, slots] = True
        es = np.abs(st.numpy()[touched] - ref_s[touched]).max() / np.abs(ref_s[touched]).max()
        kept = np.array_equal(st.numpy()[~touched], state.astype(np.float32)[~touched], equal_nan=True)
        ok = bool(eo < 1e-5 and es < 1e-5 and kept)
        failed += not ok
        print(f"case {n}: T={t} lens={lens} cfg={config} o_err={eo:.1e} state_err={es:.1e} "
              f"{'ok' if ok else 'FAIL'}")
    return 1 if failed else 0


def test_interpreter_matches_float64_recurrence(capsys):
    """In-process: tests/conftest.py sets TRITON_INTERPRET=1 before Triton is imported."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    failed = main()
    out = capsys.readouterr().out
    assert failed == 0, out
    assert out.count(" ok") == len(CASES), out


if __name__ == "__main__":
    sys.exit(main())
