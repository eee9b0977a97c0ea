"""Qwen3.5 Dense (Qwen3.6/3.8-27B): Hugging Face checkpoint -> artifact plan."""

from __future__ import annotations

from ninfer_compiler.convert.hf_dir import HFModelDir
from ninfer_compiler.convert.plan import ConversionPlan
from ninfer_compiler.convert.qwen_blocks import qwen35_plan


def plan(hf: HFModelDir, recipe: str) -> ConversionPlan:
    return qwen35_plan(
        hf, recipe, family="dense", architecture="Qwen3_5ForCausalLM", model_type="qwen3_5_text",
        vision_type="qwen3_5_vision", mtp_architecture="Qwen3_5MTP", extra_keys=("intermediate_size",),
    )
