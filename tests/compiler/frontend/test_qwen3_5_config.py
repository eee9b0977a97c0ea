"""Config parsing and validation of the Qwen3.5 Dense text config."""

from __future__ import annotations

import copy

import pytest

from ninfer_compiler.frontend.qwen3_5.config import ConfigError, Qwen35TextConfig

ROPE = {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
        "mrope_section": [3, 3, 2], "mrope_interleaved": True}  # fmt: skip
TEXT = dict(
    vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
    num_attention_heads=4, num_key_value_heads=2, head_dim=64, linear_num_key_heads=2,
    linear_num_value_heads=6, linear_key_head_dim=32, linear_value_head_dim=32,
    linear_conv_kernel_dim=4, rope_parameters=ROPE, rms_norm_eps=1e-6,
    layer_types=["linear_attention"] * 3 + ["full_attention"], tie_word_embeddings=False,
    model_type="qwen3_5_text", hidden_act="silu",
)  # fmt: skip


def test_parses_tiny_config():
    cfg = Qwen35TextConfig.from_dict(TEXT)
    assert cfg.rotary_dim == 16
    assert cfg.rope.mrope_section == (3, 3, 2)
    assert cfg.attention_layers == [3] and cfg.gdn_layers == [0, 1, 2]
    assert cfg.conv_channels == 2 * 64 + 192


def test_accepts_hf_config_dict():
    transformers = pytest.importorskip("transformers")
    hf = transformers.Qwen3_5TextConfig(**{k: v for k, v in TEXT.items() if k != "model_type"})
    assert Qwen35TextConfig.from_dict(hf.to_dict()) == Qwen35TextConfig.from_dict(TEXT)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.pop("head_dim"), "missing key 'head_dim'"),
        (lambda d: d.update(hidden_size=64.0), "'hidden_size' must be an integer"),
        (lambda d: d.update(num_key_value_heads=3), "'num_key_value_heads'"),
        (lambda d: d.update(layer_types=["full_attention"]), "'layer_types' has 1 entries"),
        (lambda d: d["layer_types"].__setitem__(0, "moe"), "'layer_types'[0] is 'moe'"),
        (lambda d: d["rope_parameters"].update(mrope_section=[4, 4, 4]), "'mrope_section'"),
        (lambda d: d["rope_parameters"].pop("rope_theta"), "missing key 'rope_theta'"),
        (lambda d: d.update(hidden_act="gelu"), "'hidden_act'"),
        (lambda d: d.update(rms_norm_eps=0), "'rms_norm_eps'"),
        (lambda d: d.update(linear_num_value_heads=5), "'linear_num_value_heads'"),
    ],
)
def test_errors_name_the_key(edit, message):
    d = copy.deepcopy(TEXT)
    edit(d)
    with pytest.raises(ConfigError, match=None) as info:
        Qwen35TextConfig.from_dict(d)
    assert message in str(info.value)
