"""Qwen3.5 Dense (`qwen3_5`): config, model and HF weight mapping."""
