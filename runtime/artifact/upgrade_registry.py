"""Registered upstream v2 identities: object counts, dimensions and the configs the upgrade writes.

The v2 directory carries no architecture description, so the upgrade knows a file only through
its `(model_id, weights_id)` pair; the values here are those of artifact spec sections 6.1-6.4.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


def _f32(x: float) -> float:
    """Round to binary32 and back, as the upstream upgrade writes float config values."""
    return float(np.float32(x))


@dataclass(frozen=True)
class Identity:
    """A registered v2 `(model_id, weights_id)`: accepted object counts, dimensions and configs."""

    model_id: str
    weights_id: str
    object_counts: tuple[int, ...]
    dims: dict
    text_config: dict
    vision_config: dict
    mtp_architecture: str
    dflash_config: dict | None = None  # companion shipped in the same file (35B-A3B)
    dflash2_config: dict | None = None  # used when any object name starts with "dflash2/"
    binding_counts: dict[str, int] = field(default_factory=dict)  # "base" / "dflash2" -> exact count


def _qwen_text(arch: str, model_type: str, h: int, layers: int, heads: int, kv: int, nv: int, extra: dict) -> dict:
    return {
        "architectures": [arch], "model_type": model_type, "hidden_size": h, "vocab_size": 248320,
        "tie_word_embeddings": False, "num_hidden_layers": layers,
        "layer_types": ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(layers)],
        "max_position_embeddings": 262144, "rms_norm_eps": _f32(1e-6),
        "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": 256,
        "rope_parameters": {"rope_theta": _f32(1e7), "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10]},
        "linear_num_key_heads": 16, "linear_key_head_dim": 128, "linear_num_value_heads": nv,
        "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, **extra,
    }


def _vision(model_type: str) -> dict:
    return {
        "model_type": model_type, "depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16,
        "patch_size": 16, "temporal_patch_size": 2, "spatial_merge_size": 2, "num_position_embeddings": 2304,
    }


def _draft(arch: str, inter: int, layers: int, layer_types: list[str], window: int, dflash: dict) -> dict:
    return {
        "architectures": [arch], "model_type": "qwen3", "intermediate_size": inter, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": layers, "layer_types": layer_types,
        "sliding_window": window, "rms_norm_eps": _f32(1e-6), "rope_parameters": {"rope_theta": _f32(1e7)},
        "max_position_embeddings": 262144, "dflash_config": dflash,
    }


DENSE_27B_DIMS = {"h": 5120, "q": 6144, "k": 1024, "nv": 48, "kg": 2048, "vg": 6144, "inter": 17408,
                  "vision_width": 1152, "draft_q": 4096, "draft_k": 1024}
MOE_35B_DIMS = {"h": 2048, "q": 4096, "k": 512, "nv": 32, "kg": 2048, "vg": 4096, "experts": 256,
                "expert_inter": 512, "shared_inter": 512, "vision_width": 1152, "draft_q": 4096, "draft_k": 1024}
DFLASH2_27B = _draft("DFlash2DraftModel", 17408, 5, ["sliding_attention"] * 5, 2048, {
    "target_layer_ids": [5, 19, 33, 47, 61], "mask_token_id": 248070, "conv_kernel_size": 2,
    "conv_group_size": 16, "selector_rank": 256, "selector_top_k": 16})
DFLASH_35B = _draft("DFlashDraftModel", 6144, 6, ["sliding_attention"] * 5 + ["full_attention"], 4096, {
    "target_layer_ids": [1, 6, 11, 16, 22, 27, 32, 37], "mask_token_id": 248077})


def _dense_27b(model_id: str, weights_id: str, counts: tuple[int, ...]) -> Identity:
    text = _qwen_text("Qwen3_5ForCausalLM", "qwen3_5_text", 5120, 64, 24, 4, 48, {"intermediate_size": 17408})
    return Identity(model_id, weights_id, counts, DENSE_27B_DIMS, text, _vision("qwen3_5_vision"), "Qwen3_5MTP",
                    dflash2_config=DFLASH2_27B, binding_counts={"base": 1422, "dflash2": 1513})


_MOE_EXTRA = {"num_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512}

IDENTITIES: dict[tuple[str, str], Identity] = {
    (i.model_id, i.weights_id): i
    for i in (
        _dense_27b("qwen3.6-27b", "groupwise-int", (1124,)),
        _dense_27b("qwen3.6-27b", "nvfp4", (1307,)),
        _dense_27b("qwen3.8-27b", "groupwise-int", (1124, 1190)),
        _dense_27b("qwen3.8-27b", "nvfp4", (1124, 1190)),
        Identity("qwen3.6-35b-a3b", "groupwise-int", (940,), MOE_35B_DIMS,
                 _qwen_text("Qwen3_5MoeForCausalLM", "qwen3_5_moe_text", 2048, 40, 16, 2, 32, _MOE_EXTRA),
                 _vision("qwen3_5_moe_vision"), "Qwen3_5MoeMTP", dflash_config=DFLASH_35B,
                 binding_counts={"base": 32713}),
    )
}
