"""Tiny Hugging Face configurations of the four NInfer architectures (models.md section 9).

The numbers are small enough for CPU tests yet still exercise every path: three GDN/KDA layers
plus one full/indexed layer, MoE, PLE, hyper-connections, a sparse budget (8) below the sequence
length, and a two-block vision tower. Media placeholder ids live inside the 512-row vocabulary.

MTP in transformers 5.23 (what these configs rely on):

* `Qwen3_5ForConditionalGeneration` / `Qwen3_5MoeForConditionalGeneration` never build MTP
  parameters: their modules have no `mtp` attribute whatever the config says, and
  `_keys_to_ignore_on_load_unexpected = [r"^mtp.*"]` makes `from_pretrained` skip the checkpoint's
  `mtp.*` tensors silently.
* The draft head is the separate `transformers.modeling_layers.MtpModel(main_model, n)`. It reads
  `text_config.num_mtp_layers` and `text_config.mtp_layer_types` (neither is a declared field of
  the Qwen3.5 configs; they are stored as extra attributes and survive `config.json`), builds
  `layers.{k}.{enorm, hnorm, eh_proj, mtp_block, post_norm}` with `mtp_block` of the class of the
  target's last decoder layer, and shares the target's embedding, `lm_head` and rotary module.
* `MtpModel.from_pretrained(main_model)` reads the official names from the main checkpoint:
  `mtp.fc` -> `eh_proj`, `mtp.pre_fc_norm_embedding` -> `enorm`, `mtp.pre_fc_norm_hidden` -> `hnorm`,
  `mtp.norm` -> `post_norm`, `mtp.layers.0.*` -> `layers.0.mtp_block.*`. For the MoE model it only
  accepts fused expert banks (`mtp.layers.0.mlp.experts.gate_up_proj` / `.down_proj`); per-expert
  keys are left unexpected because the expert-merging converters are scoped to the main model.
* There is no MTP for qwen4_exp or glm5_next in transformers 5.23 (models.md section 10.2).
"""

from __future__ import annotations

from typing import Any

from transformers import (
    Glm5NextConfig,
    PretrainedConfig,
    Qwen3_5Config,
    Qwen3_5MoeConfig,
    Qwen4ExpConfig,
)

ARCHS: tuple[str, ...] = ("qwen3_5", "qwen3_5_moe", "qwen4_exp", "glm5_next")

VOCAB_SIZE = 512
PAD_TOKEN_ID = 0
EOS_TOKEN_ID = 1

# Media placeholder ids (models.md section 9), shared with the tokenizer.
QWEN_MEDIA_TOKEN_IDS: dict[str, int] = {
    "image_token_id": 500,
    "video_token_id": 501,
    "vision_start_token_id": 502,
    "vision_end_token_id": 503,
}
GLM_MEDIA_TOKEN_IDS: dict[str, int] = {
    "image_token_id": 500,
    "video_token_id": 501,
    "image_start_token_id": 502,
    "image_end_token_id": 503,
    "video_start_token_id": 504,
    "video_end_token_id": 505,
}

# One full-attention MTP layer, as the official Qwen3.5 checkpoints carry.
MTP_TEXT_FIELDS: dict[str, Any] = {"num_mtp_layers": 1, "mtp_layer_types": ["full_attention"]}


def _qwen_text() -> dict[str, Any]:
    """Text fields common to the Qwen family; a fresh dict each call so callers may edit it."""
    rope = {
        "rope_type": "default",
        "rope_theta": 1e7,
        "partial_rotary_factor": 0.25,  # R = 16 -> 8 frequency pairs
        "mrope_section": [3, 3, 2],
        "mrope_interleaved": True,
    }
    return dict(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        linear_num_key_heads=2,
        linear_num_value_heads=6,  # G = 3 like the 27B
        linear_key_head_dim=32,
        linear_value_head_dim=32,
        linear_conv_kernel_dim=4,
        rope_parameters=rope,
        rms_norm_eps=1e-6,
        max_position_embeddings=4096,
        layer_types=["linear_attention"] * 3 + ["full_attention"],
        eos_token_id=EOS_TOKEN_ID,
        pad_token_id=PAD_TOKEN_ID,
    )


def _qwen_vision() -> dict[str, Any]:
    return dict(
        depth=2,
        hidden_size=64,
        intermediate_size=128,
        num_heads=4,
        in_channels=3,
        patch_size=4,
        temporal_patch_size=2,
        spatial_merge_size=2,
        out_hidden_size=64,
        num_position_embeddings=16,  # 4x4 learned table
    )


def _qwen_moe_fields() -> dict[str, Any]:
    return dict(
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
    )


def qwen3_5_config() -> Qwen3_5Config:
    """Dense Qwen3.5 with one MTP layer."""
    text = dict(_qwen_text(), intermediate_size=128, **MTP_TEXT_FIELDS)
    return Qwen3_5Config(text_config=text, vision_config=_qwen_vision(), **QWEN_MEDIA_TOKEN_IDS)


def qwen3_5_moe_config() -> Qwen3_5MoeConfig:
    """Qwen3.5 MoE with one MTP layer (its FFN is the same MoE as the target's)."""
    text = dict(_qwen_text(), **_qwen_moe_fields(), **MTP_TEXT_FIELDS)
    return Qwen3_5MoeConfig(text_config=text, vision_config=_qwen_vision(), **QWEN_MEDIA_TOKEN_IDS)


def qwen4_exp_config() -> Qwen4ExpConfig:
    """Qwen4Exp: hyper-connections, PLE on the (one-based) second layer, QSA on the last."""
    text = dict(
        _qwen_text(),
        **_qwen_moe_fields(),
        hc_count=4,
        hc_lowrank=16,
        ple_layer_ids=[2],
        ple_embed_dim=64,
        ple_conv_kernel_size=4,
        ngram_size=3,
        heads_per_ngram=2,
        ngram_vocab_size_base=1000,  # keeps the n-gram table at 4096 x 16
        make_ngram_vocab_size_divisible_by=128,
        seed=1234,
        split_ngram_parts=1,
        indexer_n_heads=2,
        indexer_kv_heads=1,
        indexer_head_dim=32,  # >= R = 16
        indexer_budget=8,
        indexer_compress_ratio=4,
        output_gate_type="sigmoid",
    )
    return Qwen4ExpConfig(text_config=text, vision_config=_qwen_vision(), **QWEN_MEDIA_TOKEN_IDS)


def glm5_next_config() -> Glm5NextConfig:
    """GLM5Next: KDA x3 + one DSA/MLA layer with key pooling, mHC, dense then MoE FFNs."""
    text = dict(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_shared_experts=1,
        n_routed_experts=8,
        num_experts_per_tok=2,
        routed_scaling_factor=2.5,
        n_group=1,
        topk_group=1,
        norm_topk_prob=True,
        q_lora_rank=32,
        kv_lora_rank=32,
        qk_nope_head_dim=32,
        qk_rope_head_dim=0,
        v_head_dim=32,
        rms_norm_eps=1e-5,
        pad_token_id=PAD_TOKEN_ID,
        eos_token_id=EOS_TOKEN_ID,
        index_topk=8,
        index_head_dim=32,
        index_n_heads=2,
        index_kpool=4,
        index_kpool_always_select_tail=True,
        layer_types=["linear_attention"] * 3 + ["indexed_attention"],
        mlp_layer_types=["dense"] * 3 + ["sparse"],
        indexer_types=["full"] * 4,
        linear_head_dim=32,
        linear_num_heads=2,
        linear_conv_kernel_dim=4,
        linear_lower_bound=-5.0,
        hc_mult=4,
        hc_sinkhorn_iters=20,
        hc_eps=1e-6,
        swiglu_limit=10.0,
    )
    vision = dict(
        depth=2,
        hidden_size=64,
        num_heads=4,
        in_channels=3,
        patch_size=4,
        temporal_patch_size=2,
        spatial_merge_size=2,
        out_hidden_size=64,
        intermediate_size=128,
        projection_intermediate_size=128,
        attention_bias=True,
    )
    return Glm5NextConfig(text_config=text, vision_config=vision, **GLM_MEDIA_TOKEN_IDS)


_BUILDERS = {
    "qwen3_5": qwen3_5_config,
    "qwen3_5_moe": qwen3_5_moe_config,
    "qwen4_exp": qwen4_exp_config,
    "glm5_next": glm5_next_config,
}


def make_config(arch: str) -> PretrainedConfig:
    """The tiny top-level config of `arch` (fp32, eager attention)."""
    if arch not in _BUILDERS:
        raise ValueError(f"unknown test-model architecture {arch!r}; expected one of {ARCHS}")
    config = _BUILDERS[arch]()
    config.dtype = "float32"
    config._attn_implementation = "eager"
    return config


def has_mtp(config: PretrainedConfig) -> bool:
    """Whether the checkpoint of `config` carries an MTP head (`text_config.num_mtp_layers`)."""
    return bool(getattr(config.get_text_config(), "num_mtp_layers", None))
