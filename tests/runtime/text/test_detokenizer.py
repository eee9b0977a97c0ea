"""StreamingDetokenizer: pieces never split a character and add up to tokenizer.decode(ids)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

from ninfer_runtime.text import StreamingDetokenizer, Tokenizer

from .conftest import CORPUS
from .test_tokenizer import text_strategy


def stream(detok: StreamingDetokenizer, ids: list[int]) -> list[str]:
    return [detok.push(i) for i in ids] + [detok.flush()]


@settings(max_examples=200, deadline=None)
@given(text=text_strategy)
def test_stream_of_encoded_text_equals_decode(tokenizer: Tokenizer, text: str) -> None:
    ids = tokenizer.encode(text)
    pieces = stream(StreamingDetokenizer(tokenizer), ids)
    assert "".join(pieces) == tokenizer.decode(ids)
    assert pieces[-1] == ""  # a complete text leaves nothing unfinished
    decoded = tokenizer.decode(ids)
    if "\ufffd" not in decoded:
        assert all("\ufffd" not in piece for piece in pieces)  # no character was ever split


@settings(max_examples=200, deadline=None)
@given(data=st.data(), skip=st.booleans())
def test_stream_of_random_ids_equals_decode(tokenizer: Tokenizer, data, skip: bool) -> None:
    # Random ids make invalid UTF-8 on purpose: U+FFFD must land exactly where decode puts it.
    ids = data.draw(st.lists(st.integers(0, tokenizer.vocab_size + 3), max_size=30))
    detok = StreamingDetokenizer(tokenizer, skip_special_tokens=skip)
    assert "".join(stream(detok, ids)) == tokenizer.decode(ids, skip_special_tokens=skip)


def test_multibyte_character_is_held_until_complete(tokenizer: Tokenizer) -> None:
    emoji = next(ch for ch in "😀👍🏽🎉❤你好" if len(tokenizer.encode(ch)) > 1)
    ids = tokenizer.encode("a" + emoji + "b")
    detok = StreamingDetokenizer(tokenizer)
    pieces = [detok.push(i) for i in ids]
    assert "".join(pieces) == "a" + emoji + "b"
    assert all(p in ("", "a", emoji, "b", "a" + emoji, emoji + "b") for p in pieces), pieces


def test_flush_emits_replacement_for_cut_character_and_resets(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("😀")
    assert len(ids) > 1
    detok = StreamingDetokenizer(tokenizer)
    assert detok.push_many(ids[:-1]) == ""
    tail = detok.flush()
    assert tail and set(tail) == {"\ufffd"}
    assert tail == tokenizer.decode(ids[:-1])
    assert detok.push_many(tokenizer.encode("ok")) == "ok"  # fresh stream after flush


def test_special_tokens_kept_or_skipped(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("<|im_start|>hi<think>x<|im_end|>")
    assert StreamingDetokenizer(tokenizer).push_many(ids) == "<|im_start|>hi<think>x<|im_end|>"
    assert StreamingDetokenizer(tokenizer, skip_special_tokens=True).push_many(ids) == "hi<think>x"


def _metaspace_tokenizer() -> Tokenizer:
    tok = BackendTokenizer(models.BPE(unk_token="<unk>"))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<unk>", "<s>"], show_progress=False
    )
    tok.train_from_iterator(CORPUS * 5, trainer=trainer)
    return Tokenizer.from_bytes(tok.to_str())


@pytest.fixture(scope="module")
def metaspace() -> Tokenizer:
    return _metaspace_tokenizer()


@settings(max_examples=100, deadline=None)
@given(
    words=st.lists(
        st.sampled_from(["hello", "world", "你好", "the", "fox", "😀", "x", "<s>", "Über"]),
        max_size=10,
    )
)
def test_window_fallback_for_other_decoders(metaspace: Tokenizer, words: list[str]) -> None:
    assert not metaspace.is_byte_level
    ids = metaspace.encode(" ".join(words))
    assert "".join(stream(StreamingDetokenizer(metaspace), ids)) == metaspace.decode(ids)
