"""`ninfer synth`: full-size, official-shaped artifacts with synthetic weights, for performance work.

Real weights cannot be downloaded where we measure, and a 15 GB file cannot be shipped to the GPU
machine, so it is generated there. Words are drawn directly in each format's stored domain
(random codes, scales at the magnitude absmax quantization of N(0, 0.02^2) weights gives), never
via float quantization: the Qwen3.6-27B groupwise-int artifact is written about as fast as the disk
takes it. Object packing, binding names, uses and per-role formats follow the official artifacts
(the converter's recipe tables), so a package compiled from a synthetic artifact has exactly the
kernels and bytes per step of the real one. The text, MTP and tokenizer parts are generated; the
vision tower is left out (it takes no part in text decode or prefill).
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np

from ninfer_runtime.artifact import ArtifactWriter
from ninfer_runtime.artifact.formats import (
    FORMATS,
    BlockScaleGeometry,
    GroupedIntFormat,
    RowScaleGeometry,
    RowSplitGeometry,
)
from ninfer_runtime.artifact.quantize import quantize_grouped
from ninfer_runtime.artifact.upgrade_registry import IDENTITIES

from . import recipes
from .errors import ConversionError

WEIGHT_STD = 0.02  # typical std of a trained projection's weights

# `--like` -> (upgrade identity for the config, recipe family column variant)
MODELS = {"qwen3.6-27b": ("qwen3.6-27b", "groupwise-int"), "qwen3.8-27b": ("qwen3.8-27b", "groupwise-int")}


@dataclass(frozen=True)
class Block:
    """One stored object: its id, recipe role, layer, and the (binding, rows) it holds."""

    oid: str
    role: str
    layer: int | None
    params: tuple[tuple[str, int], ...]
    cols: int
    inputs: tuple[str, ...] = ()
    kind: str = "weight"  # weight | norm | fp32 | conv


def text_config(like: str, layers: int | None = None) -> dict:
    if like not in MODELS:
        raise ConversionError(f"unknown --like {like!r}; choose one of {', '.join(MODELS)}")
    cfg = json.loads(json.dumps(IDENTITIES[MODELS[like]].text_config))
    if layers is not None:
        if layers < 1:
            raise ConversionError("--layers must be at least 1")
        cfg["num_hidden_layers"] = layers
        cfg["layer_types"] = cfg["layer_types"][:layers]
    return cfg


def blocks(cfg: dict, recipe: str, mtp: bool = True) -> list[Block]:
    """The official object packing of a Qwen3.5 Dense text model (and its MTP layer)."""
    h, heads, kv, d = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    kg = cfg["linear_num_key_heads"] * cfg["linear_key_head_dim"]
    vg = cfg["linear_num_value_heads"] * cfg["linear_value_head_dim"]
    nv, inter = cfg["linear_num_value_heads"], cfg["intermediate_size"]
    split = recipe == "groupwise-int"
    out = [Block("text/token_embedding", "embedding", None, (("text/token_embedding", cfg["vocab_size"]),), h),
           Block("text/output_head", "output_head", None, (("text/output_head", cfg["vocab_size"]),), h,
                 ("text/final_hidden", "mtp/final_hidden") if mtp else ("text/final_hidden",)),
           Block("text/final_norm", "plain", None, (("text/final_norm", 1),), h, kind="norm")]

    def layer(p: str, i: int | None, kind: str, role: str | None = None) -> list[Block]:
        site = (p + "mixer_input",)
        b = [Block(p + "input_norm", "plain", i, ((p + "input_norm", 1),), h, kind="norm"),
             Block(p + "post_attention_norm", "plain", i, ((p + "post_attention_norm", 1),), h, kind="norm")]
        if kind == "full_attention":
            q, k, g, v = (p + "attention/" + n for n in ("query", "key", "gate", "value"))
            if split and role is None:
                b += [Block(p + "attention/query_key", "attention.query_key", i, ((q, heads * d), (k, kv * d)), h, site),
                      Block(p + "attention/gate_value", "attention.gate_value", i, ((g, heads * d), (v, kv * d)), h, site)]
            else:
                b.append(Block(p + "attention/query_key_gate_value", role or "attention.query_key_gate_value", i,
                               ((q, heads * d), (k, kv * d), (g, heads * d), (v, kv * d)), h, site))
            b += [Block(p + "attention/query_norm", "plain", i, ((p + "attention/query_norm", 1),), d, kind="norm"),
                  Block(p + "attention/key_norm", "plain", i, ((p + "attention/key_norm", 1),), d, kind="norm"),
                  Block(p + "attention/output", role or "attention.output", i, ((p + "attention/output", h),), heads * d,
                        (p + "attention/gated_output",))]
        else:
            q, k, v, z = (p + "gdn/" + n for n in ("query", "key", "value", "z"))
            if split:
                b += [Block(p + "gdn/query_key", "gdn.query_key", i, ((q, kg), (k, kg)), h, site),
                      Block(p + "gdn/value_z", "gdn.value_z", i, ((v, vg), (z, vg)), h, site)]
            else:
                b.append(Block(p + "gdn/query_key_value_z", "gdn.query_key_value_z", i, ((q, kg), (k, kg), (v, vg), (z, vg)), h, site))
            b += [Block(p + "gdn/a_b_projection", "gdn.a_b", i, ((p + "gdn/a_projection", nv), (p + "gdn/b_projection", nv)), h, site),
                  Block(p + "gdn/a_log", "plain", i, ((p + "gdn/a_log", 1),), nv, kind="fp32"),
                  Block(p + "gdn/dt_bias", "plain", i, ((p + "gdn/dt_bias", 1),), nv, kind="fp32"),
                  Block(p + "gdn/norm", "plain", i, ((p + "gdn/norm", 1),), cfg["linear_value_head_dim"], kind="norm"),
                  Block(p + "gdn/convolution", "plain", i, ((p + "gdn/convolution", cfg["linear_conv_kernel_dim"]),),
                        2 * kg + vg, kind="conv"),
                  Block(p + "gdn/output", "gdn.output", i, ((p + "gdn/output", h),), vg, (p + "gdn/gated_output",))]
        b += [Block(p + "mlp/gate_up", role or "mlp.gate_up", i, ((p + "mlp/gate", inter), (p + "mlp/up", inter)), h,
                    (p + "ffn_input",)),
              Block(p + "mlp/down", role or "mlp.down", i, ((p + "mlp/down", h),), inter, (p + "mlp/product",))]
        return b

    for i, kind in enumerate(cfg["layer_types"]):
        out += layer(f"text/layers/{i}/", i, kind)
    if mtp:
        out += [Block("mtp/input_projection", "mtp.projection", None, (("mtp/input_projection", h),), 2 * h, ("mtp/stem_input",)),
                *(Block(f"mtp/{n}", "plain", None, ((f"mtp/{n}", 1),), h, kind="norm")
                  for n in ("embedding_norm", "hidden_norm", "final_norm"))]
        out += layer("mtp/layers/0/", None, "full_attention", role="mtp.projection")
    return out


# -- words -------------------------------------------------------------------------------------------


def _grouped_bytes(rng: np.random.Generator, fmt: str, rows: int, cols: int) -> bytes:
    info = FORMATS[fmt]
    assert isinstance(info, GroupedIntFormat)
    geo = RowSplitGeometry(info, rows, cols)
    if geo.k_pad != cols:  # padding lanes must hold zero codes: encode real values instead
        x = rng.standard_normal((rows, cols), dtype=np.float32) * WEIGHT_STD
        from ninfer_runtime.artifact.codecs import pack_planes

        return pack_planes("row_split_k128_v1", fmt, (rows, cols), quantize_grouped(x, fmt))
    out = bytearray(geo.encoded_size)
    base = np.frombuffer(rng.bytes(geo.base_bytes), np.uint8)
    if fmt == "q8_g32_fp16":
        base = np.where(base == 0x80, np.uint8(0), base)  # -128 is not a legal q8 code
    out[: geo.base_bytes] = base.tobytes()
    if geo.high_bytes:
        out[geo.high_offset : geo.high_offset + geo.high_bytes] = rng.bytes(geo.high_bytes)
    # absmax of a group of N(0, std^2) values is about 2.5 std
    scale = (rng.uniform(2.0, 3.0, rows * geo.groups_per_row) * WEIGHT_STD / info.qmax).astype(np.float16)
    out[geo.scale_offset :] = scale.tobytes()
    return bytes(out)


def _nvfp4_bytes(rng: np.random.Generator, rows: int, cols: int) -> bytes:
    geo = BlockScaleGeometry(rows, cols)
    out = bytearray(geo.encoded_size)
    out[: geo.code_bytes] = rng.bytes(geo.code_bytes)  # every E2M1 word is valid
    # block scales around 2 (E4M3 normal range); the divisor maps 6 * 2 to a block absmax of 2.5 std
    scales = rng.uniform(1.5, 2.5, geo.scale_bytes).astype(ml_dtypes.float8_e4m3fn)
    out[geo.scale_offset : geo.divisor_offset] = scales.view(np.uint8).tobytes()
    out[geo.divisor_offset :] = np.float32(6.0 * 2.0 / (2.5 * WEIGHT_STD)).tobytes()
    return bytes(out)


def _fp8_row_bytes(rng: np.random.Generator, rows: int, cols: int) -> bytes:
    geo = RowScaleGeometry(rows, cols)
    out = bytearray(geo.encoded_size)
    codes = np.frombuffer(rng.bytes(geo.code_bytes), np.uint8)
    codes = np.where((codes & 0x7F) == 0x7F, np.uint8(0), codes)  # no NaN words
    out[: geo.code_bytes] = codes.tobytes()
    scale = (rng.uniform(2.0, 3.0, rows) * WEIGHT_STD / 448.0).astype(np.float32).astype(ml_dtypes.bfloat16)
    out[geo.scale_offset :] = scale.view(np.uint16).tobytes()
    return bytes(out)


def _dense(rng: np.random.Generator, block: Block, rows: int) -> np.ndarray:
    shape = (rows, block.cols) if rows > 1 or block.kind in ("weight", "conv") else (block.cols,)
    if block.kind == "fp32":  # GDN a_log ~ log(U(1, 16)), dt_bias small
        low, high = (0.0, float(np.log(16.0))) if block.oid.endswith("a_log") else (-0.5, 0.5)
        return rng.uniform(low, high, shape).astype(np.float32)
    if block.kind == "norm":  # zero-centred offset-norm weights (plain gdn norm: around 1)
        centre = 1.0 if block.oid.endswith("gdn/norm") else 0.0
        return (centre + rng.standard_normal(shape, dtype=np.float32) * 0.05).astype(ml_dtypes.bfloat16)
    std = 0.3 if block.kind == "conv" else WEIGHT_STD
    return (rng.standard_normal(shape, dtype=np.float32) * std).astype(ml_dtypes.bfloat16)


def synthesize(
    out: str | Path,
    like: str = "qwen3.6-27b",
    recipe: str = "groupwise-int",
    *,
    layers: int | None = None,
    config: dict | None = None,
    seed: int = 0,
    shard_limit: int | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> dict:
    """Write a synthetic artifact; returns a summary (objects, bytes by format, seconds)."""
    recipes.check_recipe(recipe)
    if recipe == "bf16":
        raise ConversionError("synth makes quantized artifacts; use --recipe groupwise-int or nvfp4")
    start = time.monotonic()
    cfg = config or text_config(like, layers)
    rng = np.random.default_rng(seed)
    plan = blocks(cfg, recipe)
    kwargs = {} if shard_limit is None else {"shard_limit": shard_limit}
    summary: dict = {"objects": 0, "bytes_by_format": {}}
    with ArtifactWriter(out, metadata={"name": f"{like}-synthetic-{recipe}"},
                        provenance={"synthetic": {"like": like, "recipe": recipe, "seed": seed,
                                                  "weights": f"random words at N(0, {WEIGHT_STD}^2) magnitude"}},
                        **kwargs) as writer:
        resources = _tokenizer_resources()
        for role, data in resources.items():
            writer.add_resource(f"resource/text/{role}", data)
        for n, block in enumerate(plan):
            rows = sum(r for _, r in block.params)
            fmt = recipes.format_for(recipe, "dense", block.role, block.layer) if block.kind == "weight" else (
                "fp32" if block.kind == "fp32" else "bf16")
            shape = (rows, block.cols) if (rows > 1 or block.kind in ("weight", "conv")) else (block.cols,)
            if not recipes.fits(fmt, shape):  # as the converter does: q8 where nvfp4's tiling does not fit
                fmt = recipes.Q8
            if fmt in ("bf16", "fp32"):
                data = _dense(rng, block, rows)
            elif fmt == recipes.NVFP4:
                data = _nvfp4_bytes(rng, *shape)
            elif fmt == "fp8_e4m3fn_row_bf16":
                data = _fp8_row_bytes(rng, *shape)
            else:
                data = _grouped_bytes(rng, fmt, *shape)
            writer.add_tensor(block.oid, fmt, recipes.layout_for(fmt), shape, data)
            obj = writer.tensor(block.oid)
            summary["bytes_by_format"][fmt] = summary["bytes_by_format"].get(fmt, 0) + obj.bytes
            summary["objects"] += 1
            row_elems = obj.elements // obj.shape[0] if len(obj.shape) > 1 else 1
            begin = 0
            for name, r in block.params:
                if len(block.params) == 1 and shape == obj.shape:
                    writer.bind(name, block.oid)
                else:
                    writer.bind_parts(name, [(block.oid, begin, begin + r * row_elems)])
                begin += r * row_elems
                for site in block.inputs:
                    writer.add_use(name, site, recipes.activation_policy(fmt))
            if progress:
                progress(block.oid, n + 1, len(plan))
        writer.add_component("text", cfg, resources={r: f"resource/text/{r}" for r in resources})
        writer.add_component("mtp", {"architectures": ["Qwen3_5MTP"]}, target="text")
    summary["seconds"] = time.monotonic() - start
    summary["bytes"] = sum(summary["bytes_by_format"].values())
    return summary


def _tokenizer_resources() -> dict[str, bytes]:
    """The tiny test models' tokenizer and template: ids stay far inside the synthetic vocabulary."""
    from ninfer_compiler.testmodel.tokenizer import QWEN, generation_config, save_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        save_tokenizer(Path(tmp), QWEN)
        out = {role: (Path(tmp) / role).read_bytes() for role in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")}
    gen = generation_config(QWEN)
    out["generation_config.json"] = json.dumps({"eos_token_id": gen.eos_token_id, "pad_token_id": gen.pad_token_id}).encode()
    return out
