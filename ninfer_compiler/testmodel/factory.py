"""Build tiny random Hugging Face checkpoints of the four NInfer architectures.

Compiler tests cannot download the real checkpoints, so they convert these instead and compare
against transformers running the same directory. A directory holds what a real release holds:
`config.json`, `generation_config.json`, `model.safetensors` of the top-level
`*ForConditionalGeneration` (names `model.language_model.*`, `model.visual.*`, `lm_head.*`, and
`mtp.*` for Qwen3.5), the tokenizer files, `chat_template.jinja`, and for the Qwen vision towers
`preprocessor_config.json` / `video_preprocessor_config.json`.

Weights are HF's default init plus N(0, 0.05^2) noise on every floating parameter and persistent
buffer. The default init alone makes several paths degenerate (zero-centred norms are the
identity, the PLE conv is zero, GLM's key-pool APE is zero and its gate all ones, mHC base/scale
are 0/1, `e_score_correction_bias` is zero), so parity tests would pass with those paths broken.
Non-persistent buffers (rotary `inv_freq`) are recomputed on load and stay untouched.

Checkpoint layout, compared with a plain `save_pretrained`:

* Qwen-family expert banks are stored fused (`mlp.experts.gate_up_proj [E, 2I, H]`,
  `mlp.experts.down_proj [E, H, I]`), as in the official Qwen3.6-35B-A3B files. transformers
  5.23 would write per-expert `experts.{e}.{gate,up,down}_proj.weight` keys (the reverse of the
  legacy qwen2_moe loading converter); it loads both forms.
* GLM5Next keeps `save_pretrained`'s output, which is already the original naming
  (`hc_attn_fn`, `q_conv1d`, `mlp.experts.{e}.gate_proj`, ...).
* Qwen3.5 Dense/MoE add the MTP head under its official names (`mtp.fc`,
  `mtp.pre_fc_norm_embedding`, `mtp.pre_fc_norm_hidden`, `mtp.layers.0.*`, `mtp.norm`), which
  `transformers.modeling_layers.MtpModel.from_pretrained(main_model)` loads (see configs.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import safetensors
import tokenizers
import torch
import transformers
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import (
    Glm5NextForConditionalGeneration,
    PretrainedConfig,
    PreTrainedModel,
    Qwen3_5ForConditionalGeneration,
    Qwen3_5MoeForConditionalGeneration,
    Qwen4ExpForConditionalGeneration,
)
from transformers.modeling_layers import MtpModel
from transformers.utils import logging as hf_logging

from .configs import ARCHS, has_mtp, make_config
from .tokenizer import flavor_for, generation_config, save_tokenizer

# Bump when the produced files change in a way the source hash below cannot see.
FACTORY_VERSION = 1
NOISE_STD = 0.05
WEIGHTS_FILE = "model.safetensors"

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parents[1]

_EXPERT_BANK = re.compile(r"\.mlp\.experts\.(gate_up_proj|down_proj)$")
# The default init draws from torch's global generator; serialise builds so threads cannot
# interleave their draws.
_INIT_LOCK = threading.Lock()


@dataclass(frozen=True)
class _ArchSpec:
    model_class: type[PreTrainedModel]
    fused_experts: bool  # store MoE expert banks fused, as the real Qwen checkpoints do
    qwen_vision: bool  # write the Qwen image/video processor configs


_SPECS: dict[str, _ArchSpec] = {
    "qwen3_5": _ArchSpec(Qwen3_5ForConditionalGeneration, True, True),
    "qwen3_5_moe": _ArchSpec(Qwen3_5MoeForConditionalGeneration, True, True),
    "qwen4_exp": _ArchSpec(Qwen4ExpForConditionalGeneration, True, True),
    "glm5_next": _ArchSpec(Glm5NextForConditionalGeneration, False, False),
}
assert tuple(_SPECS) == ARCHS


def _spec(arch: str) -> _ArchSpec:
    if arch not in _SPECS:
        raise ValueError(f"unknown test-model architecture {arch!r}; expected one of {ARCHS}")
    return _SPECS[arch]


def randomize_(module: nn.Module, generator: torch.Generator, std: float = NOISE_STD) -> None:
    """Add N(0, std^2) noise in place to every floating parameter and persistent buffer."""
    seen: set[int] = set()
    with torch.no_grad():
        for tensor in module.state_dict(keep_vars=True).values():
            if not tensor.is_floating_point() or id(tensor) in seen:
                continue
            seen.add(id(tensor))
            noise = torch.randn(tensor.shape, generator=generator, dtype=tensor.dtype)
            tensor.add_(noise * std)
            # real checkpoints are bf16: keep every value bf16-representable, so a bf16 artifact
            # holds exactly the weights the fp32 Hugging Face oracle computes with
            tensor.copy_(tensor.to(torch.bfloat16).to(tensor.dtype))


def create_model(arch: str, seed: int = 0) -> tuple[PreTrainedModel, MtpModel | None]:
    """The randomised in-memory model of `arch` and, for Qwen3.5, its MTP head.

    The MTP head shares the target's embedding, lm_head and rotary module, as in transformers.
    """
    spec = _spec(arch)
    config = make_config(arch)
    with _INIT_LOCK, torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = spec.model_class(config)
        mtp = None
        if has_mtp(config):
            mtp = MtpModel(model, config.get_text_config().num_mtp_layers)
            # MtpModel uses the generic PreTrainedModel init: MoE expert banks stay torch.empty
            # (whatever was in memory, so not reproducible) and zero-centred norms become 1.
            # Initialise its layers the way the target's text model initialises its own.
            decoder = model.get_decoder()
            for module in mtp.layers.modules():
                decoder._init_weights(module)
    generator = torch.Generator().manual_seed(seed)
    randomize_(model, generator)
    if mtp is not None:
        randomize_(mtp.layers, generator)  # embedding and head are the target's, done above
        mtp.eval()
    model.eval()
    model.generation_config = generation_config(flavor_for(arch))
    return model, mtp


def mtp_checkpoint_tensors(mtp: MtpModel) -> dict[str, torch.Tensor]:
    """The MTP head under the names of the official Qwen3.5 checkpoints."""
    if len(mtp.layers) != 1:
        raise ValueError("the Qwen3.5 checkpoint layout holds exactly one MTP layer")
    layer = mtp.layers[0]
    tensors = {f"mtp.layers.0.{k}": v for k, v in layer.mtp_block.state_dict().items()}
    tensors["mtp.fc.weight"] = layer.eh_proj.weight
    tensors["mtp.pre_fc_norm_embedding.weight"] = layer.enorm.weight
    tensors["mtp.pre_fc_norm_hidden.weight"] = layer.hnorm.weight
    tensors["mtp.norm.weight"] = layer.post_norm.weight
    return tensors


def _fuse_expert_banks(
    saved: dict[str, torch.Tensor], model: PreTrainedModel
) -> dict[str, torch.Tensor]:
    """Replace per-expert keys written by save_pretrained with the module's fused banks."""
    banks = {k: v for k, v in model.state_dict().items() if _EXPERT_BANK.search(k)}
    prefixes = tuple(k.rsplit(".", 1)[0] + "." for k in banks)

    def is_expert_slice(key: str) -> bool:
        return any(key.startswith(p) and key[len(p) :].split(".")[0].isdigit() for p in prefixes)

    out = {k: v for k, v in saved.items() if not is_expert_slice(k)}
    out.update(banks)
    return out


def _write_weights(out_dir: Path, arch: str, model: PreTrainedModel, mtp: MtpModel | None) -> None:
    path = out_dir / WEIGHTS_FILE
    tensors = load_file(path)
    if _spec(arch).fused_experts:
        tensors = _fuse_expert_banks(tensors, model)
    if mtp is not None:
        tensors.update(mtp_checkpoint_tensors(mtp))
    tensors = {k: v.detach().contiguous() for k, v in tensors.items()}
    save_file(tensors, path, metadata={"format": "pt"})


def qwen_processor_configs(config: PretrainedConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    """preprocessor_config.json and video_preprocessor_config.json matching the vision tower.

    Sizes are pixel-count limits in units of the merge block (patch x merge = 8 px): images get
    2x2 to 8x8 blocks (4..64 placeholder tokens). Normalisation is mean = std = 0.5 (section 6.1).
    """
    vision = config.vision_config
    block = vision.patch_size * vision.spatial_merge_size
    common: dict[str, Any] = {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "merge_size": vision.spatial_merge_size,
        "patch_size": vision.patch_size,
        "processor_class": "Qwen3VLProcessor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "temporal_patch_size": vision.temporal_patch_size,
    }
    image = dict(
        common,
        image_processor_type="Qwen2VLImageProcessor",
        size={"shortest_edge": (2 * block) ** 2, "longest_edge": (8 * block) ** 2},
    )
    video = dict(
        common,
        video_processor_type="Qwen3VLVideoProcessor",
        size={"shortest_edge": (2 * block) ** 2, "longest_edge": 4 * (8 * block) ** 2},
        fps=2,
        min_frames=2,
        max_frames=16,
        do_sample_frames=True,
    )
    return image, video


def glm_processor_configs(config: PretrainedConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    """Processor configs of the GLM tower: the Qwen geometry keys with CLIP normalisation (section 6.3)."""
    image, video = qwen_processor_configs(config)
    clip = {"image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
            "processor_class": "Glm5NextProcessor"}
    return {**image, **clip}, {**video, **clip}


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


@contextmanager
def _quiet_progress() -> Iterator[None]:
    """Hide save_pretrained's one-shard progress bar (noise in test and CLI output)."""
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def build_hf_model(arch: str, out_dir: Path, seed: int = 0) -> Path:
    """Write the tiny random checkpoint of `arch` into `out_dir` (created if missing).

    Deterministic: the same arch and seed give byte-identical files.
    """
    spec = _spec(arch)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model, mtp = create_model(arch, seed)
    with _quiet_progress():
        model.save_pretrained(out_dir)
    _write_weights(out_dir, arch, model, mtp)
    save_tokenizer(out_dir, flavor_for(arch))
    image, video = qwen_processor_configs(model.config) if spec.qwen_vision else glm_processor_configs(model.config)
    _write_json(out_dir / "preprocessor_config.json", image)
    _write_json(out_dir / "video_preprocessor_config.json", video)
    return out_dir


def cache_root() -> Path:
    """`$NINFER_CACHE_DIR/testmodels`, else `<repo>/.cache/ninfer/testmodels` (git-ignored)."""
    base = os.environ.get("NINFER_CACHE_DIR")
    return (Path(base) if base else REPO_ROOT / ".cache" / "ninfer") / "testmodels"


def cache_key(arch: str, seed: int = 0) -> str:
    """Directory name of a cached model: arch, seed, version and a digest of all inputs.

    The digest covers this package's sources, corpus and templates and the library versions,
    so an edit anywhere never serves a stale model.
    """
    _spec(arch)
    digest = hashlib.sha256()
    for part in (
        FACTORY_VERSION,
        transformers.__version__,
        torch.__version__,
        tokenizers.__version__,
        safetensors.__version__,
    ):
        digest.update(f"{part}\0".encode())
    for path in sorted(PACKAGE_DIR.iterdir()):
        if path.suffix in {".py", ".txt", ".jinja"}:
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return f"{arch}-seed{seed}-v{FACTORY_VERSION}-{digest.hexdigest()[:12]}"


def cached_hf_model(arch: str, seed: int = 0) -> Path:
    """Build once per (arch, seed, inputs) into the cache; safe under concurrent test processes.

    Each builder writes into its own temporary directory next to the target and renames it into
    place; rename is atomic, so a visible directory is always complete. A loser of the race
    discards its copy.
    """
    final = cache_root() / cache_key(arch, seed)
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        build_hf_model(arch, tmp, seed)
        tmp.chmod(0o755)
        try:
            os.rename(tmp, final)
        except OSError:
            if not final.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def weight_stats(model_dir: Path) -> tuple[int, int]:
    """(number of weight elements, size in bytes) of the checkpoint in `model_dir`."""
    path = Path(model_dir) / WEIGHTS_FILE
    count = 0
    with safe_open(path, framework="pt") as f:
        for key in f.keys():
            numel = 1
            for dim in f.get_slice(key).get_shape():
                numel *= dim
            count += numel
    return count, path.stat().st_size
