"""MRoPE and the norm ops against the HF reference functions."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tvm")

from ninfer_compiler.ops.norm import gated_rms_norm, l2_norm, rms_norm  # noqa: E402
from ninfer_compiler.ops.rope import apply_mrope  # noqa: E402

torch = pytest.importorskip("torch")


def test_mrope_matches_hf_with_distinct_rows(op_compiler):
    from transformers import Qwen3_5TextConfig
    from transformers.models.qwen3_5 import modeling_qwen3_5 as hf

    rope = {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
            "mrope_section": [3, 3, 2]}  # fmt: skip
    cfg = Qwen3_5TextConfig(head_dim=64, rope_parameters=rope, num_attention_heads=4)
    rotary = hf.Qwen3_5TextRotaryEmbedding(cfg)
    rng = np.random.default_rng(0)
    B, T, H, D = 2, 9, 3, 64
    pos = rng.integers(0, 300, size=(3, B, T)).astype("int32")  # t, h, w rows all different
    x = rng.standard_normal((B, T, H, D)).astype("float32")
    cos, sin = rotary(torch.zeros(1), torch.tensor(pos, dtype=torch.int64))
    ref, _ = hf.apply_rotary_pos_emb(
        torch.tensor(x).transpose(1, 2), torch.tensor(x).transpose(1, 2), cos, sin
    )
    run = op_compiler(
        lambda x, p: apply_mrope(x, p, 16, 1e7, (3, 3, 2)),
        {"x": (["b", "t", H, D], "float32"), "p": ([3, "b", "t"], "int32")},
    )
    (y,), _ = run(x, pos)
    np.testing.assert_allclose(y, ref.transpose(1, 2).numpy(), rtol=1e-5, atol=2e-5)


def test_norms(op_compiler):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 5, 32)).astype("float32")
    z = rng.standard_normal((3, 5, 32)).astype("float32")
    w = rng.standard_normal(32).astype("float32")

    run = op_compiler(
        lambda x, w, z: (
            rms_norm(x, w, 1e-6, offset=True),
            gated_rms_norm(x, w, z, 1e-6),
            l2_norm(x, scale=0.5),
        ),
        {"x": ([3, "n", 32], "float32"), "w": ([32], "float32"), "z": ([3, "n", 32], "float32")},
    )
    (offset, gated, l2), _ = run(x, w, z)
    rms = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(offset, rms * (1 + w), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gated, rms * w * z / (1 + np.exp(-z)), rtol=1e-5, atol=1e-6)
    l2_ref = x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6) * 0.5
    np.testing.assert_allclose(l2, l2_ref, rtol=1e-5, atol=1e-6)
