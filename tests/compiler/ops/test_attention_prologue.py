"""The fused attention prologue (`ops/attention_prologue.py`): Triton's interpreter against numpy's
composition of the unfused ops (offset RMS norms, MRoPE, KV append), and its AOT build."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

HQ, HKV, D, PS, R = 4, 2, 32, 4, 16
SECTIONS = (4, 2, 2)
THETA, EPS = 10000.0, 1e-6


def bf16(x: np.ndarray) -> np.ndarray:
    return torch.tensor(np.asarray(x, np.float32)).bfloat16().float().numpy()


def reference(q, k, v, qw, kw, pos, pool, pages, lens, layer):
    """The unfused ops in numpy: norm -> bf16 -> MRoPE (fp32) -> bf16; K/V into their pages."""
    from ninfer_compiler.ops.rope import mrope_axis, rope_inv_freq

    inv = rope_inv_freq(R, THETA)
    half = R // 2
    b_n, t_n = q.shape[:2]
    pool = pool.copy()

    def norm_rope(x, w, b, t):
        x = x.astype(np.float32)
        n = bf16(x / np.sqrt((x * x).mean() + EPS) * (w + 1.0))
        y = n.copy()
        for dd in range(R):
            j = dd % half
            angle = np.float32(pos[mrope_axis(j, SECTIONS), b, t]) * inv[j]
            partner = dd + half if dd < half else dd - half
            sign = -1.0 if dd < half else 1.0
            y[dd] = n[dd] * np.cos(angle) + sign * n[partner] * np.sin(angle)
        return bf16(y)

    q_out = np.zeros((b_n, t_n, HQ, D), np.float32)
    for b in range(b_n):
        for t in range(t_n):
            for h in range(HQ):
                q_out[b, t, h] = norm_rope(q[b, t, h * D:(h + 1) * D], qw, b, t)
            p = lens[b] + t
            page, row = pages[b, p // PS], p % PS
            for h in range(HKV):
                pool[layer, page, 0, h, row] = norm_rope(k[b, t, h * D:(h + 1) * D], kw, b, t)
                pool[layer, page, 1, h, row] = v[b, t, h * D:(h + 1) * D]
    return q_out, pool


@pytest.mark.parametrize("b_n,t_n", [(3, 1), (1, 7)])  # decode (3 sequences), prefill (7 tokens)
def test_interpreter_matches_the_unfused_ops(b_n, t_n):
    from ninfer_compiler.ops.attention_prologue import prologue_kernel
    from ninfer_compiler.ops.rope import rope_inv_freq
    from ninfer_compiler.ops.triton_aot import interpreted

    rng = np.random.default_rng(2)
    layers, num_pages, max_pages = 2, 13, 4
    q = bf16(rng.standard_normal((b_n, t_n, HQ * D)) * 3)
    k = bf16(rng.standard_normal((b_n, t_n, HKV * D)))
    v = bf16(rng.standard_normal((b_n, t_n, HKV * D)))
    qw = rng.standard_normal(D).astype(np.float32) * 0.2
    kw = rng.standard_normal(D).astype(np.float32) * 0.2
    lens = np.array([5, 0, 2][:b_n], np.int32)
    pos = np.stack([lens[:, None] + np.arange(t_n)[None, :] + 3 * a for a in range(3)]).astype(np.int32)
    pages = rng.permutation(num_pages)[: b_n * max_pages].reshape(b_n, max_pages).astype(np.int32)
    pool = bf16(rng.standard_normal((layers, num_pages, 2, HKV, PS, D)))

    def t(x, dt=torch.float32):
        return torch.tensor(np.asarray(x), dtype=dt)

    q_out = torch.full((b_n, t_n, HQ, D), float("nan"))  # fp32 buffers: the interpreter keeps bf16 raw
    pool_t = t(pool)
    interpreted(prologue_kernel)[(b_n * t_n, HQ + HKV)](
        t(q), t(k), t(v), t(qw), t(kw), t(pos, torch.int32), t(rope_inv_freq(R, THETA)), pool_t,
        t(pages, torch.int32), t(lens, torch.int32), q_out, 1, t_n, b_n, max_pages, num_pages, EPS,
        HQ=HQ, HKV=HKV, D=D, PS=PS, R=R, S_H=SECTIONS[1], S_W=SECTIONS[2])
    ref_q, ref_pool = reference(q, k, v, qw, kw, pos, pool, pages, lens, 1)
    # one bf16 ulp where fp32 cos/sin implementations round the other way
    np.testing.assert_allclose(q_out.numpy(), ref_q, rtol=1e-2, atol=1e-2)
    np.testing.assert_allclose(pool_t.numpy(), ref_pool, rtol=1e-2, atol=1e-2)
    assert np.mean(q_out.numpy() == ref_q) > 0.95 and not np.isnan(q_out.numpy()).any()
    untouched = np.ones(num_pages, bool)
    untouched[[pages[b, (lens[b] + i) // PS] for b in range(b_n) for i in range(t_n)]] = False
    np.testing.assert_array_equal(pool_t.numpy()[:, untouched], pool[:, untouched])


def test_builds_for_every_cuda_arch():
    from ninfer_compiler.ops.attention_prologue import ARCHS, image

    for arch in ARCHS:
        img = image(24, 4, 256, 16, 64, (11, 11, 10), "float32", "float32", arch)
        assert img.fatbin and img.name.startswith("prologue_kernel")
