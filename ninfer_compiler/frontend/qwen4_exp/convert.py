"""Qwen4Exp (Qwen3.8-Flash-Next): Hugging Face checkpoint -> artifact plan.

Binding names (models.md 8.2 and 8.4). What Qwen4Exp shares with Qwen3.5 keeps the upstream 8.2
names, produced by the shared Qwen blocks, so one binder serves both families; only what Qwen4Exp
alone has takes the 8.4 (Flash-Next port) names. `P = text/layers/{l}/`:

* mixers: `P gdn/*` and `P attention/{query,gate,key,value,query_norm,key_norm,output}` (8.2, one
  parent `[query; key; gate; value]`), plus the QSA indexer `P attention/indexer/query_key`
  `[(n_q+1)·D_i, H]` (HF `index_qk_proj`: n_q query heads then the key head, rows unchanged) and
  `P attention/indexer/{query_norm,key_norm}`;
* MoE under the 8.2 names `P moe/router`, `P moe/shared_score`, `P moe/experts/{e}/{gate,up,down}`
  (expert-major banks `[gate_e; up_e]` / `[down_e]`), `P moe/shared/{gate,up,down}`, not the
  fork's `P mlp/router`, `P mlp/shared_expert*` and `P mlp/experts/gate_up` bank names;
* hyper-connections `P {attention,mlp}/hyper_connection/{norm, input_mix/down, input_mix/up,
  block_inject}` (HF `attn_hyper_connection` / `mlp_hyper_connection`; `attention` names the mixer
  site for GDN layers too), the final mixer `text/hyper_connection/{norm, input_mix/down,
  input_mix/up}`; there is no `input_norm`, `post_attention_norm` or `text/final_norm`;
* PLE on its layer: `P ple/{key_projection, value_projection, query_norm, key_norm, conv_norm}`,
  `P ple/convolution` `[k_c, nH]` (tap-major transpose of HF `conv1d [nH, 1, k_c]`),
  `P ple/embedding/table` (the HF `ngram_embedding.shard_{k}` tables concatenated along rows, as
  HF loads them) and the int32 tables `P ple/embedding/ngram_head_offsets`,
  `P ple/embedding/ngram_head_vocab_sizes` `[ngram_heads]`. `P ple/embedding/layer_multipliers` is
  `[N, 2]` int32: the hash multipliers are int64 values near 2^63 / vocab (far beyond int32) and
  upstream has no int64 format, so each is stored as its two's-complement words (low, high);
  multiplier = (high << 32) | (low & 0xFFFFFFFF). The three tables come from the HF buffers, which
  must equal their derivation from the config (models.md 4.3), and are derived when absent;
* `text/token_embedding`, `text/output_head` (or an alias of the embedding when tied);
* MTP, when the checkpoint has one (`mtp.*`, models.md 7.1; transformers 5.23 has none):
  `mtp/embedding_projection`, `mtp/hidden_projection` `[H, H]`, `mtp/embedding_norm` `[H]`,
  `mtp/hidden_norm` `[nH]`, `mtp/hyper_connection/*` (mixer) and `mtp/layers/0/*` (a QSA + MoE
  layer with the names above);
* vision: the Qwen3.5 tower names (`qwen_vision`, component model_type `qwen4_exp_vision`).

Uses: the 8.2 sites (`P mixer_input`, `P ffn_input`, products, gated outputs) plus
`…/hyper_connection/normalized_state` (input_mix/down, block_inject), `…/hyper_connection/low_rank`
(input_mix/up), `P ple/embedding` (PLE key/value projections), `P mixer_input` for the indexer,
`mtp/normalized_embedding` / `mtp/normalized_hidden` for the MTP projections and
`mtp/final_hidden` on the output head when an MTP head exists.
"""

from __future__ import annotations

import re

import numpy as np

from ninfer_compiler.convert.errors import ConversionError
from ninfer_compiler.convert.hf_dir import HFModelDir
from ninfer_compiler.convert.plan import (
    ComponentSpec,
    ConversionPlan,
    ObjectSpec,
    ParamSpec,
    Sources,
    whole,
)
from ninfer_compiler.convert.qwen_blocks import (
    gated_attention,
    gated_delta_net,
    norm,
    projection,
    qwen_text_config,
    qwen_vision,
    sparse_moe,
    text_prefix,
)

FAMILY = "qwen4_exp"  # recipe tables ("qwen4_exp", recipe) in recipes.py

EXTRA_KEYS = (
    "num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size", "norm_topk_prob",
    "hc_count", "hc_lowrank",
    "indexer_n_heads", "indexer_kv_heads", "indexer_head_dim", "indexer_budget", "indexer_compress_ratio",
    "ple_layer_ids", "ple_embed_dim", "ple_conv_kernel_size", "ngram_size", "heads_per_ngram", "split_ngram_parts",
    "ngram_vocab_size_base", "make_ngram_vocab_size_divisible_by", "seed", "eos_token_id", "output_gate_type",
)

LINEAR = "linear_attention"
INDEXED = "indexed_attention"
# HF maps the checkpoint spellings of the QSA full-attention layers to `indexed_attention`.
ATTENTION_SPELLINGS = {"indexed_attention", "full_attention", "qwen_sparse_attention"}

_SHARD = re.compile(r"ngram_embedding\.shard_(\d+)\.weight$")


def _param(name: str, shape, load, consumes, inputs=()) -> ParamSpec:
    return ParamSpec(name, tuple(int(d) for d in shape), load, tuple(consumes), tuple(inputs))


def _expect(src: Sources, name: str, shape: tuple[int, ...]) -> None:
    if src.shape(name) != tuple(shape):
        raise ConversionError(f"tensor {name!r} has shape {list(src.shape(name))}, expected {list(shape)}")


def _has(src: Sources, prefix: str) -> bool:
    return any(n.startswith(prefix) for n in src.checkpoint.tensors)


def _present(src: Sources, name: str) -> bool:
    return name in src.checkpoint.tensors


def hyper_connection(hf_module: str, prefix: str, src: Sources, inject: bool) -> list[ObjectSpec]:
    """One gated residual (models.md 4.1); `inject=False` for the final mixers (no block_inject)."""
    state, low = (f"{prefix}normalized_state",), (f"{prefix}low_rank",)
    objs = [
        norm(f"{prefix}norm", hf_module + "hc_norm.weight", src),
        projection(f"{prefix}input_mix/down", hf_module + "input_mix_weight_down.weight", src, "hyper_connection", state, None),
        projection(f"{prefix}input_mix/up", hf_module + "input_mix_weight_up.weight", src, "hyper_connection", low, None),
    ]
    if inject:
        objs.append(projection(f"{prefix}block_inject", hf_module + "block_inject_weight.weight", src,
                               "hyper_connection", state, None))
    return objs


def indexer(hf_prefix: str, prefix: str, cfg: dict, src: Sources) -> list[ObjectSpec]:
    """QSA indexer: one fused `[query heads; key head]` projection and its two norms."""
    ix = hf_prefix + "self_attn.indexer."
    heads, kv_heads, dim = cfg.get("indexer_n_heads"), cfg.get("indexer_kv_heads", 1), cfg.get("indexer_head_dim")
    if heads is None or dim is None:
        raise ConversionError(f"tensor {ix + 'index_qk_proj.weight'!r} exists but the config has no indexer_n_heads/"
                              "indexer_head_dim")
    if kv_heads != 1:
        raise ConversionError(f"indexer_kv_heads is {kv_heads}; Qwen4Exp QSA needs exactly one indexer key head")
    _expect(src, ix + "index_qk_proj.weight", ((heads + 1) * dim, cfg["hidden_size"]))
    p = prefix + "attention/indexer/"
    return [
        projection(p + "query_key", ix + "index_qk_proj.weight", src, "attention.indexer", (f"{prefix}mixer_input",), None),
        norm(p + "query_norm", ix + "q_layernorm.weight", src),
        norm(p + "key_norm", ix + "k_layernorm.weight", src),
    ]


def _int64_words(load):
    """int64 values as `[n, 2]` int32 (low word, high word) two's-complement pairs."""
    def words(s: Sources) -> np.ndarray:
        values = np.ascontiguousarray(np.asarray(load(s)).astype("<i8"))
        return values.view("<i4").reshape(-1, 2)  # little endian: low word first

    return words


_GAMMA, _MASK64 = 0x9E3779B97F4A7C15, (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + _GAMMA) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _is_prime(n: int) -> bool:
    if n < 4:
        return n >= 2
    if n % 2 == 0:
        return False
    f = 3
    while f * f <= n:
        if n % f == 0:
            return False
        f += 2
    return True


def ngram_tables(cfg: dict, ple_index: int) -> dict[str, np.ndarray]:
    """The derived n-gram hash constants of PLE layer `ple_index` (models.md 4.3), HF buffer names."""
    order, heads = cfg["ngram_size"], (cfg["ngram_size"] - 1) * cfg["heads_per_ngram"]
    wanted = ple_index * heads + heads  # v_q is the (ℓ·heads + q + 1)-th prime >= base
    primes, n = [], cfg["ngram_vocab_size_base"]
    while len(primes) < wanted:
        if _is_prime(n):
            primes.append(n)
        n += 1
    sizes = primes[ple_index * heads:]
    half = max(1, ((2**63 - 1) // max(cfg["vocab_size"], 1)) // 2)
    base = cfg["seed"] + 10007 * ple_index
    mults = [2 * (_splitmix64((base + _GAMMA * (i + 1)) & _MASK64) % half) + 1 for i in range(order)]
    return {"ngram_heads_vocab_sizes": np.array(sizes, np.int64),
            "ngram_heads_offsets": np.concatenate([[0], np.cumsum(sizes[:-1])]).astype(np.int64),
            "layer_multipliers": np.array(mults, np.int64)}


def _concat_rows(sources: list[str]):
    def load(s: Sources) -> np.ndarray:
        return s[sources[0]] if len(sources) == 1 else np.concatenate([s[n] for n in sources], axis=0)

    return load


def ple(hf_prefix: str, prefix: str, cfg: dict, src: Sources, ple_index: int) -> list[ObjectSpec]:
    """Hashed n-gram PLE (models.md 4.3-4.4)."""
    m = hf_prefix + "ple."
    e = m + "ple_embedding."
    hidden, streams = cfg["hidden_size"], cfg["hc_count"]
    width = cfg.get("ple_embed_dim") or hidden
    p = prefix + "ple/"
    _expect(src, m + "key_proj.weight", (streams * hidden, width))
    _expect(src, m + "value_proj.weight", (hidden, width))
    site = (f"{p}embedding",)
    objs = [
        projection(p + "key_projection", m + "key_proj.weight", src, "ple.projection", site, None),
        projection(p + "value_projection", m + "value_proj.weight", src, "ple.projection", site, None),
        norm(p + "query_norm", m + "norm_query.weight", src),
        norm(p + "key_norm", m + "norm_key.weight", src),
        norm(p + "conv_norm", m + "norm_conv.weight", src),
    ]
    conv = m + "conv1d.weight"
    channels, one, taps = src.shape(conv)
    if channels != streams * hidden or one != 1:
        raise ConversionError(f"tensor {conv!r} has shape {list(src.shape(conv))}, expected [{streams * hidden}, 1, k]")
    objs.append(ObjectSpec(p + "convolution", "plain", [_param(
        p + "convolution", (taps, channels), lambda s: np.ascontiguousarray(s[conv].reshape(channels, taps).T),
        [(conv, "all")])]))

    # n-gram table: HF loads the row shards concatenated (Concatenate(dim=0) over split_ngram_parts)
    shards = sorted((int(mt.group(1)), n) for n in src.checkpoint.tensors
                    if n.startswith(e + "ngram_embedding.") and (mt := _SHARD.search(n)))
    if shards:
        if [k for k, _ in shards] != list(range(len(shards))):
            raise ConversionError(f"{e}ngram_embedding: shards {[k for k, _ in shards]} are not 0..{len(shards) - 1}")
        parts = cfg.get("split_ngram_parts")
        if parts is not None and parts != len(shards):
            raise ConversionError(f"{e}ngram_embedding: {len(shards)} shard(s) but split_ngram_parts is {parts}")
        names = [n for _, n in shards]
    else:
        names = [e + "ngram_embedding.weight"]
    row_width = src.shape(names[0])[1]
    for n in names:
        if len(src.shape(n)) != 2 or src.shape(n)[1] != row_width:
            raise ConversionError(f"tensor {n!r} has shape {list(src.shape(n))}, expected [rows, {row_width}]")
    rows = sum(src.shape(n)[0] for n in names)
    ngram_heads = (cfg["ngram_size"] - 1) * cfg["heads_per_ngram"]
    if row_width * ngram_heads != width:
        raise ConversionError(f"n-gram table rows are {row_width} wide; {ngram_heads} heads need {width // ngram_heads}")
    objs.append(ObjectSpec(p + "embedding/table", "ple.table", [_param(
        p + "embedding/table", (rows, row_width), _concat_rows(names), [(n, "all") for n in names])]))

    # int tables: the checkpoint's buffers when present (checked against the config), else derived
    derived = ngram_tables(cfg, ple_index)
    total = int(derived["ngram_heads_vocab_sizes"].sum())
    if rows < total:
        raise ConversionError(f"{e}ngram_embedding has {rows} rows; the {ngram_heads} hashed heads need {total}")
    for hf_name, ours in (("ngram_heads_offsets", "ngram_head_offsets"), ("ngram_heads_vocab_sizes", "ngram_head_vocab_sizes"),
                          ("layer_multipliers", "layer_multipliers")):
        value, source = derived[hf_name], e + hf_name
        if _present(src, source):
            _expect(src, source, value.shape)
            if not np.array_equal(src[source].astype(np.int64), value):
                raise ConversionError(f"tensor {source!r} does not match the n-gram hash of the config "
                                      "(models.md 4.3: seed, vocab_size, ngram_vocab_size_base, ple_layer_ids)")
            load, consumes = whole(source), [(source, "all")]
        else:
            load, consumes = (lambda v: lambda s: v)(value), []
        name = f"{p}embedding/{ours}"
        if ours == "layer_multipliers":
            load, shape = _int64_words(load), (len(value), 2)
        else:
            shape = value.shape
        objs.append(ObjectSpec(name, "plain", [_param(name, shape, load, consumes)], kind="int32"))
    return objs


def decoder_layer(hf_prefix: str, prefix: str, layer: int | None, kind: str, cfg: dict, src: Sources,
                  role_override: str | None = None, ple_index: int | None = None) -> list[ObjectSpec]:
    """Hyper-connections around a GDN or QSA gated-attention mixer and the MoE; PLE where present."""
    objs: list[ObjectSpec] = []
    if _has(src, hf_prefix + "ple."):
        if ple_index is None:
            raise ConversionError(f"{hf_prefix}ple.*: PLE on a layer that ple_layer_ids does not name")
        objs += ple(hf_prefix, prefix, cfg, src, ple_index)
    objs += hyper_connection(hf_prefix + "attn_hyper_connection.", prefix + "attention/hyper_connection/", src, True)
    if kind == LINEAR:
        objs += gated_delta_net(hf_prefix, prefix, layer, cfg, src, split=False)
    else:
        objs += gated_attention(hf_prefix, prefix, layer, cfg, src, split=False, role_override=role_override)
        if _has(src, hf_prefix + "self_attn.indexer."):
            objs += indexer(hf_prefix, prefix, cfg, src)
    objs += hyper_connection(hf_prefix + "mlp_hyper_connection.", prefix + "mlp/hyper_connection/", src, True)
    objs += sparse_moe(hf_prefix, prefix, layer, cfg, src, role_override)
    return objs


def _layer_types(hf: HFModelDir, cfg: dict) -> list[str]:
    for key in ("hidden_size", "num_hidden_layers", "layer_types", "vocab_size", "hc_count", "num_experts"):
        if key not in cfg:
            raise ConversionError(f"{hf.path / 'config.json'}: text config lacks {key!r}")
    types = []
    for i, kind in enumerate(cfg["layer_types"]):
        if kind == LINEAR:
            types.append(LINEAR)
        elif kind in ATTENTION_SPELLINGS:
            types.append(INDEXED)
        else:
            raise ConversionError(f"{hf.path / 'config.json'}: layer {i} has unknown layer type {kind!r}")
    if len(types) != cfg["num_hidden_layers"]:
        raise ConversionError(f"{hf.path / 'config.json'}: layer_types has {len(types)} entries for "
                              f"{cfg['num_hidden_layers']} layers")
    return types


def plan(hf: HFModelDir, recipe: str) -> ConversionPlan:
    src = Sources(hf.checkpoint)
    cfg = hf.text_config
    layer_types = _layer_types(hf, cfg)
    tp = text_prefix(src)
    mtp = "mtp." if _has(src, "mtp.") else None

    ple_layers = sorted({int(mt.group(1)) for n in src.checkpoint.tensors
                         if (mt := re.match(re.escape(tp) + r"layers\.(\d+)\.ple\.", n))})
    ple_ids = list(cfg.get("ple_layer_ids") or [])
    configured = sorted(i - 1 for i in ple_ids)
    if ple_layers != configured:
        raise ConversionError(f"{hf.path}: the checkpoint has PLE tensors on layers {ple_layers} but ple_layer_ids "
                              f"(one-based) {cfg.get('ple_layer_ids')} names layers {configured}")

    objs: list[ObjectSpec] = [projection("text/token_embedding", tp + "embed_tokens.weight", src, "embedding", (), None)]
    if "lm_head.weight" in src.checkpoint.tensors:
        head_sites = ("text/final_hidden", *(("mtp/final_hidden",) if mtp else ()))
        objs.append(projection("text/output_head", "lm_head.weight", src, "output_head", head_sites, None))
    elif cfg.get("tie_word_embeddings"):
        objs[0].aliases.append("text/output_head")
    else:
        raise ConversionError(f"{hf.path}: missing tensor 'lm_head.weight' (and tie_word_embeddings is false)")
    objs += hyper_connection(tp + "hyper_connection_mixer.", "text/hyper_connection/", src, inject=False)
    for i, kind in enumerate(layer_types):
        ple_index = ple_ids.index(i + 1) if i + 1 in ple_ids else None  # position in the one-based list (4.3)
        objs += decoder_layer(f"{tp}layers.{i}.", f"text/layers/{i}/", i, kind, cfg, src, ple_index=ple_index)

    text_config = qwen_text_config(cfg, "Qwen4ExpForCausalLM", "qwen4_exp_text", EXTRA_KEYS)
    text_config["layer_types"] = layer_types
    if isinstance(text_config.get("eos_token_id"), list):  # the n-gram hash uses the first EOS id (4.3)
        text_config["eos_token_id"] = text_config["eos_token_id"][0]
    components = [ComponentSpec("text", text_config, resources=dict(hf.text_resources))]
    if hf.vision_config is not None:
        vision, vision_objs = qwen_vision(hf, src, "qwen4_exp_vision")
        components.append(vision)
        objs += vision_objs
    if mtp:
        objs += mtp_head(hf, mtp, cfg, src)
        components.append(ComponentSpec("mtp", {"architectures": ["Qwen4ExpMTP"]}, target="text"))
    return ConversionPlan(architecture=hf.model_type, components=components, objects=objs, family=FAMILY)


def mtp_head(hf: HFModelDir, mtp: str, cfg: dict, src: Sources) -> list[ObjectSpec]:
    """The Qwen4Exp MTP head of models.md 7.1 (one QSA + MoE layer with its own hyper-connections)."""
    hidden, streams = cfg["hidden_size"], cfg["hc_count"]
    for name, shape in (("fc_embedding.weight", (hidden, hidden)), ("fc_hidden.weight", (hidden, hidden)),
                        ("pre_fc_norm_embedding.weight", (hidden,)), ("pre_fc_norm_hidden.weight", (streams * hidden,))):
        _expect(src, mtp + name, shape)
    objs = [
        projection("mtp/embedding_projection", mtp + "fc_embedding.weight", src, "mtp.projection",
                   ("mtp/normalized_embedding",), None),
        projection("mtp/hidden_projection", mtp + "fc_hidden.weight", src, "mtp.projection", ("mtp/normalized_hidden",), None),
        norm("mtp/embedding_norm", mtp + "pre_fc_norm_embedding.weight", src),
        norm("mtp/hidden_norm", mtp + "pre_fc_norm_hidden.weight", src),
    ]
    objs += hyper_connection(mtp + "hyper_connection_mixer.", "mtp/hyper_connection/", src, inject=False)
    hp = f"{mtp}layers.0."
    objs += decoder_layer(hp, "mtp/layers/0/", None, INDEXED, cfg, src, role_override="mtp.projection")
    others = [n for n in src.checkpoint.tensors if n.startswith(mtp + "layers.") and not n.startswith(hp)]
    if others:
        raise ConversionError(f"{hf.path}: only one MTP layer is supported, found {others[0]!r}")
    return objs
