"""Typed, validated config of the Qwen3.5 Dense text model.

Parsed from the artifact's `text` component config, whose keys are HF's
`Qwen3_5TextConfig` keys. Every error names the offending key and what was expected.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

LAYER_TYPES = ("full_attention", "linear_attention")


class ConfigError(ValueError):
    """The text config is missing a key or holds a value the model cannot use."""


def _get(d: Mapping[str, Any], key: str, kind: type, where: str = "text config") -> Any:
    if key not in d:
        raise ConfigError(f"{where}: missing key {key!r}")
    value = d[key]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"{where}: {key!r} must be an integer, got {value!r}")
    if not isinstance(value, kind):
        raise ConfigError(f"{where}: {key!r} must be {kind.__name__}, got {value!r}")
    return value


def _positive(d: Mapping[str, Any], key: str) -> int:
    value = _get(d, key, int)
    if value < 1:
        raise ConfigError(f"text config: {key!r} must be >= 1, got {value}")
    return value


@dataclass(frozen=True)
class RopeConfig:
    """`rope_parameters`: theta, partial rotary factor, MRoPE sections (T, H, W)."""

    theta: float
    partial_rotary_factor: float
    mrope_section: tuple[int, int, int]


@dataclass(frozen=True)
class Qwen35TextConfig:
    """The geometry the compiler needs; derived sizes are properties."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    layer_types: tuple[str, ...]
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    rms_norm_eps: float
    rope: RopeConfig
    tie_word_embeddings: bool

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Qwen35TextConfig:
        """Parse and validate the text config dict (HF key names)."""
        act = d.get("hidden_act", "silu")
        if act != "silu":
            raise ConfigError(f"text config: 'hidden_act' must be 'silu', got {act!r}")
        num_layers = _positive(d, "num_hidden_layers")
        layer_types = _get(d, "layer_types", list)
        if len(layer_types) != num_layers:
            raise ConfigError(
                f"text config: 'layer_types' has {len(layer_types)} entries, "
                f"'num_hidden_layers' is {num_layers}"
            )
        for i, kind in enumerate(layer_types):
            if kind not in LAYER_TYPES:
                raise ConfigError(
                    f"text config: 'layer_types'[{i}] is {kind!r}, expected one of {LAYER_TYPES}"
                )
        rope = _parse_rope(_get(d, "rope_parameters", dict), _positive(d, "head_dim"))
        tie = d.get("tie_word_embeddings", False)
        if not isinstance(tie, bool):
            raise ConfigError(f"text config: 'tie_word_embeddings' must be a bool, got {tie!r}")
        eps = _get(d, "rms_norm_eps", float)
        if not eps > 0:
            raise ConfigError(f"text config: 'rms_norm_eps' must be > 0, got {eps}")
        cfg = cls(
            vocab_size=_positive(d, "vocab_size"),
            hidden_size=_positive(d, "hidden_size"),
            intermediate_size=_positive(d, "intermediate_size"),
            num_hidden_layers=num_layers,
            layer_types=tuple(layer_types),
            num_attention_heads=_positive(d, "num_attention_heads"),
            num_key_value_heads=_positive(d, "num_key_value_heads"),
            head_dim=_positive(d, "head_dim"),
            linear_num_key_heads=_positive(d, "linear_num_key_heads"),
            linear_num_value_heads=_positive(d, "linear_num_value_heads"),
            linear_key_head_dim=_positive(d, "linear_key_head_dim"),
            linear_value_head_dim=_positive(d, "linear_value_head_dim"),
            linear_conv_kernel_dim=_positive(d, "linear_conv_kernel_dim"),
            rms_norm_eps=eps,
            rope=rope,
            tie_word_embeddings=tie,
        )
        cfg._check_divisibility()
        return cfg

    def _check_divisibility(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"text config: 'num_attention_heads' ({self.num_attention_heads}) must be a "
                f"multiple of 'num_key_value_heads' ({self.num_key_value_heads})"
            )
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ConfigError(
                f"text config: 'linear_num_value_heads' ({self.linear_num_value_heads}) must be a "
                f"multiple of 'linear_num_key_heads' ({self.linear_num_key_heads})"
            )
        if self.linear_conv_kernel_dim < 2:
            raise ConfigError(
                f"text config: 'linear_conv_kernel_dim' must be >= 2, got {self.linear_conv_kernel_dim}"
            )

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.rope.partial_rotary_factor)

    @property
    def attention_layers(self) -> list[int]:
        """Model layer indices of the full-attention layers (KV pool layer order)."""
        return [i for i, k in enumerate(self.layer_types) if k == "full_attention"]

    @property
    def gdn_layers(self) -> list[int]:
        """Model layer indices of the GDN layers (state tensor layer order)."""
        return [i for i, k in enumerate(self.layer_types) if k == "linear_attention"]

    @property
    def conv_channels(self) -> int:
        key_width = self.linear_num_key_heads * self.linear_key_head_dim
        return 2 * key_width + self.linear_num_value_heads * self.linear_value_head_dim


def _parse_rope(rope: Mapping[str, Any], head_dim: int) -> RopeConfig:
    where = "text config 'rope_parameters'"
    rope_type = rope.get("rope_type", "default")
    if rope_type != "default":
        raise ConfigError(f"{where}: 'rope_type' must be 'default', got {rope_type!r}")
    theta = _get(rope, "rope_theta", float, where)
    factor = _get(rope, "partial_rotary_factor", float, where) if "partial_rotary_factor" in rope else 1.0
    if not 0 < factor <= 1:
        raise ConfigError(f"{where}: 'partial_rotary_factor' must be in (0, 1], got {factor}")
    rotary = head_dim * factor
    if rotary != int(rotary) or int(rotary) % 2:
        raise ConfigError(
            f"{where}: head_dim * partial_rotary_factor = {rotary} must be an even integer"
        )
    section = _get(rope, "mrope_section", list, where)
    if len(section) != 3 or not all(isinstance(s, int) and s >= 0 for s in section):
        raise ConfigError(f"{where}: 'mrope_section' must be 3 non-negative ints, got {section!r}")
    if sum(section) != int(rotary) // 2:
        raise ConfigError(
            f"{where}: 'mrope_section' {section} must sum to rotary_dim/2 = {int(rotary) // 2}"
        )
    return RopeConfig(theta=theta, partial_rotary_factor=factor, mrope_section=tuple(section))
