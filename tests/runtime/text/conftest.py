"""A small byte-level BPE tokenizer trained here, saved as transformers saves one, shared by the tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers, trainers
from tokenizers import Tokenizer as BackendTokenizer

from ninfer_runtime.text import Tokenizer

# (content, special): Qwen marks the turn tokens special and the think/tool markers not.
CONTROL_TOKENS = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<think>", False),
    ("</think>", False),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
)

CORPUS = [
    "The quick brown fox jumps over the lazy dog. It's 12:45 and we've got 3,141 items!",
    "def add(a, b):\n    return a + b\n\nprint(add(1, 2))  # => 3\n",
    "Bonjour, ça va ? Très bien, merci. Über Straße naïve café résumé.",
    "你好，世界！今天天气很好。我们一起去公园散步吧。机器学习和自然语言处理。",
    "こんにちは世界。カタカナとひらがな。東京タワー。",
    "Emoji test 😀😃😄 👍🏽 🇫🇷 ❤️ 🎉🎉 family: 👨‍👩‍👧‍👦",
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}',
    "<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>",
    "Привет, как дела? Ελληνικά γράμματα. עברית. العربية.",
    "   indented\n\n\n\ttabs\r\nwindows line\n",
]


def train_backend() -> BackendTokenizer:
    """Byte-level BPE with the Qwen-style control tokens (deterministic)."""
    tok = BackendTokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=700,
        special_tokens=[content for content, _ in CONTROL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 20, trainer=trainer)
    data = json.loads(tok.to_str())
    flags = dict(CONTROL_TOKENS)
    for entry in data["added_tokens"]:
        entry["special"] = flags[entry["content"]]
    return BackendTokenizer.from_str(json.dumps(data, ensure_ascii=False))


@pytest.fixture(scope="session")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Directory written by `PreTrainedTokenizerFast.save_pretrained`, plus a generation config."""
    from transformers import PreTrainedTokenizerFast

    out = tmp_path_factory.mktemp("tokenizer")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=train_backend(),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        extra_special_tokens=[AddedToken("<|extra_0|>", special=True, normalized=False)],
    )
    fast.save_pretrained(out)
    eos = [fast.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    return out


@pytest.fixture(scope="session")
def hf_tokenizer(hf_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(hf_dir)


@pytest.fixture(scope="session")
def tokenizer(hf_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(hf_dir)
