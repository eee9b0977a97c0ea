"""Map a transformers `Qwen3_5ForCausalLM` state dict onto our parameter names.

Used by tests (and tools) to feed HF weights to the compiled model; the production path
is artifact -> binder. The mapping performs exactly the re-layouts the artifact converter
does: de-interleave `q_proj` into `query` / `gate`, split `in_proj_qkv` into
`query | key | value`, store the depthwise conv kernel tap-major `[K, C]`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..options import WeightPlan
from .config import Qwen35TextConfig


def _np(t: Any) -> np.ndarray:
    """float32 numpy copy of a torch tensor or array."""
    if hasattr(t, "detach"):
        t = t.detach().float().cpu().numpy()
    return np.ascontiguousarray(np.asarray(t, dtype=np.float32))


def hf_to_logical(state_dict: Mapping[str, Any], cfg: Qwen35TextConfig) -> dict[str, np.ndarray]:
    """fp32 tensors keyed by module path + `.weight` (or bare parameter name), logical shapes."""
    sd = {k.removeprefix("model."): v for k, v in state_dict.items()}
    out: dict[str, np.ndarray] = {
        "token_embedding.weight": _np(sd["embed_tokens.weight"]),
        "final_norm.weight": _np(sd["norm.weight"]),
    }
    if not cfg.tie_word_embeddings:
        out["output_head.weight"] = _np(sd["lm_head.weight"])
    d, nq = cfg.head_dim, cfg.num_attention_heads
    key_width = cfg.linear_num_key_heads * cfg.linear_key_head_dim
    for i, kind in enumerate(cfg.layer_types):
        src, dst = f"layers.{i}.", f"layers.{i}."
        out[dst + "input_norm.weight"] = _np(sd[src + "input_layernorm.weight"])
        out[dst + "post_attention_norm.weight"] = _np(sd[src + "post_attention_layernorm.weight"])
        for ours, theirs in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
            out[f"{dst}mlp.{ours}.weight"] = _np(sd[f"{src}mlp.{theirs}.weight"])
        if kind == "full_attention":
            a, s = dst + "attention.", src + "self_attn."
            qg = _np(sd[s + "q_proj.weight"]).reshape(nq, 2, d, -1)
            out[a + "query.weight"] = np.ascontiguousarray(qg[:, 0].reshape(nq * d, -1))
            out[a + "gate.weight"] = np.ascontiguousarray(qg[:, 1].reshape(nq * d, -1))
            out[a + "key.weight"] = _np(sd[s + "k_proj.weight"])
            out[a + "value.weight"] = _np(sd[s + "v_proj.weight"])
            out[a + "query_norm.weight"] = _np(sd[s + "q_norm.weight"])
            out[a + "key_norm.weight"] = _np(sd[s + "k_norm.weight"])
            out[a + "output.weight"] = _np(sd[s + "o_proj.weight"])
        else:
            g, s = dst + "gdn.", src + "linear_attn."
            qkv = _np(sd[s + "in_proj_qkv.weight"])
            out[g + "query.weight"] = qkv[:key_width].copy()
            out[g + "key.weight"] = qkv[key_width : 2 * key_width].copy()
            out[g + "value.weight"] = qkv[2 * key_width :].copy()
            out[g + "z.weight"] = _np(sd[s + "in_proj_z.weight"])
            out[g + "a_projection.weight"] = _np(sd[s + "in_proj_a.weight"])
            out[g + "b_projection.weight"] = _np(sd[s + "in_proj_b.weight"])
            out[g + "a_log"] = _np(sd[s + "A_log"])
            out[g + "dt_bias"] = _np(sd[s + "dt_bias"])
            out[g + "convolution"] = np.ascontiguousarray(_np(sd[s + "conv1d.weight"])[:, 0, :].T)
            out[g + "norm.weight"] = _np(sd[s + "norm.weight"])
            out[g + "output.weight"] = _np(sd[s + "out_proj.weight"])
    return out


def encode_params(
    logical: Mapping[str, np.ndarray], param_dtypes: Mapping[str, str], plan: WeightPlan
) -> dict[str, np.ndarray]:
    """Encode fp32 logical tensors into the stored form of each model parameter.

    `param_dtypes` maps the model's parameter names to their dtypes (`CompiledModel.param_dtypes`
    or `named_parameters()`). Dense parameters are cast (bf16 via `ml_dtypes`); grouped-int
    modules (`<path>.base` present) are encoded with the artifact's reference encoder into
    their `base` / `high` / `scales` planes, in the format `plan` gives the module.
    """
    import ml_dtypes

    np_dtypes = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
    out: dict[str, np.ndarray] = {}
    for name, value in logical.items():
        module = name.removesuffix(".weight")
        if name in param_dtypes:
            out[name] = value.astype(np_dtypes[param_dtypes[name]])
        elif f"{module}.base" in param_dtypes:
            from ...ops.row_split import encode_row_split

            for plane, array in encode_row_split(value, plan.format_of(module)).items():
                if f"{module}.{plane}" in param_dtypes:
                    out[f"{module}.{plane}"] = array
        else:
            raise KeyError(f"HF tensor {name!r} has no parameter in the model")
    missing = set(param_dtypes) - set(out)
    if missing:
        raise KeyError(f"model parameters without HF tensors: {sorted(missing)}")
    return out
