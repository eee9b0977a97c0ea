"""Tokenizer and chat template read back from an artifact behave exactly like transformers'.

For each architecture's tiny model: convert, then build the runtime `Tokenizer` and
`ChatTemplate` from the artifact's text resources alone, and compare rendered prompts and token
ids with `AutoTokenizer` + `apply_chat_template` on the HF directory, for the varied conversations
of the test-model suite (system, multi-turn, tools, tool calls and responses, thinking on/off).
"""

from __future__ import annotations

import copy

import pytest
from transformers import AutoTokenizer

from ninfer_compiler.convert.driver import convert
from ninfer_compiler.testmodel.factory import cached_hf_model
from ninfer_runtime.artifact import Artifact
from ninfer_runtime.text import ChatTemplate, Tokenizer

from ..testmodel.test_testmodel_chat_template import CONVERSATIONS

TEXTS = ["Hello, world!", "Zürich 東京 🙂 naïve café", "def f(x):\n    return x ** 2\n", "  spaces\t\ttabs\n\n",
         "<|im_start|>user\nhi<|im_end|>", "<think>\nmaybe\n</think>\n\nyes", "1234567890 3.14159 -0.5e-3"]


@pytest.fixture(scope="module", params=["qwen3_5", "glm5_next"])
def pair(request, tmp_path_factory):
    hf_dir = cached_hf_model(request.param)
    art_path = tmp_path_factory.mktemp(request.param) / "m.ninfer"
    convert(hf_dir, art_path, "bf16")
    with Artifact(art_path) as art:
        tok = Tokenizer.from_bytes(*(art.resource("text", r) for r in (
            "tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja")))
    return AutoTokenizer.from_pretrained(hf_dir), tok


def test_token_ids_match(pair):
    hf, ours = pair
    for text in TEXTS:
        assert ours.encode(text) == hf.encode(text, add_special_tokens=False), text
        ids = ours.encode(text)
        assert ours.decode(ids) == hf.decode(ids)


@pytest.mark.parametrize("index", range(len(CONVERSATIONS)))
def test_chat_template_matches(pair, index):
    hf, ours = pair
    messages, tools, kwargs = CONVERSATIONS[index]
    kwargs = {"add_generation_prompt": False, **kwargs}  # transformers' default
    want = hf.apply_chat_template(copy.deepcopy(messages), tools=tools, tokenize=False, **kwargs)
    got = ChatTemplate.from_tokenizer(ours).render(copy.deepcopy(messages), tools=tools, **kwargs)
    assert got == want
    assert ours.encode(got) == hf.apply_chat_template(copy.deepcopy(messages), tools=tools, tokenize=True,
                                                      return_dict=False, **kwargs)


def test_enough_conversations():
    assert len(CONVERSATIONS) >= 10
