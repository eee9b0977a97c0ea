"""The tiny HF checkpoints: load back, run, round-trip, determinism, naming snapshot, cache."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForImageTextToText
from transformers.modeling_layers import MtpModel

from ninfer_compiler.testmodel import factory
from ninfer_compiler.testmodel.configs import ARCHS, make_config
from ninfer_compiler.testmodel.factory import (
    build_hf_model,
    cache_key,
    cached_hf_model,
    create_model,
    weight_stats,
)

SNAPSHOT = Path(__file__).with_name("param_names.json")
UPDATE_SNAPSHOT = os.environ.get("NINFER_UPDATE_SNAPSHOTS") == "1"

# Parameters of the top-level model (models.md section 9: 0.53 M, 0.65 M, 0.83 M, 0.49 M) and of
# the MTP head.
MAIN_PARAMS = {
    "qwen3_5": 528_068,
    "qwen3_5_moe": 653_252,
    "qwen4_exp": 830_916,
    "glm5_next": 487_742,
}
MTP_PARAMS = {"qwen3_5": 98_752, "qwen3_5_moe": 130_048}

MTP_ARCHS = tuple(MTP_PARAMS)


def _media_inputs(arch: str, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """70 text ids with one 16x16 image (grid 1x4x4 -> 4 placeholders) placed as the model expects."""
    ids = torch.randint(2, 400, (1, 70), generator=generator)
    # Qwen: <|vision_start|> 4 x <|image_pad|> <|vision_end|>; GLM: <|begin_of_image|> 4 x <|image|> <|end_of_image|>
    ids[0, 10:16] = torch.tensor([502, 500, 500, 500, 500, 503])
    inputs = {
        "input_ids": ids,
        "pixel_values": torch.randn(16, 96, generator=generator),
        "image_grid_thw": torch.tensor([[1, 4, 4]]),
    }
    if arch != "glm5_next":
        inputs["mm_token_type_ids"] = (ids == 500).long()
    return inputs


def _load(model_dir: Path) -> torch.nn.Module:
    return AutoModelForImageTextToText.from_pretrained(
        model_dir, attn_implementation="eager"
    ).eval()


def _files(model_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(model_dir.iterdir())}


def _checkpoint_shapes(model_dir: Path) -> dict[str, str]:
    with safe_open(model_dir / factory.WEIGHTS_FILE, framework="pt") as f:
        return {
            k: f"{list(f.get_slice(k).get_shape())} {f.get_slice(k).get_dtype()}"
            for k in sorted(f.keys())
        }


@pytest.mark.parametrize("arch", ARCHS)
def test_parameter_counts(arch: str) -> None:
    model, mtp = create_model(arch)
    assert sum(p.numel() for p in model.parameters()) == MAIN_PARAMS[arch]
    if arch in MTP_PARAMS:
        assert sum(p.numel() for p in mtp.layers.parameters()) == MTP_PARAMS[arch]
    else:
        assert mtp is None


@pytest.mark.parametrize("arch", ARCHS)
def test_load_round_trip_and_forward(arch: str, hf_model_dir: Callable[[str], Path]) -> None:
    model_dir = hf_model_dir(arch)
    loaded = _load(model_dir)
    reference, _ = create_model(arch)
    assert type(loaded) is type(reference)
    assert loaded.config._attn_implementation == "eager"
    assert loaded.dtype == torch.float32

    want, got = reference.state_dict(), loaded.state_dict()
    assert list(got) == list(want)
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), name

    inputs = _media_inputs(arch, torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = loaded(**inputs).logits
        expected = reference(**inputs).logits
    assert logits.shape == (1, 70, 512)
    assert torch.isfinite(logits).all()
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", MTP_ARCHS)
def test_mtp_head_loads_from_official_names(arch: str, hf_model_dir: Callable[[str], Path]) -> None:
    model_dir = hf_model_dir(arch)
    names = _checkpoint_shapes(model_dir)
    for name in (
        "mtp.fc.weight",
        "mtp.pre_fc_norm_embedding.weight",
        "mtp.pre_fc_norm_hidden.weight",
        "mtp.norm.weight",
        "mtp.layers.0.self_attn.q_proj.weight",
    ):
        assert name in names
    assert names["mtp.fc.weight"].startswith("[64, 128]")  # [H, 2H]: embedding, then hidden

    loaded = _load(model_dir)
    mtp = MtpModel.from_pretrained(loaded)
    _, reference = create_model(arch)
    want, got = reference.state_dict(), mtp.state_dict()
    assert set(got) == set(want)
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), name
    # Nothing left at a transformers default: zero-centred norms were randomised, and the expert
    # banks MtpModel leaves uninitialised were initialised before the noise.
    for name, tensor in reference.layers.state_dict().items():
        assert tensor.abs().max() < 1.0, name

    ids = _media_inputs(arch, torch.Generator().manual_seed(2))["input_ids"][:, :21]
    with torch.no_grad():
        hidden = loaded(input_ids=ids[:, :20], output_hidden_states=True).hidden_states[-1]
        draft = mtp.forward_layer(0, hidden, torch.arange(20)[None], None, input_ids=ids[:, 1:21])
    assert draft.shape == (1, 20, 64)
    assert torch.isfinite(draft).all()


@pytest.mark.parametrize("arch", ARCHS)
def test_every_float_tensor_is_randomised(arch: str) -> None:
    model, mtp = create_model(arch)
    tensors = dict(model.state_dict())
    if mtp is not None:
        tensors.update({f"mtp.{k}": v for k, v in mtp.layers.state_dict().items()})
    for name, tensor in tensors.items():
        if tensor.is_floating_point():
            # Norm weights, PLE conv, kpool ape/gate, mHC base/scale, e_score_correction_bias:
            # a constant tensor means the noise was not applied.
            assert tensor.numel() == 1 or tensor.std() > 0.01, name


def test_parameter_name_snapshot(hf_model_dir: Callable[[str], Path]) -> None:
    """Checkpoint names, shapes and dtypes per arch; regenerate with NINFER_UPDATE_SNAPSHOTS=1."""
    actual = {arch: _checkpoint_shapes(hf_model_dir(arch)) for arch in ARCHS}
    if UPDATE_SNAPSHOT:
        SNAPSHOT.write_text(json.dumps(actual, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    assert SNAPSHOT.exists(), f"missing {SNAPSHOT.name}; run with NINFER_UPDATE_SNAPSHOTS=1"
    expected = json.loads(SNAPSHOT.read_text(encoding="utf-8"))
    for arch in ARCHS:
        assert actual[arch] == expected[arch], arch


def test_real_checkpoint_naming(hf_model_dir: Callable[[str], Path]) -> None:
    qwen = _checkpoint_shapes(hf_model_dir("qwen3_5_moe"))
    assert "model.language_model.layers.0.mlp.experts.gate_up_proj" in qwen  # fused banks
    assert "mtp.layers.0.mlp.experts.gate_up_proj" in qwen
    assert not any(".experts.0." in k for k in qwen)
    assert any(k.startswith("model.visual.") for k in qwen) and "lm_head.weight" in qwen
    glm = _checkpoint_shapes(hf_model_dir("glm5_next"))
    for name in (
        "model.language_model.layers.0.hc_attn_fn",
        "model.language_model.layers.0.self_attn.q_conv1d.weight",
        "model.language_model.layers.3.mlp.experts.0.gate_proj.weight",
        "model.language_model.layers.3.mlp.gate.e_score_correction_bias",
        "model.language_model.layers.3.self_attn.indexer.index_kpool_compress_ape",
    ):
        assert name in glm
    q4 = _checkpoint_shapes(hf_model_dir("qwen4_exp"))
    assert any("ngram_embedding" in k for k in q4)


@pytest.mark.parametrize("arch", ARCHS)
def test_build_is_deterministic(
    arch: str, tmp_path: Path, hf_model_dir: Callable[[str], Path]
) -> None:
    again = build_hf_model(arch, tmp_path / "again")
    assert _files(again) == _files(hf_model_dir(arch))
    other = build_hf_model(arch, tmp_path / "seed1", seed=1)
    assert _files(other)["model.safetensors"] != _files(again)["model.safetensors"]
    assert _files(other)["tokenizer.json"] == _files(again)["tokenizer.json"]


@pytest.mark.parametrize("arch", ARCHS)
def test_side_files(arch: str, hf_model_dir: Callable[[str], Path]) -> None:
    model_dir = hf_model_dir(arch)
    for name in (
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
    ):
        assert (model_dir / name).is_file(), name
    config = json.loads((model_dir / "config.json").read_text())
    assert config["architectures"] == [type(create_model(arch)[0]).__name__]
    generation = json.loads((model_dir / "generation_config.json").read_text())
    assert generation["pad_token_id"] == 0
    assert generation["eos_token_id"] in (1, [1, 12, 14])

    vision = make_config(arch).vision_config
    for name in ("preprocessor_config.json", "video_preprocessor_config.json"):
        processor = json.loads((model_dir / name).read_text())
        assert processor["patch_size"] == vision.patch_size
        assert processor["temporal_patch_size"] == vision.temporal_patch_size
        assert processor["merge_size"] == vision.spatial_merge_size
        if arch == "glm5_next":  # CLIP normalisation (models.md 6.3)
            assert processor["image_mean"][0] == 0.48145466
        else:
            assert processor["image_mean"] == processor["image_std"] == [0.5, 0.5, 0.5]


def test_weight_stats(hf_model_dir: Callable[[str], Path]) -> None:
    count, size = weight_stats(hf_model_dir("qwen3_5"))
    assert count == MAIN_PARAMS["qwen3_5"] + MTP_PARAMS["qwen3_5"]
    assert 4 * count < size < 4 * count + 100_000  # fp32 data plus the header


def test_cached_model_is_built_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NINFER_CACHE_DIR", str(tmp_path))
    calls: list[Path] = []
    real_build = factory.build_hf_model

    def counting_build(arch: str, out_dir: Path, seed: int = 0) -> Path:
        calls.append(out_dir)
        return real_build(arch, out_dir, seed)

    monkeypatch.setattr(factory, "build_hf_model", counting_build)
    first = cached_hf_model("glm5_next", seed=2)
    second = cached_hf_model("glm5_next", seed=2)
    assert first == second == tmp_path / "testmodels" / cache_key("glm5_next", 2)
    assert len(calls) == 1
    assert sorted(p.name for p in first.parent.iterdir()) == [first.name]  # no temp dirs left
    assert (first / "model.safetensors").is_file()
    assert cache_key("glm5_next", 2) != cache_key("glm5_next", 3) != cache_key("qwen3_5", 3)


def test_cached_model_race_loser_keeps_winner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that finishes second discards its copy and returns the winner's directory."""
    monkeypatch.setenv("NINFER_CACHE_DIR", str(tmp_path))
    final = tmp_path / "testmodels" / cache_key("glm5_next")
    real_build = factory.build_hf_model

    def build_while_another_process_wins(arch: str, out_dir: Path, seed: int = 0) -> Path:
        real_build(arch, final, seed)
        (final / "winner").write_text("first")
        return real_build(arch, out_dir, seed)

    monkeypatch.setattr(factory, "build_hf_model", build_while_another_process_wins)
    assert cached_hf_model("glm5_next") == final
    assert (final / "winner").read_text() == "first"
    assert [p.name for p in final.parent.iterdir()] == [final.name]
