"""Conversion of the blocks the Qwen family shares (models.md sections 1, 6.1, 7.1 and 8.2).

Each function maps the Hugging Face tensors of one block to stored objects holding the logical
parameters of the upstream binding names, with the parent packing of the official recipes:
dense groupwise stores attention as Q4 `[query; key]` + Q5 `[gate; value]` and GDN as
`[query; key]` + `[value; z]`; the other recipes store one parent each.
"""

from __future__ import annotations

import numpy as np

from .errors import ConversionError
from .hf_dir import HFModelDir
from .plan import ComponentSpec, ObjectSpec, ParamSpec, Sources, whole


def split_packing(family: str, recipe: str) -> bool:
    """Dense groupwise keeps two attention/GDN parents (4-bit and 5-bit halves)."""
    return family == "dense" and recipe == "groupwise-int"


def _param(name: str, shape: tuple[int, ...], load, consumes, inputs=()) -> ParamSpec:
    return ParamSpec(name, tuple(int(d) for d in shape), load, tuple(consumes), tuple(inputs))


def _row_block(source: str, begin: int, end: int):
    """A loader of rows [begin, end); a function so each loader keeps its own source name."""
    return lambda s: s[source][begin:end]


def _expert_slice(source: str, expert: int, rows: slice):
    """A loader of one expert's rows of a fused `[E, rows, cols]` bank."""
    return lambda s: s[source][expert, rows]


def norm(obj_id: str, source: str, src: Sources, name: str | None = None, kind: str = "weight") -> ObjectSpec:
    """A whole-tensor parameter that the recipes keep in bf16 (norms, biases, tables)."""
    shape = src.shape(source)
    return ObjectSpec(obj_id, "plain", [_param(name or obj_id, shape, whole(source), [(source, "all")])], kind=kind)


def projection(name: str, source: str, src: Sources, role: str, inputs: tuple[str, ...], layer: int | None) -> ObjectSpec:
    return ObjectSpec(name, role, [_param(name, src.shape(source), whole(source), [(source, "all")], inputs)], layer)


# -- attention -----------------------------------------------------------------------------------


def gated_attention(hf_prefix: str, prefix: str, layer: int | None, cfg: dict, src: Sources, split: bool,
                    role_override: str | None = None) -> list[ObjectSpec]:
    """Gated full attention: q_proj rows are [query_h; gate_h] per head; de-interleave them."""
    heads, kv_heads, head_dim = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    hidden = cfg["hidden_size"]
    q_src, k_src, v_src = (f"{hf_prefix}self_attn.{n}_proj.weight" for n in "qkv")
    for name, rows in ((q_src, heads * 2 * head_dim), (k_src, kv_heads * head_dim), (v_src, kv_heads * head_dim)):
        if src.shape(name) != (rows, hidden):
            raise ConversionError(f"tensor {name!r} has shape {list(src.shape(name))}, expected [{rows}, {hidden}]")

    def half(which: int):
        def load(s: Sources) -> np.ndarray:
            q = s[q_src].reshape(heads, 2, head_dim, hidden)
            return q[:, which].reshape(heads * head_dim, hidden)

        return load

    site = (f"{prefix}mixer_input",)
    query = _param(f"{prefix}attention/query", (heads * head_dim, hidden), half(0), [(q_src, "query")], site)
    gate = _param(f"{prefix}attention/gate", (heads * head_dim, hidden), half(1), [(q_src, "gate")], site)
    key = _param(f"{prefix}attention/key", src.shape(k_src), whole(k_src), [(k_src, "all")], site)
    value = _param(f"{prefix}attention/value", src.shape(v_src), whole(v_src), [(v_src, "all")], site)
    out: list[ObjectSpec] = []
    if split:
        out += [ObjectSpec(f"{prefix}attention/query_key", role_override or "attention.query_key", [query, key], layer),
                ObjectSpec(f"{prefix}attention/gate_value", role_override or "attention.gate_value", [gate, value], layer)]
    else:
        out.append(ObjectSpec(f"{prefix}attention/query_key_gate_value", role_override or "attention.query_key_gate_value",
                              [query, key, gate, value], layer))
    out.append(norm(f"{prefix}attention/query_norm", f"{hf_prefix}self_attn.q_norm.weight", src))
    out.append(norm(f"{prefix}attention/key_norm", f"{hf_prefix}self_attn.k_norm.weight", src))
    out.append(projection(f"{prefix}attention/output", f"{hf_prefix}self_attn.o_proj.weight", src,
                          role_override or "attention.output", (f"{prefix}attention/gated_output",), layer))
    return out


# -- gated delta net -------------------------------------------------------------------------------


def gated_delta_net(hf_prefix: str, prefix: str, layer: int, cfg: dict, src: Sources, split: bool) -> list[ObjectSpec]:
    """GDN: in_proj_qkv rows are q | k | v; conv1d [C, 1, K] is stored tap-major [K, C]."""
    hk, dk = cfg["linear_num_key_heads"], cfg["linear_key_head_dim"]
    hv, dv = cfg["linear_num_value_heads"], cfg["linear_value_head_dim"]
    hidden = cfg["hidden_size"]
    a = f"{hf_prefix}linear_attn."
    qkv = a + "in_proj_qkv.weight"
    kd, vd = hk * dk, hv * dv
    if src.shape(qkv) != (2 * kd + vd, hidden):
        raise ConversionError(f"tensor {qkv!r} has shape {list(src.shape(qkv))}, expected [{2 * kd + vd}, {hidden}]")
    site = (f"{prefix}mixer_input",)

    q = _param(f"{prefix}gdn/query", (kd, hidden), _row_block(qkv, 0, kd), [(qkv, "query")], site)
    k = _param(f"{prefix}gdn/key", (kd, hidden), _row_block(qkv, kd, 2 * kd), [(qkv, "key")], site)
    v = _param(f"{prefix}gdn/value", (vd, hidden), _row_block(qkv, 2 * kd, 2 * kd + vd), [(qkv, "value")], site)
    z_src = a + "in_proj_z.weight"
    z = _param(f"{prefix}gdn/z", src.shape(z_src), whole(z_src), [(z_src, "all")], site)
    if split:
        out = [ObjectSpec(f"{prefix}gdn/query_key", "gdn.query_key", [q, k], layer),
               ObjectSpec(f"{prefix}gdn/value_z", "gdn.value_z", [v, z], layer)]
    else:
        out = [ObjectSpec(f"{prefix}gdn/query_key_value_z", "gdn.query_key_value_z", [q, k, v, z], layer)]
    a_src, b_src = a + "in_proj_a.weight", a + "in_proj_b.weight"
    out.append(ObjectSpec(f"{prefix}gdn/a_b_projection", "gdn.a_b", [
        _param(f"{prefix}gdn/a_projection", src.shape(a_src), whole(a_src), [(a_src, "all")], site),
        _param(f"{prefix}gdn/b_projection", src.shape(b_src), whole(b_src), [(b_src, "all")], site)], layer))
    out.append(norm(f"{prefix}gdn/a_log", a + "A_log", src, kind="fp32"))
    out.append(norm(f"{prefix}gdn/dt_bias", a + "dt_bias", src, kind="fp32"))
    out.append(norm(f"{prefix}gdn/norm", a + "norm.weight", src))
    conv = a + "conv1d.weight"
    channels, _, taps = src.shape(conv)
    out.append(ObjectSpec(f"{prefix}gdn/convolution", "plain", [_param(
        f"{prefix}gdn/convolution", (taps, channels),
        lambda s: np.ascontiguousarray(s[conv].reshape(channels, taps).T), [(conv, "all")])]))
    out.append(projection(f"{prefix}gdn/output", a + "out_proj.weight", src, "gdn.output",
                          (f"{prefix}gdn/gated_output",), layer))
    return out


# -- feed-forward ------------------------------------------------------------------------------------


def dense_mlp(hf_prefix: str, prefix: str, layer: int | None, src: Sources, role_override: str | None = None) -> list[ObjectSpec]:
    m = f"{hf_prefix}mlp."
    site = (f"{prefix}ffn_input",)
    gate = _param(f"{prefix}mlp/gate", src.shape(m + "gate_proj.weight"), whole(m + "gate_proj.weight"),
                  [(m + "gate_proj.weight", "all")], site)
    up = _param(f"{prefix}mlp/up", src.shape(m + "up_proj.weight"), whole(m + "up_proj.weight"),
                [(m + "up_proj.weight", "all")], site)
    return [
        ObjectSpec(f"{prefix}mlp/gate_up", role_override or "mlp.gate_up", [gate, up], layer),
        projection(f"{prefix}mlp/down", m + "down_proj.weight", src, role_override or "mlp.down",
                   (f"{prefix}mlp/product",), layer),
    ]


def sparse_moe(hf_prefix: str, prefix: str, layer: int | None, cfg: dict, src: Sources,
               role_override: str | None = None) -> list[ObjectSpec]:
    """Router + shared-expert gate, expert-major banks `[gate_e; up_e]` and `[down_e]`, shared expert."""
    m = f"{hf_prefix}mlp."
    experts, inter, hidden = cfg["num_experts"], cfg["moe_intermediate_size"], cfg["hidden_size"]
    site = (f"{prefix}ffn_input",)
    router, score = m + "gate.weight", m + "shared_expert_gate.weight"
    out = [ObjectSpec(f"{prefix}moe/router_shared_score", "moe.router", [
        _param(f"{prefix}moe/router", src.shape(router), whole(router), [(router, "all")], site),
        _param(f"{prefix}moe/shared_score", src.shape(score), whole(score), [(score, "all")], site)], layer)]
    fused_gate_up, fused_down = m + "experts.gate_up_proj", m + "experts.down_proj"
    gate_up_params, down_params = [], []
    fused = fused_gate_up in src.checkpoint.tensors
    if fused and src.shape(fused_gate_up) != (experts, 2 * inter, hidden):
        raise ConversionError(f"tensor {fused_gate_up!r} has shape {list(src.shape(fused_gate_up))}, "
                              f"expected [{experts}, {2 * inter}, {hidden}]")
    for e in range(experts):
        base = f"{prefix}moe/experts/{e}/"
        if fused:
            gate_load = _expert_slice(fused_gate_up, e, slice(0, inter))
            up_load = _expert_slice(fused_gate_up, e, slice(inter, 2 * inter))
            down_load = _expert_slice(fused_down, e, slice(None))
            gate_c, up_c, down_c = [(fused_gate_up, f"e{e}.gate")], [(fused_gate_up, f"e{e}.up")], [(fused_down, f"e{e}")]
        else:
            names = [f"{m}experts.{e}.{p}_proj.weight" for p in ("gate", "up", "down")]
            gate_load, up_load, down_load = (whole(n) for n in names)
            gate_c, up_c, down_c = ([(n, "all")] for n in names)
        gate_up_params += [_param(base + "gate", (inter, hidden), gate_load, gate_c, site),
                           _param(base + "up", (inter, hidden), up_load, up_c, site)]
        down_params.append(_param(base + "down", (hidden, inter), down_load, down_c, (f"{base}product",)))
    out.append(ObjectSpec(f"{prefix}moe/experts/gate_up", role_override or "moe.experts.gate_up", gate_up_params, layer))
    out.append(ObjectSpec(f"{prefix}moe/experts/down", role_override or "moe.experts.down", down_params, layer))
    s = m + "shared_expert."
    out.append(ObjectSpec(f"{prefix}moe/shared/gate_up", role_override or "moe.shared", [
        _param(f"{prefix}moe/shared/gate", src.shape(s + "gate_proj.weight"), whole(s + "gate_proj.weight"),
               [(s + "gate_proj.weight", "all")], site),
        _param(f"{prefix}moe/shared/up", src.shape(s + "up_proj.weight"), whole(s + "up_proj.weight"),
               [(s + "up_proj.weight", "all")], site)], layer))
    out.append(projection(f"{prefix}moe/shared/down", s + "down_proj.weight", src, role_override or "moe.shared",
                          (f"{prefix}moe/shared/product",), layer))
    return out


# -- vision tower --------------------------------------------------------------------------------------

VISION_KEYS = ("depth", "hidden_size", "intermediate_size", "num_heads", "in_channels", "patch_size",
               "temporal_patch_size", "spatial_merge_size", "num_position_embeddings")
MEDIA_KEYS = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")


def qwen_vision(hf: HFModelDir, src: Sources, model_type: str) -> tuple[ComponentSpec, list[ObjectSpec]]:
    cfg = hf.vision_config
    assert cfg is not None
    v = "model.visual."
    width = cfg["hidden_size"]
    patch = v + "patch_embed.proj.weight"
    pshape = src.shape(patch)
    objs = [
        ObjectSpec("vision/patch_embedding", "vision.patch", [_param(
            "vision/patch_embedding", (pshape[0], int(np.prod(pshape[1:]))), whole(patch, (pshape[0], -1)),
            [(patch, "all")], ("vision/patch_input",))]),
        norm("vision/patch_embedding_bias", v + "patch_embed.proj.bias", src),
        norm("vision/position_embedding", v + "pos_embed.weight", src),
    ]
    for b in range(cfg["depth"]):
        hp, p = f"{v}blocks.{b}.", f"vision/layers/{b}/"
        for n in ("norm1", "norm2"):
            objs += [norm(f"{p}{n}_weight", f"{hp}{n}.weight", src), norm(f"{p}{n}_bias", f"{hp}{n}.bias", src)]
        qkv, qkv_b = hp + "attn.qkv.weight", hp + "attn.qkv.bias"
        site = (f"{p}attention_input",)
        objs.append(ObjectSpec(f"{p}attention/qkv", "vision.qkv", [
            _param(f"{p}attention/{n}", (width, width), _row_block(qkv, i * width, (i + 1) * width), [(qkv, n)], site)
            for i, n in enumerate(("query", "key", "value"))]))
        objs.append(ObjectSpec(f"{p}attention/qkv_bias", "plain", [
            _param(f"{p}attention/{n}_bias", (width,), _row_block(qkv_b, i * width, (i + 1) * width), [(qkv_b, n)])
            for i, n in enumerate(("query", "key", "value"))]))
        objs.append(projection(f"{p}attention/output", hp + "attn.proj.weight", src, "vision.output", (f"{p}attention_output",), None))
        objs.append(norm(f"{p}attention/output_bias", hp + "attn.proj.bias", src))
        objs.append(projection(f"{p}mlp/fc1", hp + "mlp.linear_fc1.weight", src, "vision.fc1", (f"{p}mlp_input",), None))
        objs.append(norm(f"{p}mlp/fc1_bias", hp + "mlp.linear_fc1.bias", src))
        objs.append(projection(f"{p}mlp/fc2", hp + "mlp.linear_fc2.weight", src, "vision.fc2", (f"{p}mlp_activation",), None))
        objs.append(norm(f"{p}mlp/fc2_bias", hp + "mlp.linear_fc2.bias", src))
    mg = v + "merger."
    objs += [norm("vision/merger/norm_weight", mg + "norm.weight", src), norm("vision/merger/norm_bias", mg + "norm.bias", src),
             projection("vision/merger/fc1", mg + "linear_fc1.weight", src, "vision.merger", ("vision/merger/input",), None),
             norm("vision/merger/fc1_bias", mg + "linear_fc1.bias", src),
             projection("vision/merger/fc2", mg + "linear_fc2.weight", src, "vision.merger", ("vision/merger/activation",), None),
             norm("vision/merger/fc2_bias", mg + "linear_fc2.bias", src)]
    config = {"model_type": model_type, **{k: cfg[k] for k in VISION_KEYS if k in cfg}}
    config.update({k: hf.config[k] for k in MEDIA_KEYS if k in hf.config})
    return ComponentSpec("vision", config, target="text", resources=dict(hf.vision_resources)), objs


# -- text config ------------------------------------------------------------------------------------------

TEXT_KEYS = ("hidden_size", "vocab_size", "tie_word_embeddings", "num_hidden_layers", "layer_types",
             "max_position_embeddings", "rms_norm_eps", "num_attention_heads", "num_key_value_heads", "head_dim",
             "linear_num_key_heads", "linear_key_head_dim", "linear_num_value_heads", "linear_value_head_dim",
             "linear_conv_kernel_dim", "hidden_act")


def qwen_text_config(text_cfg: dict, architecture: str, model_type: str, extra_keys: tuple[str, ...]) -> dict:
    out = {"architectures": [architecture], "model_type": model_type}
    for key in TEXT_KEYS + extra_keys:
        if key in text_cfg:
            out[key] = text_cfg[key]
    rope = text_cfg.get("rope_parameters") or {}
    out["rope_parameters"] = {k: rope[k] for k in ("rope_theta", "partial_rotary_factor", "mrope_section") if k in rope}
    if "layer_types" not in out:
        raise ConversionError("the text config has no layer_types")
    return out


def mtp_prefix(src: Sources) -> str | None:
    """Where the checkpoint keeps the MTP head (`mtp.` in the official checkpoints), if anywhere."""
    for prefix in ("mtp.", "model.mtp."):
        if any(n.startswith(prefix) for n in src.checkpoint.tensors):
            return prefix
    return None


# -- whole model ------------------------------------------------------------------------------------------


def text_prefix(src: Sources) -> str:
    """`model.language_model.` in multimodal checkpoints, `model.` in text-only ones."""
    if "model.language_model.embed_tokens.weight" in src.checkpoint.tensors:
        return "model.language_model."
    if "model.embed_tokens.weight" in src.checkpoint.tensors:
        return "model."
    raise ConversionError(f"{src.checkpoint.directory}: missing tensor 'model.language_model.embed_tokens.weight'")


def qwen35_plan(hf: HFModelDir, recipe: str, *, family: str, architecture: str, model_type: str,
                vision_type: str, mtp_architecture: str, extra_keys: tuple[str, ...]):
    """Plan for Qwen3.5 Dense (`family="dense"`) and Qwen3.5 MoE (`family="moe"`)."""
    from .plan import ConversionPlan

    src = Sources(hf.checkpoint)
    cfg = hf.text_config
    for key in ("hidden_size", "num_hidden_layers", "layer_types", "vocab_size"):
        if key not in cfg:
            raise ConversionError(f"{hf.path / 'config.json'}: text config lacks {key!r}")
    layer_types = cfg["layer_types"]
    if len(layer_types) != cfg["num_hidden_layers"]:
        raise ConversionError(f"{hf.path / 'config.json'}: layer_types has {len(layer_types)} entries for "
                              f"{cfg['num_hidden_layers']} layers")
    split = split_packing(family, recipe)
    tp = text_prefix(src)
    mtp = mtp_prefix(src)
    backends = ["mtp"] if mtp else []
    objs: list[ObjectSpec] = [
        projection("text/token_embedding", tp + "embed_tokens.weight", src, "embedding", (), None),
        norm("text/final_norm", tp + "norm.weight", src),
    ]
    head = "lm_head.weight"
    if head in src.checkpoint.tensors:
        objs.insert(1, projection("text/output_head", head, src, "output_head",
                                  ("text/final_hidden", *(f"{b}/final_hidden" for b in backends)), None))
    elif cfg.get("tie_word_embeddings"):
        objs[0].aliases.append("text/output_head")
    else:
        raise ConversionError(f"{hf.path}: missing tensor 'lm_head.weight' (and tie_word_embeddings is false)")

    def ffn(hp: str, p: str, layer: int | None, role: str | None = None) -> list[ObjectSpec]:
        if family == "moe":
            return sparse_moe(hp, p, layer, cfg, src, role)
        return dense_mlp(hp, p, layer, src, role)

    for i, kind in enumerate(layer_types):
        hp, p = f"{tp}layers.{i}.", f"text/layers/{i}/"
        objs += [norm(f"{p}input_norm", hp + "input_layernorm.weight", src),
                 norm(f"{p}post_attention_norm", hp + "post_attention_layernorm.weight", src)]
        if kind == "full_attention":
            objs += gated_attention(hp, p, i, cfg, src, split)
        elif kind == "linear_attention":
            objs += gated_delta_net(hp, p, i, cfg, src, split)
        else:
            raise ConversionError(f"{hf.path / 'config.json'}: layer {i} has unknown layer type {kind!r}")
        objs += ffn(hp, p, i)
    components = [ComponentSpec("text", qwen_text_config(cfg, architecture, model_type, extra_keys),
                                resources=dict(hf.text_resources))]
    if hf.vision_config is not None:
        vision, vision_objs = qwen_vision(hf, src, vision_type)
        components.append(vision)
        objs += vision_objs
    if mtp:
        objs += [
            projection("mtp/input_projection", mtp + "fc.weight", src, "mtp.projection", ("mtp/stem_input",), None),
            norm("mtp/embedding_norm", mtp + "pre_fc_norm_embedding.weight", src),
            norm("mtp/hidden_norm", mtp + "pre_fc_norm_hidden.weight", src),
            norm("mtp/final_norm", mtp + "norm.weight", src),
        ]
        hp, p = f"{mtp}layers.0.", "mtp/layers/0/"
        objs += [norm(f"{p}input_norm", hp + "input_layernorm.weight", src),
                 norm(f"{p}post_attention_norm", hp + "post_attention_layernorm.weight", src)]
        objs += gated_attention(hp, p, None, cfg, src, split=False, role_override="mtp.projection")
        objs += ffn(hp, p, None, "mtp.projection")
        components.append(ComponentSpec("mtp", {"architectures": [mtp_architecture]}, target="text"))
        layers = [n for n in src.checkpoint.tensors if n.startswith(mtp + "layers.") and not n.startswith(hp)]
        if layers:
            raise ConversionError(f"{hf.path}: only one MTP layer is supported, found {layers[0]!r}")
    return ConversionPlan(architecture=hf.model_type, components=components, objects=objs)
