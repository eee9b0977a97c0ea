"""Tokenizer: same ids, decode and special tokens as transformers' AutoTokenizer on the same files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import pre_tokenizers

from ninfer_runtime.text import Tokenizer, TokenizerError
from ninfer_runtime.text.tokenizer import byte_level_char_to_byte

from .conftest import CONTROL_TOKENS, CORPUS

MARKERS = [content for content, _ in CONTROL_TOKENS] + ["<|extra_0|>"]

VARIED_TEXTS = [
    "",
    " ",
    "hello",
    "  leading and trailing  ",
    "The quick brown fox jumps over the lazy dog.",
    "<|im_start|>user\nWhat's the weather?<|im_end|>\n<|im_start|>assistant\n",
    "<think>\nreasoning\n</think>\n\nanswer",
    "<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>",
    "<|im_end|><|im_end|>x<|endoftext|>",
    "<|im_start",
    "<think",
    "</think >",
    "emoji 😀👍🏽🇫🇷 and 你好世界 and Привет",
    "\n\n\n\t\r\n  \u00a0\u3000",
    "café vs cafe\u0301",  # NFC normalization
    "<|extra_0|> extra special",
    "a" * 300,
    "unknown chars: \U0001f9ec \u2603 \x00 \x7f",
] + CORPUS

text_strategy = st.lists(
    st.one_of(
        st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12),
        st.sampled_from(MARKERS),
        st.sampled_from(["😀", "👨‍👩‍👧‍👦", "你好", "é", " ", "\n", "<", "|", "think>"]),
    ),
    max_size=12,
).map("".join)


def test_same_ids_as_transformers_on_varied_text(tokenizer: Tokenizer, hf_tokenizer) -> None:
    for text in VARIED_TEXTS:
        assert tokenizer.encode(text) == hf_tokenizer.encode(text, add_special_tokens=False), text
        assert tokenizer.encode(text, add_special_tokens=True) == hf_tokenizer.encode(text), text


@settings(max_examples=150, deadline=None)
@given(text=text_strategy)
def test_same_ids_as_transformers_property(tokenizer: Tokenizer, hf_tokenizer, text: str) -> None:
    ids = tokenizer.encode(text)
    assert ids == hf_tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == hf_tokenizer.decode(ids)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_decode_random_ids_matches_transformers(tokenizer: Tokenizer, hf_tokenizer, data) -> None:
    ids = data.draw(st.lists(st.integers(0, tokenizer.vocab_size - 1), max_size=20))
    for skip in (False, True):
        assert tokenizer.decode(ids, skip_special_tokens=skip) == hf_tokenizer.decode(
            ids, skip_special_tokens=skip
        )


def test_special_tokens(tokenizer: Tokenizer, hf_tokenizer) -> None:
    assert tokenizer.special_tokens_map == hf_tokenizer.special_tokens_map
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.eos_token_id == hf_tokenizer.eos_token_id
    assert tokenizer.pad_token_id == hf_tokenizer.pad_token_id
    assert tokenizer.bos_token is None and tokenizer.bos_token_id is None
    for content in MARKERS:
        assert tokenizer.special_token_id(content) == hf_tokenizer.convert_tokens_to_ids(content)
    assert tokenizer.is_special(tokenizer.special_token_id("<|im_end|>"))
    assert not tokenizer.is_special(tokenizer.special_token_id("<think>"))
    assert tokenizer.is_special(tokenizer.special_token_id("<|extra_0|>"))
    with pytest.raises(TokenizerError, match="not an added token"):
        tokenizer.special_token_id("<nope>")
    assert tokenizer.vocab_size == len(hf_tokenizer)


def test_eos_ids_from_generation_config(tokenizer: Tokenizer, hf_dir: Path) -> None:
    im_end = tokenizer.special_token_id("<|im_end|>")
    assert tokenizer.eos_token_ids == [im_end, tokenizer.special_token_id("<|endoftext|>")]
    single = Tokenizer.from_bytes(
        (hf_dir / "tokenizer.json").read_bytes(),
        (hf_dir / "tokenizer_config.json").read_bytes(),
        json.dumps({"eos_token_id": im_end}).encode(),
    )
    assert single.eos_token_ids == [im_end]
    no_gen = Tokenizer.from_bytes(
        (hf_dir / "tokenizer.json").read_bytes(), (hf_dir / "tokenizer_config.json").read_bytes()
    )
    assert no_gen.eos_token_ids == [im_end]
    with pytest.raises(TokenizerError, match="eos_token_id"):
        Tokenizer.from_bytes(
            (hf_dir / "tokenizer.json").read_bytes(), None, b'{"eos_token_id": "x"}'
        )


def test_token_bytes_rebuild_decode(tokenizer: Tokenizer) -> None:
    assert tokenizer.is_byte_level
    assert set(byte_level_char_to_byte()) == set(pre_tokenizers.ByteLevel.alphabet())
    assert sorted(byte_level_char_to_byte().values()) == list(range(256))
    ids = list(range(tokenizer.vocab_size))
    joined = b"".join(tokenizer.token_bytes(i) for i in ids)
    assert joined.decode("utf-8", errors="replace") == tokenizer.decode(ids)
    assert tokenizer.token_bytes(tokenizer.special_token_id("<think>")) == b"<think>"
    assert tokenizer.token_bytes(10**6) == b""


def test_v4_style_config(hf_dir: Path, tmp_path: Path) -> None:
    """added_tokens_decoder flags, additional_special_tokens, AddedToken objects, *_token keys."""
    from transformers import AutoTokenizer

    shutil.copy(hf_dir / "tokenizer.json", tmp_path / "tokenizer.json")
    backend = json.loads((hf_dir / "tokenizer.json").read_text())
    decoder = {
        str(t["id"]): {
            k: t[k] for k in ("content", "lstrip", "normalized", "rstrip", "single_word", "special")
        }
        for t in backend["added_tokens"]
    }
    think_id = next(k for k, v in decoder.items() if v["content"] == "<think>")
    decoder[think_id]["special"] = True  # the config overrides tokenizer.json's flag
    config = {
        "added_tokens_decoder": decoder,
        "additional_special_tokens": ["<|im_start|>", "<|new_extra|>"],
        "bos_token": {
            "__type": "AddedToken",
            "content": "<|bos|>",
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        },
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "image_token": "<|image_pad|>",
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": [
            {"name": "default", "template": "A"},
            {"name": "tool_use", "template": "B"},
        ],
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    ours = Tokenizer.from_dir(tmp_path)
    hf = AutoTokenizer.from_pretrained(tmp_path)
    assert ours.special_tokens_map == hf.special_tokens_map
    assert ours.chat_template == {"default": "A", "tool_use": "B"}
    assert ours.bos_token_id == hf.bos_token_id is not None
    text = "<|bos|><think>x</think><|image_pad|><|new_extra|> y<|im_start|>"
    ids = ours.encode(text)
    assert ids == hf.encode(text, add_special_tokens=False)
    assert ours.vocab_size == len(hf)
    for skip in (False, True):
        assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(
            ids, skip_special_tokens=skip
        )
    assert ours.decode(ids, skip_special_tokens=True) == "x</think> y"


def test_chat_template_file_wins(hf_dir: Path) -> None:
    config = json.loads((hf_dir / "tokenizer_config.json").read_text())
    config["chat_template"] = "from config"
    tok_json = (hf_dir / "tokenizer.json").read_bytes()
    assert Tokenizer.from_bytes(tok_json, json.dumps(config)).chat_template == "from config"
    with_file = Tokenizer.from_bytes(tok_json, json.dumps(config), None, b"from file")
    assert with_file.chat_template == "from file"


def test_errors_name_the_resource(hf_dir: Path) -> None:
    with pytest.raises(TokenizerError, match="tokenizer.json"):
        Tokenizer.from_bytes(b'{"model": 1}')
    with pytest.raises(TokenizerError, match="tokenizer_config.json is not valid JSON"):
        Tokenizer.from_bytes((hf_dir / "tokenizer.json").read_bytes(), b"{")
    with pytest.raises(TokenizerError, match="no tokenizer.json"):
        Tokenizer.from_dir(hf_dir / "missing")
