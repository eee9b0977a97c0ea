"""A Hugging Face model directory as the converter sees it: config, weights and text resources."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ConversionError
from .safetensors_reader import SafetensorsCheckpoint

TEXT_ROLES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")
VISION_ROLES = ("preprocessor_config.json", "video_preprocessor_config.json")
JSON_ROLES = {r for r in TEXT_ROLES + VISION_ROLES if r.endswith(".json")}


def _json_object(path: Path) -> dict:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ConversionError(f"{path}: not valid UTF-8 JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ConversionError(f"{path}: must hold a JSON object")
    return value


@dataclass
class HFModelDir:
    path: Path
    config: dict
    checkpoint: SafetensorsCheckpoint
    text_resources: dict[str, bytes] = field(default_factory=dict)
    vision_resources: dict[str, bytes] = field(default_factory=dict)

    @property
    def model_type(self) -> str:
        return self.config.get("model_type", "")

    @property
    def text_config(self) -> dict:
        return self.config.get("text_config", self.config)

    @property
    def vision_config(self) -> dict | None:
        return self.config.get("vision_config")

    def close(self) -> None:
        self.checkpoint.close()


def load_hf_dir(path: str | Path) -> HFModelDir:
    """Read config.json, locate the weights, and collect the tokenizer/template/processor files."""
    path = Path(path)
    if not path.is_dir():
        raise ConversionError(f"{path}: not a directory (expected a Hugging Face model directory)")
    config_path = path / "config.json"
    if not config_path.exists():
        raise ConversionError(f"{path}: missing config.json")
    config = _json_object(config_path)
    if not isinstance(config.get("model_type"), str):
        raise ConversionError(f"{config_path}: missing model_type")
    text: dict[str, bytes] = {}
    for role in ("tokenizer.json", "tokenizer_config.json"):
        if not (path / role).exists():
            raise ConversionError(f"{path}: missing {role}")
        text[role] = _resource(path / role, role)
    tok_config = json.loads(text["tokenizer_config.json"])
    if (path / "chat_template.jinja").exists():
        text["chat_template.jinja"] = _resource(path / "chat_template.jinja", "chat_template.jinja")
    elif isinstance(tok_config.get("chat_template"), str) and tok_config["chat_template"]:
        text["chat_template.jinja"] = tok_config["chat_template"].encode()
    else:
        raise ConversionError(f"{path}: no chat template (chat_template.jinja or tokenizer_config.json chat_template)")
    if (path / "generation_config.json").exists():
        text["generation_config.json"] = _resource(path / "generation_config.json", "generation_config.json")
    else:  # EOS must come from somewhere; the model config carries it
        cfg = config.get("text_config", config)
        eos = cfg.get("eos_token_id", config.get("eos_token_id"))
        if eos is None:
            raise ConversionError(f"{path}: no generation_config.json and no eos_token_id in config.json")
        text["generation_config.json"] = json.dumps({"eos_token_id": eos}).encode()
    vision: dict[str, bytes] = {}
    if "vision_config" in config:
        for role in VISION_ROLES:
            if (path / role).exists():
                vision[role] = _resource(path / role, role)
        if "preprocessor_config.json" not in vision:
            raise ConversionError(f"{path}: the model has a vision tower but no preprocessor_config.json")
        _check_processor(path, config["vision_config"], vision)
    return HFModelDir(path, config, SafetensorsCheckpoint(path), text, vision)


def _resource(path: Path, role: str) -> bytes:
    data = path.read_bytes()
    if not data:
        raise ConversionError(f"{path}: resource file is empty")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConversionError(f"{path}: resource is not valid UTF-8") from None
    if role in JSON_ROLES:
        _json_object(path)
    return data


def _check_processor(path: Path, vision_config: dict, resources: dict[str, bytes]) -> None:
    """The processor's patch geometry must match the tower's (spec 5, converter rules)."""
    pairs = (("patch_size", "patch_size"), ("temporal_patch_size", "temporal_patch_size"), ("merge_size", "spatial_merge_size"))
    for role, data in resources.items():
        proc = json.loads(data)
        for proc_key, cfg_key in pairs:
            if proc_key in proc and cfg_key in vision_config and proc[proc_key] != vision_config[cfg_key]:
                raise ConversionError(
                    f"{path / role}: {proc_key} is {proc[proc_key]} but the vision config's {cfg_key} is {vision_config[cfg_key]}"
                )
