"""Qwen3.5 Dense text model (`Qwen3_5ForCausalLM`) as a `relax.frontend.nn` module.

Parameter paths mirror the artifact binding names (models.md 8.2): binding
`text/layers/3/attention/query` is module `layers.3.attention.query`, whose tensors are
`.weight` (dense) or the grouped-int planes `.base`, `.high`, `.scales`; bare parameters
(`gdn.a_log`, `gdn.dt_bias`, `gdn.convolution`) carry the binding's tensor directly.

Caches are runtime-owned tensors passed to every entry function and updated in place
(returned again so the updates stay live in the dataflow graph):

* `kv_pool [La, num_pages, 2, Nkv, page_size, D]` (activation dtype), La = attention layers;
* `gdn_state [Lg, num_slots, Hv, dk, dv]` fp32 and `conv_state [Lg, num_slots, K-1, C]`
  (activation dtype), Lg = GDN layers, indexed by `slot_ids`; a sequence whose
  `seq_lens[b] == 0` starts from zero state, so a reused slot needs no clearing;
* `page_table [B, max_pages]` int32, `seq_lens [B]` int32 = tokens already cached.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import op, spec

from ...ops import fused_linear
from ...ops.common import tuned_cuda_kernels
from ...ops.gather import last_token
from ...ops.greedy import greedy_choice
from ..layers.embedding import make_embedding
from ..layers.gated_attention import GatedAttention
from ..layers.gated_delta_net import GatedDeltaNet
from ..layers.linear import make_linear
from ..layers.mlp import SwiGLU
from ..layers.norms import OffsetRMSNorm
from ..layers.rope import MRope
from ..options import ModelOptions
from .config import Qwen35TextConfig

PLANE_SUFFIXES = ("weight", "base", "high", "scales")


def binding_name(param_name: str) -> str:
    """Artifact binding of a parameter path: `layers.0.gdn.query.weight` -> `text/layers/0/gdn/query`."""
    parts = param_name.split(".")
    if parts[-1] in PLANE_SUFFIXES:
        parts = parts[:-1]
    return "text/" + "/".join(parts)


@dataclass(frozen=True)
class StepInputs:
    """Per-call inputs every layer sees: `B` sequences x `T` new tokens."""

    positions: nn.Tensor  # [3, B, T] int32 MRoPE rows
    page_table: nn.Tensor  # [B, max_pages] int32
    seq_lens: nn.Tensor  # [B] int32, tokens cached before this call
    slot_ids: nn.Tensor  # [B] int32, GDN state slots
    chunked: bool  # GDN: chunked (prefill) or token-by-token (decode) kernel
    page_size: int


@dataclass(frozen=True)
class Caches:
    """The runtime-owned cache tensors, threaded through the layers."""

    kv_pool: nn.Tensor
    gdn_state: nn.Tensor
    conv_state: nn.Tensor


class Qwen35DecoderLayer(nn.Module):
    """Pre-norm residual block: (gated attention | GDN) then SwiGLU (`Qwen3_5DecoderLayer`)."""

    def __init__(self, cfg: Qwen35TextConfig, opts: ModelOptions, index: int):
        plan, path = opts.weights, f"layers.{index}"
        self.is_attention = cfg.layer_types[index] == "full_attention"
        # Index among the layers of the same kind: the layer axis of kv_pool / GDN state.
        kind_layers = cfg.attention_layers if self.is_attention else cfg.gdn_layers
        self.cache_index = kind_layers.index(index)
        self.input_norm = OffsetRMSNorm(
            cfg.hidden_size, cfg.rms_norm_eps, plan.dense_dtype_of(f"{path}.input_norm")
        )
        if self.is_attention:
            rope = MRope(cfg.rotary_dim, cfg.rope.theta, cfg.rope.mrope_section)
            self.attention = GatedAttention(
                cfg.hidden_size,
                cfg.num_attention_heads,
                cfg.num_key_value_heads,
                cfg.head_dim,
                cfg.rms_norm_eps,
                rope,
                plan,
                f"{path}.attention",
            )
        else:
            self.gdn = GatedDeltaNet(
                cfg.hidden_size,
                cfg.linear_num_key_heads,
                cfg.linear_num_value_heads,
                cfg.linear_key_head_dim,
                cfg.linear_value_head_dim,
                cfg.linear_conv_kernel_dim,
                cfg.rms_norm_eps,
                plan,
                f"{path}.gdn",
            )
        self.post_attention_norm = OffsetRMSNorm(
            cfg.hidden_size, cfg.rms_norm_eps, plan.dense_dtype_of(f"{path}.post_attention_norm")
        )
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size, plan, f"{path}.mlp")

    def forward(self, x: nn.Tensor, step: StepInputs, caches: Caches) -> tuple[nn.Tensor, Caches]:
        mixer = self.attention if self.is_attention else self.gdn
        # decode: the norm may also hand the mixer's projections its output as int8 activations
        normed = fused_linear.norm_int8_for_multi(x, self.input_norm.weight, self.input_norm.eps, True,
                                                  mixer.decode_projections())
        h, h_xq = normed if normed is not None else (self.input_norm(x), None)
        if self.is_attention:
            x, kv_pool = self.attention(
                h, step.positions, caches.kv_pool, step.page_table, step.seq_lens,
                self.cache_index, step.page_size, residual=x, h_xq=h_xq,
            )  # fmt: skip
            caches = replace(caches, kv_pool=kv_pool)
        else:
            x, gdn_state, conv_state = self.gdn(
                h, caches.gdn_state, caches.conv_state, step.slot_ids, step.seq_lens,
                self.cache_index, step.chunked, residual=x, h_xq=h_xq,
            )  # fmt: skip
            caches = replace(caches, gdn_state=gdn_state, conv_state=conv_state)
        x = self.mlp.forward_norm_add(self.post_attention_norm, x)
        return x, caches


class Qwen35ForCausalLM(nn.Module):
    """Embedding, decoder layers, final norm, output head; entry functions below."""

    # What each entry function returns, in order (recorded in the package manifest).
    CACHES = ("kv_pool", "gdn_state", "conv_state")
    OUTPUTS = {
        "prefill": ("logits", *CACHES),
        "prefill_all_logits": ("logits", *CACHES),
        "decode": ("logits", *CACHES, "greedy_token", "greedy_logprob"),
        "embed": ("embeddings",),
        "sample": ("sample_token", "sample_logprob"),  # tuned CUDA packages only
    }

    def __init__(self, cfg: Qwen35TextConfig, opts: ModelOptions | None = None):
        opts = opts or ModelOptions()
        self.cfg, self.opts = cfg, opts
        plan = opts.weights
        self.token_embedding = make_embedding(
            cfg.vocab_size, cfg.hidden_size, plan, "token_embedding", opts.dtype
        )
        self.layers = nn.ModuleList(
            [Qwen35DecoderLayer(cfg, opts, i) for i in range(cfg.num_hidden_layers)]
        )
        self.final_norm = OffsetRMSNorm(
            cfg.hidden_size, cfg.rms_norm_eps, plan.dense_dtype_of("final_norm")
        )
        if not cfg.tie_word_embeddings:
            self.output_head = make_linear(cfg.hidden_size, cfg.vocab_size, plan, "output_head")

    # ---- the forward pass over B sequences x T new tokens ---------------------------------

    def _forward(
        self,
        ids: nn.Tensor,
        positions: nn.Tensor,
        page_table: nn.Tensor,
        seq_lens: nn.Tensor,
        slot_ids: nn.Tensor,
        kv_pool: nn.Tensor,
        gdn_state: nn.Tensor,
        conv_state: nn.Tensor,
        chunked: bool,
    ) -> tuple[nn.Tensor, ...]:
        """Hidden states `[B, T, H]` (before the final norm) and the updated caches."""
        step = StepInputs(positions, page_table, seq_lens, slot_ids, chunked, self.opts.page_size)
        caches = Caches(kv_pool, gdn_state, conv_state)
        x = self.token_embedding(ids)
        for layer in self.layers:
            x, caches = layer(x, step, caches)
        return x, caches.kv_pool, caches.gdn_state, caches.conv_state

    def _logits(self, x: nn.Tensor) -> nn.Tensor:
        x = self.final_norm(x)
        if self.cfg.tie_word_embeddings:
            logits = self.token_embedding.as_head(x)
        else:
            logits = self.output_head(x)
        return logits if logits.dtype == "float32" else logits.astype("float32")

    # ---- entry functions ---------------------------------------------------------------------

    def prefill(
        self,
        input_ids: nn.Tensor,
        positions: nn.Tensor,
        page_table: nn.Tensor,
        seq_lens: nn.Tensor,
        slot_ids: nn.Tensor,
        kv_pool: nn.Tensor,
        gdn_state: nn.Tensor,
        conv_state: nn.Tensor,
    ) -> tuple[nn.Tensor, ...]:
        """One sequence, `n` new tokens after `seq_lens[0]` cached ones -> last logits `[1, V]`."""
        x, *caches = self._prefill_hidden(
            input_ids, positions, page_table, seq_lens, slot_ids, kv_pool, gdn_state, conv_state
        )
        # `[1, 1, H]`: the head is then decode-shaped and runs the decode GEMV on GPU targets
        h = self.cfg.hidden_size
        logits = self._logits(op.reshape(last_token(x), [1, 1, h]))
        return (op.reshape(logits, [1, logits.shape[-1]]), *caches)

    def prefill_all_logits(
        self,
        input_ids: nn.Tensor,
        positions: nn.Tensor,
        page_table: nn.Tensor,
        seq_lens: nn.Tensor,
        slot_ids: nn.Tensor,
        kv_pool: nn.Tensor,
        gdn_state: nn.Tensor,
        conv_state: nn.Tensor,
    ) -> tuple[nn.Tensor, ...]:
        """As `prefill`, returning the logits of every new token `[n, V]` (tests, scoring)."""
        x, *caches = self._prefill_hidden(
            input_ids, positions, page_table, seq_lens, slot_ids, kv_pool, gdn_state, conv_state
        )
        n = input_ids.shape[0]
        return (self._logits(op.reshape(x, [n, self.cfg.hidden_size])), *caches)

    def decode(
        self,
        input_ids: nn.Tensor,
        positions: nn.Tensor,
        page_table: nn.Tensor,
        seq_lens: nn.Tensor,
        slot_ids: nn.Tensor,
        kv_pool: nn.Tensor,
        gdn_state: nn.Tensor,
        conv_state: nn.Tensor,
    ) -> tuple[nn.Tensor, ...]:
        """`b` sequences, one new token each -> logits `[b, V]`, the caches, and each row's greedy
        choice (token `[b]` int32 and its log-probability `[b]` fp32), so that greedy requests
        need not copy the logits to the host."""
        b = input_ids.shape[0]
        x, *caches = self._forward(
            op.reshape(input_ids, [b, 1]),
            op.reshape(positions, [3, b, 1]),
            page_table,
            seq_lens,
            slot_ids,
            kv_pool,
            gdn_state,
            conv_state,
            chunked=False,
        )
        # The head runs on `[b, 1, H]` so its kernel is not shared with `prefill_all_logits`'
        # `[n, H]` one: a decode-only kernel gets the low-batch GEMV schedule (passes/low_batch.py).
        logits = self._logits(x)
        logits = op.reshape(logits, [b, logits.shape[-1]])
        return (logits, *caches, *greedy_choice(logits))

    def sample(self, logits: nn.Tensor, params: nn.Tensor, selections) -> tuple[nn.Tensor, nn.Tensor]:  # noqa: ANN001
        """Each row's sampled token and its log-probability, drawn on the device from `decode`'s
        logits with the row's `params` (temperature, top_k, top_p, min_p, u: `ops/device_sampling`),
        so that a sampling request copies 8 bytes a step instead of its logits row; `selections`
        (an int) names the cuts any row has, whose passes are launched."""
        from ...ops.device_sampling import sample_choice

        return sample_choice(logits, params, selections)

    def embed(self, input_ids: nn.Tensor) -> nn.Tensor:
        """Token embeddings `[n, H]` in the activation dtype: the rows media features replace."""
        n = input_ids.shape[0]
        x = self.token_embedding(op.reshape(input_ids, [1, n]))
        return op.reshape(x, [n, self.cfg.hidden_size])

    def _prefill_hidden(
        self,
        input_ids: nn.Tensor,
        positions: nn.Tensor,
        page_table: nn.Tensor,
        seq_lens: nn.Tensor,
        slot_ids: nn.Tensor,
        kv_pool: nn.Tensor,
        gdn_state: nn.Tensor,
        conv_state: nn.Tensor,
    ) -> tuple[nn.Tensor, ...]:
        n = input_ids.shape[0]
        return self._forward(
            op.reshape(input_ids, [1, n]),
            op.reshape(positions, [3, 1, n]),
            page_table,
            seq_lens,
            slot_ids,
            kv_pool,
            gdn_state,
            conv_state,
            chunked=True,
        )

    # ---- export --------------------------------------------------------------------------------

    def cache_specs(self) -> dict[str, spec.Tensor]:
        """Symbolic shapes of the three cache tensors (`num_pages`, `num_slots` dynamic)."""
        cfg, dtype = self.cfg, self.opts.dtype
        la, lg = len(cfg.attention_layers), len(cfg.gdn_layers)
        return {
            "kv_pool": spec.Tensor(
                [la, "num_pages", 2, cfg.num_key_value_heads, self.opts.page_size, cfg.head_dim], dtype
            ),
            "gdn_state": spec.Tensor(
                [
                    lg,
                    "num_slots",
                    cfg.linear_num_value_heads,
                    cfg.linear_key_head_dim,
                    cfg.linear_value_head_dim,
                ],
                "float32",
            ),
            "conv_state": spec.Tensor(
                [lg, "num_slots", cfg.linear_conv_kernel_dim - 1, cfg.conv_channels], dtype
            ),
        }

    def get_export_spec(self) -> dict:
        """Entry functions: inputs, then caches, then the packed parameter tuple."""
        mode = {"param_mode": "packed", "effect_mode": "none"}

        def entry(tokens: str, batch: int | str) -> dict:
            return {
                "input_ids": spec.Tensor([tokens], "int32"),
                "positions": spec.Tensor([3, tokens], "int32"),
                "page_table": spec.Tensor([batch, "max_pages"], "int32"),
                "seq_lens": spec.Tensor([batch], "int32"),
                "slot_ids": spec.Tensor([batch], "int32"),
                **self.cache_specs(),
                "$": mode,
            }

        functions = {
            "prefill": entry("n", 1),
            "prefill_all_logits": entry("n", 1),
            "decode": entry("b", "b"),
            "embed": {"input_ids": spec.Tensor(["n"], "int32"), "$": mode},
        }
        if tuned_cuda_kernels():  # the draw on the device has Triton kernels only
            functions["sample"] = {
                "logits": spec.Tensor(["b", self.cfg.vocab_size], "float32"),
                "params": spec.Tensor(["b", 5], "float64"),
                "selections": spec.Int(),
                "$": {"param_mode": "none", "effect_mode": "none"},
            }
        return functions

    def upper_bounds(self, max_prefill_tokens: int = 2048, max_batch: int = 64) -> dict:
        """Bounds of the dynamic token/batch dims, for static memory planning."""
        return {
            "prefill": {"n": max_prefill_tokens},
            "prefill_all_logits": {"n": max_prefill_tokens},
            "decode": {"b": max_batch},
            "embed": {"n": max_prefill_tokens},
            **({"sample": {"b": max_batch}} if tuned_cuda_kernels() else {}),
        }
