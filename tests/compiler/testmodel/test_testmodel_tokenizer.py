"""The tiny BPE tokenizers: fixed special ids, determinism, round trips through transformers."""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Callable
from pathlib import Path

import pytest
from tokenizers import Tokenizer
from transformers import AutoTokenizer

from ninfer_compiler.testmodel.configs import GLM_MEDIA_TOKEN_IDS, QWEN_MEDIA_TOKEN_IDS
from ninfer_compiler.testmodel.tokenizer import GLM, QWEN, TokenizerFlavor, train_tokenizer

ARCH_OF_FLAVOR = {"qwen": "qwen3_5", "glm": "glm5_next"}

TEXTS = [
    "Hello, world! The quick brown fox jumps over 13 lazy dogs.",
    "Café crème, naïve façade, Ærøskøbing, São Paulo, Kraków, İstanbul",
    "春天来了，公园里的樱花都开了。今日は雨です。오늘은 맑습니다.",
    "Emoji: 😀🎉🐈‍⬛ 👩🏽‍💻 ❤️ — flags 🇫🇷🇯🇵",
    "def f(x: int) -> int:\n    return x ** 2  # 3.14159\n\n\n\tindent\r\nCRLF",
    "Numbers 0 1 12 123 1234 12345 -7.5e-3 0xFF 2024-02-29T23:59:59Z €12.50",
    "   leading spaces and trailing   ",
    "Rare bytes: \x00\x07\x1b[0m \u200b zero width, \U0001f9ec dna, \u0301 lone combining",
    "<|im_start|>user\nHi<|im_end|>\n<think>\nhmm\n</think>\n\n<tool_call>{}</tool_call>",
    "",
]


def _tokenizer_dir(flavor: TokenizerFlavor, hf_model_dir: Callable[[str], Path]) -> Path:
    return hf_model_dir(ARCH_OF_FLAVOR[flavor.name])


@pytest.mark.parametrize("flavor", [QWEN, GLM], ids=lambda f: f.name)
def test_fixed_ids_and_vocabulary_size(flavor: TokenizerFlavor, hf_model_dir: Callable) -> None:
    tok = AutoTokenizer.from_pretrained(_tokenizer_dir(flavor, hf_model_dir))
    assert tok.pad_token == "<|endoftext|>" and tok.pad_token_id == 0
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 1
    expected = {
        "<|endoftext|>": 0,
        "<|im_end|>": 1,
        "<|im_start|>": 2,
        "<think>": 3,
        "</think>": 4,
        "<tool_call>": 5,
        "</tool_call>": 6,
        "<tool_response>": 7,
        "</tool_response>": 8,
    }
    if flavor is QWEN:
        media = dict(zip(flavor.media_tokens, QWEN_MEDIA_TOKEN_IDS.values(), strict=True))
        assert media["<|image_pad|>"] == 500 and media["<|vision_end|>"] == 503
    else:
        media = dict(zip(flavor.media_tokens, GLM_MEDIA_TOKEN_IDS.values(), strict=True))
        assert media["<|image|>"] == 500 and media["<|end_of_video|>"] == 505
        expected.update({"<|user|>": 12, "<|observation|>": 14})
    expected.update(media)
    for token, token_id in expected.items():
        assert tok.convert_tokens_to_ids(token) == token_id, token
        assert tok.encode(token, add_special_tokens=False) == [token_id], token
    assert len(tok) == 500 + len(flavor.media_tokens)
    assert max(tok.get_vocab().values()) < 512


@pytest.mark.parametrize("flavor", [QWEN, GLM], ids=lambda f: f.name)
def test_training_is_deterministic(flavor: TokenizerFlavor, hf_model_dir: Callable) -> None:
    saved = (_tokenizer_dir(flavor, hf_model_dir) / "tokenizer.json").read_text(encoding="utf-8")
    assert train_tokenizer(flavor).to_str(pretty=True) == saved
    assert train_tokenizer(flavor).to_str() == train_tokenizer(flavor).to_str()


@pytest.mark.parametrize("flavor", [QWEN, GLM], ids=lambda f: f.name)
@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(flavor: TokenizerFlavor, text: str, hf_model_dir: Callable) -> None:
    model_dir = _tokenizer_dir(flavor, hf_model_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    raw = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    ids = tok.encode(text, add_special_tokens=False)
    assert ids == raw.encode(text, add_special_tokens=False).ids
    assert all(0 <= i < 512 for i in ids)
    normalized = unicodedata.normalize("NFC", text)  # the normalizer composes accents
    assert tok.decode(ids) == normalized
    assert raw.decode(ids, skip_special_tokens=False) == normalized


def test_decode_keeps_think_and_tool_markers(hf_model_dir: Callable) -> None:
    tok = AutoTokenizer.from_pretrained(hf_model_dir("qwen3_5"))
    text = "<|im_start|>assistant\n<think>\nx\n</think>\n\n<tool_call>\n{}\n</tool_call><|im_end|>"
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=True) == (
        "assistant\n<think>\nx\n</think>\n\n<tool_call>\n{}\n</tool_call>"
    )


@pytest.mark.parametrize("arch", ["qwen3_5", "glm5_next"])
def test_tokenizer_config(arch: str, hf_model_dir: Callable) -> None:
    model_dir = hf_model_dir(arch)
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    assert config["eos_token"] == "<|im_end|>" and config["pad_token"] == "<|endoftext|>"
    tok = AutoTokenizer.from_pretrained(model_dir)
    assert tok.chat_template == (model_dir / "chat_template.jinja").read_text(encoding="utf-8")
    assert type(tok).__name__ == ("Qwen3_5Tokenizer" if arch == "qwen3_5" else "TokenizersBackend")
