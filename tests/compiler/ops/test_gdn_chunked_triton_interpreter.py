"""Chunked GDN Triton kernels (`ops/gdn_chunked_triton.py`) under Triton's CPU interpreter.

tests/conftest.py chooses the interpreter before Triton is imported (`TRITON_INTERPRET=1`); run as
a script with that variable set, the file runs the same cases. Tiny head shapes; T = 1, 63, 64, 130,
200 (partial last chunk, several chunks); two sequences in different slots with a nonzero initial
state or `seq_lens == 0` over a NaN slot; against the float64 token-by-token recurrence. Other slots
and layers must stay untouched. fp32 operands check the algebra tightly; fp16 operands (the
shipped kernels) are held to the error their rounding gives; also fp16 / bf16 q, k (read in
place by the walk) and bf16 v with a bf16 output.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

HK, HV, DK, DV, LAYER = 2, 4, 16, 32, 1
F32_TOL, F16_TOL, BF16_OUT_TOL = 1e-5, 3e-3, 8e-3
# (tokens, seq_lens per sequence, (BV, warps, stages, prep warps, fp32 operands), q/k dtype, v dtype)
CASES = [
    (1, [5], (16, 4, 1, 4, True), "float32", "float32"),
    (63, [5, 0], (16, 4, 1, 4, True), "float32", "float32"),
    (130, [0, 7], (32, 4, 1, 4, True), "float32", "float32"),
    (64, [0], (32, 4, 1, 4, False), "float32", "float32"),
    (200, [3, 0], (16, 4, 1, 4, False), "float32", "float32"),
    (130, [0, 7], (16, 4, 1, 4, False), "float16", "float32"),
    (70, [4], (32, 4, 1, 4, False), "bfloat16", "bfloat16"),
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
    for n, (t, lens, config, qk_dtype, v_dtype) in enumerate(CASES):
        cfg = gdn.Config(*config)
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
        tq, tv = getattr(torch, qk_dtype), getattr(torch, v_dtype)
        qt, kt = torch.tensor(q, dtype=tq), torch.tensor(k, dtype=tq)
        vt = torch.tensor(v, dtype=tv)
        # the reference sees the inputs as the kernels get them (rounded to their dtype)
        q, k, v = (x.double().numpy() for x in (qt, kt, vt))
        ref_o, ref_s = reference(q, k, v, g, beta, state, slots, lens)
        st = torch.tensor(state, dtype=torch.float32)
        o = torch.full_like(vt, float("nan"))
        gdn.run_torch(qt, kt, vt, torch.tensor(g, dtype=torch.float32), torch.tensor(beta, dtype=torch.float32),
                      st, torch.tensor(slots), torch.tensor(lens, dtype=torch.int32), LAYER, out=o, config=cfg)
        eo = np.abs(o.double().numpy() - ref_o).max() / np.abs(ref_o).max()
        touched = np.zeros(state.shape, bool)
        touched[LAYER, slots] = True
        es = np.abs(st.numpy()[touched] - ref_s[touched]).max() / np.abs(ref_s[touched]).max()
        kept = np.array_equal(st.numpy()[~touched], state.astype(np.float32)[~touched], equal_nan=True)
        tol = F32_TOL if cfg.f32 else F16_TOL
        ok = bool(eo < (BF16_OUT_TOL if v_dtype == "bfloat16" else tol) and es < tol and kept)
        failed += not ok
        print(f"case {n}: T={t} lens={lens} cfg={config} q/k {qk_dtype} v {v_dtype} o_err={eo:.1e} "
              f"state_err={es:.1e} {'ok' if ok else 'FAIL'}")
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
