"""GLM5Next (GLM-5.3-Flash): Hugging Face checkpoint -> artifact plan.

No upstream artifact contract exists for GLM5Next (models.md 8.5, 10.1), so the binding names are
defined here, in the style of the Qwen names (models.md 8.2); docs/convert.md ("GLM5Next binding
names") carries the same list. Shapes are logical `[out, in]`; `P = text/layers/{i}/`, H hidden,
n = hc_mult streams, Hl x dl KDA heads, Nh MLA heads, r_q / r_kv the MLA latent ranks, n_i x D_i
indexer heads, E routed experts. Unless marked, a parameter is HF's tensor unchanged.

Globals: `text/token_embedding [V, H]`, `text/output_head [V, H]` (alias of the embedding when
tied), `text/final_norm [H]`.

Per layer:

* `P input_norm`, `P post_attention_norm` `[H]`;
* mHC `P hyper_connection/{attention,ffn}/fn [(2+n)n, nH]` (bf16 per recipe), `…/base [(2+n)n]`,
  `…/scale [3]` (both fp32; HF `hc_attn_*` / `hc_ffn_*`);
* KDA layers: `P kda/{query,key,value} [Hl·dl, H]` (one parent `[query; key; value]`),
  `P kda/convolution [K, 3·Hl·dl]` tap-major, columns q|k|v (the transposed concatenation of HF
  `q_conv1d`, `k_conv1d`, `v_conv1d` `[Hl·dl, 1, K]`, or of a fused `conv1d [3·Hl·dl, 1, K]`),
  `P kda/forget_a [dl, H]`, `P kda/forget_b [Hl·dl, dl]`, `P kda/dt_bias [Hl·dl]` and
  `P kda/a_log [Hl]` (fp32), `P kda/beta [Hl, H]` (HF `b_proj`), `P kda/output_gate_a [dl, H]`,
  `P kda/output_gate_b [Hl·dl, dl]`, `P kda/output_norm [dl]`, `P kda/output [H, Hl·dl]`;
* MLA layers: `P mla/query_a [r_q, H]` and `P mla/kv_a [r_kv, H]` (one parent `[query_a; kv_a]`;
  HF `kv_a_proj_with_mqa`, no RoPE rows since qk_rope_head_dim = 0), `P mla/query_a_norm [r_q]`,
  `P mla/kv_a_norm [r_kv]`, `P mla/query_b [Nh·d_nope, r_q]`, `P mla/kv_b [Nh·(d_nope+d_v), r_kv]`
  (HF row order: per head d_nope key rows then d_v value rows), `P mla/output [H, Nh·d_v]`;
  DSA indexer `P mla/indexer/query_b [n_i·D_i, r_q]` (HF `wq_b`), `…/key [D_i, H]` (`wk`),
  `…/key_norm_weight`, `…/key_norm_bias [D_i]` (`k_norm`, a LayerNorm), `…/weights [n_i, H]`
  (`weights_proj`), `…/pool_ape [P, D_i]` (`index_kpool_compress_ape`), `…/pool_gate [D_i, H]`
  (`index_kpool_compress_gate`);
* dense FFN `P mlp/{gate,up} [I, H]` (one parent `[gate; up]`), `P mlp/down [H, I]`;
* MoE `P moe/router [E, H]`, `P moe/router_bias [E]` (fp32; the `e_score_correction_bias`
  buffer), `P moe/experts/{e}/{gate,up} [Ie, H]` / `…/down [H, Ie]` (expert-major banks
  `[gate_e; up_e]` and `[down_e]`), `P moe/shared/{gate,up} [Is, H]` / `…/down [H, Is]`
  (HF `shared_experts`, no shared gate).

MTP (only when the checkpoint carries the NextN layer `layers.{num_hidden_layers}.*`, models.md
7.1; transformers 5.23 has none): `mtp/input_projection [H, 2H]` (`eh_proj`, columns
[embedding, hidden]), `mtp/embedding_norm`, `mtp/hidden_norm`, `mtp/final_norm` (`enorm`,
`hnorm`, `shared_head.norm`) and `mtp/layers/0/*` with the MLA/indexer/MoE names above (no mHC).

Vision (`vision/`, `B = vision/layers/{b}/`, width W, m = spatial_merge_size):
`vision/patch_embedding [W, C·T·p·p]` (Conv3d weight reshaped; the pixel row is channel-major
`[C][T][p][p]`) and `…_bias`; `B norm1_weight`, `B norm2_weight`; `B attention/{query,key,value}
[W, W]` and `…_bias` (row blocks of HF `qkv`); `B attention/query_norm`, `key_norm [W/heads]`;
`B attention/output`, `output_bias`; `B mlp/{gate,up}` (one parent), `…/gate_bias`, `…/up_bias`,
`B mlp/down`, `down_bias`; `vision/post_norm [W]`; `vision/downsample [O, m·m·W]`, the Conv2d
weight `[O, W, m, m]` permuted to `[O, m, m, W]`, so it multiplies the m·m patches of a merge block
concatenated in (row-in-block, col-in-block) order, and `vision/downsample_bias [O]`;
`vision/merger/projection [O, O]`, `vision/merger/norm_weight`, `norm_bias` (the
post-projection LayerNorm), `vision/merger/{gate,up} [Ip, O]` (one parent), `vision/merger/down
[O, Ip]` (merger biases, absent in HF, are bound as `…_bias` if a checkpoint has them).

Uses (input positions): `P mixer_input` (KDA q/k/v, forget_a, beta, output_gate_a; MLA query_a,
kv_a; indexer key, weights, pool_gate), `P kda/forget_low_rank` (forget_b),
`P kda/output_gate_low_rank` (output_gate_b), `P kda/gated_output` (kda/output),
`P mla/query_latent` (query_b, indexer query_b), `P mla/kv_latent` (kv_b),
`P mla/attention_output` (mla/output), `P hyper_connection/{attention,ffn}/normalized_state` (fn),
`P ffn_input` (mlp gate/up, router, expert and shared gate/up), `P mlp/product`,
`P moe/experts/{e}/product`, `P moe/shared/product`, `text/final_hidden` (and `mtp/final_hidden`)
for the head, `mtp/stem_input`; vision `vision/patch_input`, `B attention_input`,
`B attention_output`, `B mlp_input`, `B mlp_activation`, `vision/downsample_input`,
`vision/merger/input`, `vision/merger/activation`, `vision/merger/product`.
"""

from __future__ import annotations

import numpy as np

from ninfer_compiler.convert.errors import ConversionError
from ninfer_compiler.convert.hf_dir import HFModelDir
from ninfer_compiler.convert.plan import (
    ComponentSpec,
    ConversionPlan,
    ObjectSpec,
    ParamSpec,
    Sources,
    rows,
    whole,
)
from ninfer_compiler.convert.qwen_blocks import dense_mlp, norm, projection, text_prefix

FAMILY = "glm"  # recipe tables ("glm", recipe) in recipes.py

TEXT_KEYS = (
    "hidden_size", "vocab_size", "tie_word_embeddings", "num_hidden_layers", "layer_types", "mlp_layer_types",
    "indexer_types", "max_position_embeddings", "rms_norm_eps", "hidden_act", "eos_token_id", "pad_token_id",
    "num_attention_heads", "num_key_value_heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
    "qk_rope_head_dim", "v_head_dim", "intermediate_size", "moe_intermediate_size", "n_routed_experts",
    "n_shared_experts", "num_experts_per_tok", "routed_scaling_factor", "n_group", "topk_group", "norm_topk_prob",
    "index_topk", "index_head_dim", "index_n_heads", "index_kpool", "index_kpool_always_select_tail",
    "linear_head_dim", "linear_num_heads", "linear_conv_kernel_dim", "linear_lower_bound",
    "hc_mult", "hc_sinkhorn_iters", "hc_eps", "swiglu_limit",
)
VISION_KEYS = ("depth", "hidden_size", "intermediate_size", "num_heads", "in_channels", "patch_size",
               "temporal_patch_size", "spatial_merge_size", "out_hidden_size", "projection_intermediate_size",
               "rms_norm_eps", "swiglu_limit", "hidden_act", "attention_bias", "rope_parameters")
MEDIA_KEYS = ("image_token_id", "video_token_id", "image_start_token_id", "image_end_token_id",
              "video_start_token_id", "video_end_token_id")

KDA, MLA = "linear_attention", "indexed_attention"
MLA_SPELLINGS = {"indexed_attention", "deepseek_sparse_attention"}


def _param(name: str, shape, load, consumes, inputs=()) -> ParamSpec:
    return ParamSpec(name, tuple(int(d) for d in shape), load, tuple(consumes), tuple(inputs))


def _whole(name: str, source: str, src: Sources, inputs=()) -> ParamSpec:
    return _param(name, src.shape(source), whole(source), [(source, "all")], inputs)


def _expect(src: Sources, name: str, shape: tuple[int, ...]) -> None:
    if src.shape(name) != tuple(shape):
        raise ConversionError(f"tensor {name!r} has shape {list(src.shape(name))}, expected {list(shape)}")


def _has(src: Sources, name: str) -> bool:
    return name in src.checkpoint.tensors


# -- text blocks ----------------------------------------------------------------------------------


def hyper_connections(hp: str, p: str, cfg: dict, src: Sources) -> list[ObjectSpec]:
    n, hidden = cfg["hc_mult"], cfg["hidden_size"]
    objs = []
    for site, hf in (("attention", "attn"), ("ffn", "ffn")):
        q = f"{p}hyper_connection/{site}/"
        _expect(src, f"{hp}hc_{hf}_fn", ((2 + n) * n, n * hidden))
        _expect(src, f"{hp}hc_{hf}_base", ((2 + n) * n,))
        _expect(src, f"{hp}hc_{hf}_scale", (3,))
        objs += [projection(q + "fn", f"{hp}hc_{hf}_fn", src, "hyper_connection", (q + "normalized_state",), None),
                 norm(q + "base", f"{hp}hc_{hf}_base", src, kind="fp32"),
                 norm(q + "scale", f"{hp}hc_{hf}_scale", src, kind="fp32")]
    return objs


def kda(hp: str, p: str, layer: int, cfg: dict, src: Sources) -> list[ObjectSpec]:
    """Kimi delta attention (models.md 5.3)."""
    a, q = hp + "self_attn.", p + "kda/"
    heads, dim, hidden = cfg["linear_num_heads"], cfg["linear_head_dim"], cfg["hidden_size"]
    width = heads * dim
    site = (f"{p}mixer_input",)
    for n in ("q", "k", "v"):
        _expect(src, f"{a}{n}_proj.weight", (width, hidden))
    objs = [ObjectSpec(q + "query_key_value", "kda.query_key_value", [
        _whole(q + name, f"{a}{n}_proj.weight", src, site) for name, n in (("query", "q"), ("key", "k"), ("value", "v"))
    ], layer)]
    if _has(src, a + "conv1d.weight"):  # already fused (HF's runtime layout)
        convs = [a + "conv1d.weight"]
    else:
        convs = [f"{a}{n}_conv1d.weight" for n in "qkv"]
    taps = src.shape(convs[0])[-1]
    for c in convs:
        if len(src.shape(c)) != 3 or src.shape(c)[1:] != (1, taps):
            raise ConversionError(f"tensor {c!r} has shape {list(src.shape(c))}, expected [channels, 1, {taps}]")
    channels = sum(src.shape(c)[0] for c in convs)
    if channels != 3 * width:
        raise ConversionError(f"KDA convolution of layer {layer} has {channels} channels, expected {3 * width}")

    def conv_load(s: Sources) -> np.ndarray:
        stacked = np.concatenate([s[c].reshape(-1, taps) for c in convs], axis=0)
        return np.ascontiguousarray(stacked.T)

    objs.append(ObjectSpec(q + "convolution", "plain", [_param(q + "convolution", (taps, channels), conv_load,
                                                                [(c, "all") for c in convs])]))
    _expect(src, a + "f_a_proj.weight", (dim, hidden))
    _expect(src, a + "f_b_proj.weight", (width, dim))
    _expect(src, a + "g_a_proj.weight", (dim, hidden))
    _expect(src, a + "g_b_proj.weight", (width, dim))
    _expect(src, a + "b_proj.weight", (heads, hidden))
    _expect(src, a + "A_log", (heads,))
    _expect(src, a + "dt_bias", (width,))
    objs += [
        projection(q + "forget_a", a + "f_a_proj.weight", src, "kda.gate", site, layer),
        projection(q + "forget_b", a + "f_b_proj.weight", src, "kda.gate", (q + "forget_low_rank",), layer),
        norm(q + "dt_bias", a + "dt_bias", src, kind="fp32"),
        norm(q + "a_log", a + "A_log", src, kind="fp32"),
        projection(q + "beta", a + "b_proj.weight", src, "kda.gate", site, layer),
        projection(q + "output_gate_a", a + "g_a_proj.weight", src, "kda.gate", site, layer),
        projection(q + "output_gate_b", a + "g_b_proj.weight", src, "kda.gate", (q + "output_gate_low_rank",), layer),
        norm(q + "output_norm", a + "o_norm.weight", src),
        projection(q + "output", a + "o_proj.weight", src, "kda.output", (q + "gated_output",), layer),
    ]
    return objs


def mla(hp: str, p: str, layer: int | None, cfg: dict, src: Sources, role_override: str | None = None) -> list[ObjectSpec]:
    """Sparse MLA with its DSA indexer (models.md 5.4)."""
    a, q = hp + "self_attn.", p + "mla/"
    hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    r_q, r_kv = cfg["q_lora_rank"], cfg["kv_lora_rank"]
    nope, rope, dv = cfg["qk_nope_head_dim"], cfg.get("qk_rope_head_dim", 0), cfg["v_head_dim"]
    if rope:
        raise ConversionError(f"qk_rope_head_dim is {rope}; GLM5Next MLA has no RoPE (it must be 0)")
    _expect(src, a + "q_a_proj.weight", (r_q, hidden))
    _expect(src, a + "kv_a_proj_with_mqa.weight", (r_kv, hidden))
    _expect(src, a + "q_b_proj.weight", (heads * nope, r_q))
    _expect(src, a + "kv_b_proj.weight", (heads * (nope + dv), r_kv))
    _expect(src, a + "o_proj.weight", (hidden, heads * dv))
    site = (f"{p}mixer_input",)
    latent = (q + "query_latent",)
    objs = [
        ObjectSpec(q + "query_a_kv_a", role_override or "mla.query_a_kv_a", [
            _whole(q + "query_a", a + "q_a_proj.weight", src, site),
            _whole(q + "kv_a", a + "kv_a_proj_with_mqa.weight", src, site)], layer),
        norm(q + "query_a_norm", a + "q_a_layernorm.weight", src),
        norm(q + "kv_a_norm", a + "kv_a_layernorm.weight", src),
        projection(q + "query_b", a + "q_b_proj.weight", src, role_override or "mla.query_b", latent, layer),
        projection(q + "kv_b", a + "kv_b_proj.weight", src, role_override or "mla.kv_b", (q + "kv_latent",), layer),
        projection(q + "output", a + "o_proj.weight", src, role_override or "mla.output", (q + "attention_output",), layer),
    ]
    ix, iq = a + "indexer.", q + "indexer/"
    n_i, d_i, pool = cfg["index_n_heads"], cfg["index_head_dim"], cfg["index_kpool"]
    _expect(src, ix + "wq_b.weight", (n_i * d_i, r_q))
    _expect(src, ix + "wk.weight", (d_i, hidden))
    _expect(src, ix + "weights_proj.weight", (n_i, hidden))
    _expect(src, ix + "index_kpool_compress_ape", (pool, d_i))
    _expect(src, ix + "index_kpool_compress_gate", (d_i, hidden))
    objs += [
        projection(iq + "query_b", ix + "wq_b.weight", src, "mla.indexer", latent, layer),
        projection(iq + "key", ix + "wk.weight", src, "mla.indexer", site, layer),
        norm(iq + "key_norm_weight", ix + "k_norm.weight", src),
        norm(iq + "key_norm_bias", ix + "k_norm.bias", src),
        projection(iq + "weights", ix + "weights_proj.weight", src, "mla.indexer", site, layer),
        norm(iq + "pool_ape", ix + "index_kpool_compress_ape", src),
        projection(iq + "pool_gate", ix + "index_kpool_compress_gate", src, "mla.indexer", site, layer),
    ]
    return objs


def moe(hp: str, p: str, layer: int | None, cfg: dict, src: Sources, role_override: str | None = None) -> list[ObjectSpec]:
    """Sigmoid-routed MoE with a correction bias and an ungated shared expert (models.md 5.5)."""
    m, q = hp + "mlp.", p + "moe/"
    experts, inter, hidden = cfg["n_routed_experts"], cfg["moe_intermediate_size"], cfg["hidden_size"]
    site = (f"{p}ffn_input",)
    _expect(src, m + "gate.weight", (experts, hidden))
    _expect(src, m + "gate.e_score_correction_bias", (experts,))
    objs = [projection(q + "router", m + "gate.weight", src, "moe.router", site, layer),
            norm(q + "router_bias", m + "gate.e_score_correction_bias", src, kind="fp32")]
    fused_gate_up, fused_down = m + "experts.gate_up_proj", m + "experts.down_proj"
    fused = _has(src, fused_gate_up)
    if fused:
        _expect(src, fused_gate_up, (experts, 2 * inter, hidden))
        _expect(src, fused_down, (experts, hidden, inter))
    gate_up, down = [], []
    for e in range(experts):
        base = f"{q}experts/{e}/"
        if fused:
            loads = ((lambda i: lambda s: s[fused_gate_up][i, :inter])(e), (lambda i: lambda s: s[fused_gate_up][i, inter:])(e),
                     (lambda i: lambda s: s[fused_down][i])(e))
            consumes = ([(fused_gate_up, f"e{e}.gate")], [(fused_gate_up, f"e{e}.up")], [(fused_down, f"e{e}")])
        else:
            names = [f"{m}experts.{e}.{w}_proj.weight" for w in ("gate", "up", "down")]
            for n, shape in zip(names, ((inter, hidden), (inter, hidden), (hidden, inter)), strict=True):
                _expect(src, n, shape)
            loads = tuple(whole(n) for n in names)
            consumes = tuple([(n, "all")] for n in names)
        gate_up += [_param(base + "gate", (inter, hidden), loads[0], consumes[0], site),
                    _param(base + "up", (inter, hidden), loads[1], consumes[1], site)]
        down.append(_param(base + "down", (hidden, inter), loads[2], consumes[2], (base + "product",)))
    objs += [ObjectSpec(q + "experts/gate_up", role_override or "moe.experts.gate_up", gate_up, layer),
             ObjectSpec(q + "experts/down", role_override or "moe.experts.down", down, layer)]
    s = m + "shared_experts."
    objs += [ObjectSpec(q + "shared/gate_up", role_override or "moe.shared", [
                 _whole(q + "shared/gate", s + "gate_proj.weight", src, site),
                 _whole(q + "shared/up", s + "up_proj.weight", src, site)], layer),
             projection(q + "shared/down", s + "down_proj.weight", src, role_override or "moe.shared",
                        (q + "shared/product",), layer)]
    return objs


# -- vision tower -----------------------------------------------------------------------------------


def _optional_bias(name: str, source: str, src: Sources) -> list[ObjectSpec]:
    return [norm(name, source, src)] if _has(src, source) else []


def glm_vision(hf: HFModelDir, src: Sources) -> tuple[ComponentSpec, list[ObjectSpec]]:
    """The GLM ViT (models.md 6.3): RMSNorm blocks with q/k norms, clamped-SwiGLU MLPs, conv merger."""
    cfg = hf.vision_config
    v = "model.visual."
    width, heads, merge = cfg["hidden_size"], cfg["num_heads"], cfg["spatial_merge_size"]
    out_width = cfg.get("out_hidden_size", width)
    patch = v + "patch_embed.proj.weight"
    pshape = src.shape(patch)
    if len(pshape) != 5 or pshape[0] != width:
        raise ConversionError(f"tensor {patch!r} has shape {list(pshape)}, expected [{width}, C, T, p, p]")
    objs = [
        ObjectSpec("vision/patch_embedding", "vision.patch", [_param(
            "vision/patch_embedding", (width, int(np.prod(pshape[1:]))), whole(patch, (width, -1)), [(patch, "all")],
            ("vision/patch_input",))]),
        norm("vision/patch_embedding_bias", v + "patch_embed.proj.bias", src),
    ]
    for b in range(cfg["depth"]):
        hp, p = f"{v}blocks.{b}.", f"vision/layers/{b}/"
        objs += [norm(p + "norm1_weight", hp + "norm1.weight", src), norm(p + "norm2_weight", hp + "norm2.weight", src)]
        qkv, qkv_b = hp + "attn.qkv.weight", hp + "attn.qkv.bias"
        _expect(src, qkv, (3 * width, width))
        site = (p + "attention_input",)
        names = ("query", "key", "value")
        objs.append(ObjectSpec(p + "attention/qkv", "vision.qkv", [
            _param(f"{p}attention/{n}", (width, width), rows(qkv, i * width, (i + 1) * width), [(qkv, n)], site)
            for i, n in enumerate(names)]))
        if _has(src, qkv_b):
            objs.append(ObjectSpec(p + "attention/qkv_bias", "plain", [
                _param(f"{p}attention/{n}_bias", (width,), rows(qkv_b, i * width, (i + 1) * width), [(qkv_b, n)])
                for i, n in enumerate(names)]))
        head_dim = width // heads
        _expect(src, hp + "attn.q_norm.weight", (head_dim,))
        objs += [norm(p + "attention/query_norm", hp + "attn.q_norm.weight", src),
                 norm(p + "attention/key_norm", hp + "attn.k_norm.weight", src),
                 projection(p + "attention/output", hp + "attn.proj.weight", src, "vision.output",
                            (p + "attention_output",), None)]
        objs += _optional_bias(p + "attention/output_bias", hp + "attn.proj.bias", src)
        mp = hp + "mlp."
        objs.append(ObjectSpec(p + "mlp/gate_up", "vision.fc1", [
            _whole(p + "mlp/gate", mp + "gate_proj.weight", src, (p + "mlp_input",)),
            _whole(p + "mlp/up", mp + "up_proj.weight", src, (p + "mlp_input",))]))
        if _has(src, mp + "gate_proj.bias"):
            objs.append(ObjectSpec(p + "mlp/gate_up_bias", "plain", [
                _whole(p + "mlp/gate_bias", mp + "gate_proj.bias", src), _whole(p + "mlp/up_bias", mp + "up_proj.bias", src)]))
        objs.append(projection(p + "mlp/down", mp + "down_proj.weight", src, "vision.fc2", (p + "mlp_activation",), None))
        objs += _optional_bias(p + "mlp/down_bias", mp + "down_proj.bias", src)
    objs.append(norm("vision/post_norm", v + "post_layernorm.weight", src))
    ds = v + "downsample.weight"
    _expect(src, ds, (out_width, width, merge, merge))
    objs.append(ObjectSpec("vision/downsample", "vision.merger", [_param(
        "vision/downsample", (out_width, merge * merge * width),
        lambda s: np.ascontiguousarray(s[ds].transpose(0, 2, 3, 1)).reshape(out_width, -1), [(ds, "all")],
        ("vision/downsample_input",))]))
    objs.append(norm("vision/downsample_bias", v + "downsample.bias", src))
    mg, q = v + "merger.", "vision/merger/"
    objs.append(projection(q + "projection", mg + "proj.weight", src, "vision.merger", (q + "input",), None))
    objs += _optional_bias(q + "projection_bias", mg + "proj.bias", src)
    objs += [norm(q + "norm_weight", mg + "post_projection_norm.weight", src),
             norm(q + "norm_bias", mg + "post_projection_norm.bias", src),
             ObjectSpec(q + "gate_up", "vision.merger", [
                 _whole(q + "gate", mg + "gate_proj.weight", src, (q + "activation",)),
                 _whole(q + "up", mg + "up_proj.weight", src, (q + "activation",))]),
             projection(q + "down", mg + "down_proj.weight", src, "vision.merger", (q + "product",), None)]
    for n in ("gate", "up", "down"):
        objs += _optional_bias(f"{q}{n}_bias", f"{mg}{n}_proj.bias", src)
    config = {"model_type": "glm5_next_vision", **{k: cfg[k] for k in VISION_KEYS if k in cfg}}
    config.update({k: hf.config[k] for k in MEDIA_KEYS if k in hf.config})
    return ComponentSpec("vision", config, target="text", resources=dict(hf.vision_resources)), objs


# -- whole model --------------------------------------------------------------------------------------


def _layer_plan(hf: HFModelDir, cfg: dict) -> tuple[list[str], list[str]]:
    for key in ("hidden_size", "num_hidden_layers", "layer_types", "mlp_layer_types", "vocab_size", "hc_mult"):
        if key not in cfg:
            raise ConversionError(f"{hf.path / 'config.json'}: text config lacks {key!r}")
    n = cfg["num_hidden_layers"]
    kinds = []
    for i, kind in enumerate(cfg["layer_types"]):
        if kind not in (KDA, *MLA_SPELLINGS):
            raise ConversionError(f"{hf.path / 'config.json'}: layer {i} has unknown layer type {kind!r}")
        kinds.append(KDA if kind == KDA else MLA)
    ffns = list(cfg["mlp_layer_types"])
    if len(kinds) != n or len(ffns) != n:
        raise ConversionError(f"{hf.path / 'config.json'}: layer_types / mlp_layer_types need {n} entries")
    for i, f in enumerate(ffns):
        if f not in ("dense", "sparse"):
            raise ConversionError(f"{hf.path / 'config.json'}: layer {i} has unknown mlp layer type {f!r}")
    for i, t in enumerate(cfg.get("indexer_types") or []):
        if t != "full":
            raise ConversionError(f"{hf.path / 'config.json'}: indexer_types[{i}] is {t!r}; only 'full' is supported")
    return kinds, ffns


def plan(hf: HFModelDir, recipe: str) -> ConversionPlan:
    src = Sources(hf.checkpoint)
    cfg = hf.text_config
    kinds, ffns = _layer_plan(hf, cfg)
    tp = text_prefix(src)
    nextn = f"{tp}layers.{cfg['num_hidden_layers']}."
    has_mtp = any(n.startswith(nextn) for n in src.checkpoint.tensors)
    unused: dict[str, str] = {}

    objs: list[ObjectSpec] = [projection("text/token_embedding", tp + "embed_tokens.weight", src, "embedding", (), None),
                              norm("text/final_norm", tp + "norm.weight", src)]
    if _has(src, "lm_head.weight"):
        sites = ("text/final_hidden", *(("mtp/final_hidden",) if has_mtp else ()))
        objs.append(projection("text/output_head", "lm_head.weight", src, "output_head", sites, None))
    elif cfg.get("tie_word_embeddings"):
        objs[0].aliases.append("text/output_head")
    else:
        raise ConversionError(f"{hf.path}: missing tensor 'lm_head.weight' (and tie_word_embeddings is false)")
    for i, (kind, ffn) in enumerate(zip(kinds, ffns, strict=True)):
        hp, p = f"{tp}layers.{i}.", f"text/layers/{i}/"
        objs += [norm(p + "input_norm", hp + "input_layernorm.weight", src),
                 norm(p + "post_attention_norm", hp + "post_attention_layernorm.weight", src)]
        objs += hyper_connections(hp, p, cfg, src)
        objs += kda(hp, p, i, cfg, src) if kind == KDA else mla(hp, p, i, cfg, src)
        objs += dense_mlp(hp, p, i, src) if ffn == "dense" else moe(hp, p, i, cfg, src)

    text_config = {"architectures": ["Glm5NextForCausalLM"], "model_type": "glm5_next_text",
                   **{k: cfg[k] for k in TEXT_KEYS if k in cfg}}
    text_config["layer_types"] = kinds
    components = [ComponentSpec("text", text_config, resources=dict(hf.text_resources))]
    if hf.vision_config is not None:
        vision, vision_objs = glm_vision(hf, src)
        components.append(vision)
        objs += vision_objs
    if has_mtp:
        objs += nextn_head(nextn, cfg, src, unused)
        components.append(ComponentSpec("mtp", {"architectures": ["Glm5NextMTP"]}, target="text"))
    return ConversionPlan(architecture=hf.model_type, components=components, objects=objs, unused=unused, family=FAMILY)


def nextn_head(hp: str, cfg: dict, src: Sources, unused: dict[str, str]) -> list[ObjectSpec]:
    """The DeepSeek-style NextN layer (models.md 7.1): a pre-norm MLA + MoE layer without mHC."""
    hidden = cfg["hidden_size"]
    _expect(src, hp + "eh_proj.weight", (hidden, 2 * hidden))
    objs = [projection("mtp/input_projection", hp + "eh_proj.weight", src, "mtp.projection", ("mtp/stem_input",), None),
            norm("mtp/embedding_norm", hp + "enorm.weight", src),
            norm("mtp/hidden_norm", hp + "hnorm.weight", src),
            norm("mtp/final_norm", hp + "shared_head.norm.weight", src)]
    p = "mtp/layers/0/"
    objs += [norm(p + "input_norm", hp + "input_layernorm.weight", src),
             norm(p + "post_attention_norm", hp + "post_attention_layernorm.weight", src)]
    objs += mla(hp, p, None, cfg, src, role_override="mtp.projection")
    objs += moe(hp, p, None, cfg, src, role_override="mtp.projection")
    # DeepSeek-style NextN files may repeat the target's embedding and head; the draft head uses the
    # target's own (models.md 7.1), so the copies are not converted.
    for name, what in (("embed_tokens.weight", "text/token_embedding"), ("shared_head.head.weight", "text/output_head")):
        if _has(src, hp + name):
            unused[hp + name] = f"copy of {what}: the MTP head shares the target's"
    return objs
