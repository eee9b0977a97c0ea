"""KV append + paged attention against dense numpy causal attention."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tvm")

from ninfer_compiler.ops.paged_attention import kv_append, paged_attention  # noqa: E402

HQ, HKV, D, PS = 4, 2, 16, 16


def test_append_then_attend_matches_dense(op_compiler):
    def fn(q, k, v, pool, pages, lens):
        pool = kv_append(pool, k, v, pages, lens, layer=1, page_size=PS)
        o = paged_attention(q, pool, pages, lens, layer=1, page_size=PS)
        return o, pool

    run = op_compiler(
        fn,
        {
            "q": (["b", "n", HQ, D], "float32"),
            "k": (["b", "n", HKV, D], "float32"),
            "v": (["b", "n", HKV, D], "float32"),
            "pool": ([2, "pages", 2, HKV, PS, D], "float32"),
            "pages": (["b", "p"], "int32"),
            "lens": (["b"], "int32"),
        },
    )
    rng = np.random.default_rng(1)
    num_pages = 12
    pool = np.zeros((2, num_pages, 2, HKV, PS, D), "float32")
    # Two sequences with scattered pages; history of 20 and 35 tokens, 5 new tokens each.
    pages = np.array([[7, 2, 9, 0], [3, 11, 5, 1]], dtype="int32")
    lens = np.array([20, 35], dtype="int32")
    total = lens + 5
    keys = rng.standard_normal((2, total.max(), HKV, D)).astype("float32")
    vals = rng.standard_normal((2, total.max(), HKV, D)).astype("float32")
    for b in range(2):
        for p in range(lens[b]):
            pool[1, pages[b, p // PS], 0, :, p % PS] = keys[b, p]
            pool[1, pages[b, p // PS], 1, :, p % PS] = vals[b, p]
    new_k = np.stack([keys[b, lens[b] : lens[b] + 5] for b in range(2)])
    new_v = np.stack([vals[b, lens[b] : lens[b] + 5] for b in range(2)])
    q = rng.standard_normal((2, 5, HQ, D)).astype("float32")
    (o, _), after = run(q, new_k, new_v, pool, pages, lens)
    for b in range(2):
        for t in range(5):
            p = lens[b] + t
            for h in range(HQ):
                kk, vv = keys[b, : p + 1, h // 2], vals[b, : p + 1, h // 2]
                s = kk @ q[b, t, h] / np.sqrt(D)
                w = np.exp(s - s.max())
                np.testing.assert_allclose(o[b, t, h], (w / w.sum()) @ vv, rtol=1e-5, atol=1e-6)
            # the new token's K/V landed in its page
            np.testing.assert_array_equal(after[3][1, pages[b, p // PS], 0, :, p % PS], keys[b, p])
    assert not after[3][0].any(), "another layer's pages were written"
