"""Qwen3.5 MoE (Qwen3.6-35B-A3B): Hugging Face checkpoint -> artifact plan."""

from __future__ import annotations

from ninfer_compiler.convert.hf_dir import HFModelDir
from ninfer_compiler.convert.plan import ConversionPlan
from ninfer_compiler.convert.qwen_blocks import qwen35_plan

MOE_KEYS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size",
            "norm_topk_prob")


def plan(hf: HFModelDir, recipe: str) -> ConversionPlan:
    return qwen35_plan(
        hf, recipe, family="moe", architecture="Qwen3_5MoeForCausalLM", model_type="qwen3_5_moe_text",
        vision_type="qwen3_5_moe_vision", mtp_architecture="Qwen3_5MoeMTP", extra_keys=MOE_KEYS,
    )
