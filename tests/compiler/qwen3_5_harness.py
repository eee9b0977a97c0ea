"""Tiny Qwen3.5 (models.md section 9) in HF and compiled, plus a minimal cache driver.

The driver does what the runtime's pools will do, in the simplest way: every sequence owns a
GDN state slot and a list of KV pages handed out from a free list.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import ml_dtypes
import numpy as np
import torch
import tvm

from ninfer_compiler.build import CompiledModel, build_model, load_vm
from ninfer_compiler.frontend.options import ModelOptions
from ninfer_compiler.frontend.qwen3_5.config import Qwen35TextConfig
from ninfer_compiler.frontend.qwen3_5.hf_params import encode_params, hf_to_logical
from ninfer_compiler.frontend.qwen3_5.model import Qwen35ForCausalLM

ROPE = {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
        "mrope_section": [3, 3, 2], "mrope_interleaved": True}  # fmt: skip
TINY_TEXT = dict(
    vocab_size=512, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=2, head_dim=64, linear_num_key_heads=2, linear_num_value_heads=6,
    linear_key_head_dim=32, linear_value_head_dim=32, linear_conv_kernel_dim=4,
    rope_parameters=ROPE, rms_norm_eps=1e-6, max_position_embeddings=4096,
    layer_types=["linear_attention"] * 3 + ["full_attention"], eos_token_id=1, pad_token_id=0,
    intermediate_size=128,
)  # fmt: skip


def tiny_hf_model(seed: int = 0, **overrides):
    """HF `Qwen3_5ForCausalLM`, eager attention, every float parameter + N(0, 0.05^2)."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    cfg = Qwen3_5TextConfig(**{**TINY_TEXT, **overrides})
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = Qwen3_5ForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.is_floating_point():
                p.add_(torch.randn_like(p) * 0.05)
    return model


def rel_err(a: np.ndarray, ref: np.ndarray) -> float:
    """max |a - ref| / max |ref| (the parity metric we report)."""
    return float(np.abs(a - ref).max() / np.abs(ref).max())


@dataclass
class Sequence:
    slot: int
    pages: list[int] = field(default_factory=list)
    length: int = 0


class Driver:
    """Owns the cache tensors and calls the compiled entry functions."""

    def __init__(self, compiled: CompiledModel, params: dict[str, np.ndarray], cfg: Qwen35TextConfig,
                 opts: ModelOptions, num_pages: int = 64, num_slots: int = 8, max_pages: int = 16):  # fmt: skip
        self.cfg, self.opts, self.max_pages = cfg, opts, max_pages
        self.vm = load_vm(compiled.executable)
        self.params = [tvm.runtime.tensor(params[n]) for n in compiled.param_names]
        la, lg = len(cfg.attention_layers), len(cfg.gdn_layers)
        ps, act = opts.page_size, {"bfloat16": ml_dtypes.bfloat16}.get(opts.dtype, opts.dtype)
        self.kv = tvm.runtime.tensor(
            np.zeros((la, num_pages, 2, cfg.num_key_value_heads, ps, cfg.head_dim), act)
        )
        # Recurrent state starts as garbage, as a reused slot would hold.
        rng = np.random.default_rng(11)
        gdn_shape = (lg, num_slots, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                     cfg.linear_value_head_dim)  # fmt: skip
        self.gdn = tvm.runtime.tensor(rng.standard_normal(gdn_shape).astype("float32"))
        conv_shape = (lg, num_slots, cfg.linear_conv_kernel_dim - 1, cfg.conv_channels)
        self.conv = tvm.runtime.tensor(rng.standard_normal(conv_shape).astype(act))
        # Hand pages out in a scrambled order so page-table indirection is exercised.
        self.free_pages = list(np.random.default_rng(7).permutation(num_pages))
        self.free_slots = list(range(num_slots))[::-1]

    def new_sequence(self) -> Sequence:
        # No clearing: the kernels start a sequence with seq_lens == 0 from zero state.
        return Sequence(slot=self.free_slots.pop())

    def _reserve(self, seq: Sequence, new_tokens: int) -> None:
        need = -(-(seq.length + new_tokens) // self.opts.page_size)
        while len(seq.pages) < need:
            seq.pages.append(int(self.free_pages.pop()))

    def _table(self, seqs: list[Sequence]) -> np.ndarray:
        table = np.zeros((len(seqs), self.max_pages), "int32")
        for i, s in enumerate(seqs):
            table[i, : len(s.pages)] = s.pages
        return table

    def _call(self, fn: str, ids: np.ndarray, seqs: list[Sequence], positions: np.ndarray):
        t = tvm.runtime.tensor
        args = [
            t(ids.astype("int32")),
            t(positions.astype("int32")),
            t(self._table(seqs)),
            t(np.array([s.length for s in seqs], "int32")),
            t(np.array([s.slot for s in seqs], "int32")),
            self.kv,
            self.gdn,
            self.conv,
            self.params,
        ]
        return self.vm[fn](*args)[0].numpy().astype(np.float32)

    def prefill(self, seq: Sequence, ids: np.ndarray, all_logits: bool = False) -> np.ndarray:
        self._reserve(seq, len(ids))
        pos = np.tile(np.arange(seq.length, seq.length + len(ids)), (3, 1))
        out = self._call("prefill_all_logits" if all_logits else "prefill", ids, [seq], pos)
        seq.length += len(ids)
        return out

    def decode(self, seqs: list[Sequence], ids: np.ndarray) -> np.ndarray:
        for s in seqs:
            self._reserve(s, 1)
        pos = np.tile(np.array([s.length for s in seqs]), (3, 1))
        out = self._call("decode", ids, seqs, pos)
        for s in seqs:
            s.length += 1
        return out

    def snapshot(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.kv.numpy(), self.gdn.numpy(), self.conv.numpy()

    def restore(self, state: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
        self.kv.copyfrom(state[0])
        self.gdn.copyfrom(state[1])
        self.conv.copyfrom(state[2])


def compile_tiny(opts: ModelOptions | None = None):
    """(HF model, our config, compiled model, encoded params) for the tiny config."""
    opts = opts or ModelOptions()
    hf = tiny_hf_model()
    cfg = Qwen35TextConfig.from_dict(hf.config.to_dict())
    compiled = build_model(Qwen35ForCausalLM(cfg, opts))
    params = encode_params(hf_to_logical(hf.state_dict(), cfg), compiled.param_dtypes, opts.weights)
    return hf, cfg, compiled, params
