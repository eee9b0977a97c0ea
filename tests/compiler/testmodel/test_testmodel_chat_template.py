"""The chat templates render identically through plain jinja2 and through transformers."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import jinja2
import pytest
from tokenizers import Tokenizer
from transformers import AutoTokenizer

from ninfer_compiler.testmodel.tokenizer import QWEN, render_chat

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city (°C).",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
CALC_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}


def _call(name: str, arguments: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


# (messages, tools, template kwargs)
CONVERSATIONS: list[tuple[list[dict[str, Any]], list[dict[str, Any]] | None, dict[str, Any]]] = [
    ([{"role": "user", "content": "Hi there!"}], None, {"add_generation_prompt": True}),
    (
        [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Name a prime."},
            {"role": "assistant", "content": "7"},
            {"role": "user", "content": "Another one?"},
        ],
        None,
        {"add_generation_prompt": True},
    ),
    (
        [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Hello"}],
        None,
        {"add_generation_prompt": True, "enable_thinking": False},
    ),
    (
        [
            {"role": "user", "content": "Is 221 prime?"},
            {"role": "assistant", "content": "No: 13 × 17.", "reasoning_content": "221/13 = 17.\n"},
            {"role": "user", "content": "And 223?"},
        ],
        None,
        {"add_generation_prompt": True, "enable_thinking": True},
    ),
    (
        [
            {"role": "system", "content": "Use tools."},
            {"role": "user", "content": "Weather in Zürich?"},
        ],
        [WEATHER_TOOL, CALC_TOOL],
        {"add_generation_prompt": True},
    ),
    (
        [
            {"role": "user", "content": "Weather in Oslo and Lima?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    _call("get_weather", {"city": "Oslo"}),
                    _call("get_weather", {"city": "Lima", "unit": "celsius"}),
                ],
            },
            {"role": "tool", "content": '{"temp": -3}'},
            {"role": "tool", "content": '{"temp": 19}'},
            {"role": "assistant", "content": "Oslo −3 °C, Lima 19 °C."},
        ],
        [WEATHER_TOOL],
        {},
    ),
    (
        [
            {"role": "system", "content": "Be exact."},
            {"role": "user", "content": "2+40?"},
            {
                "role": "assistant",
                "content": "Let me add.",
                "tool_calls": [_call("add", '{"a": 2, "b": 40}')],
            },
            {"role": "tool", "content": {"result": 42}},
        ],
        [CALC_TOOL],
        {"add_generation_prompt": True, "enable_thinking": False},
    ),
    (
        [
            {
                "role": "user",
                "content": [{"type": "image"}, {"type": "text", "text": "What is in the picture?"}],
            },
            {"role": "assistant", "content": "A cat on a sofa. 🐈"},
            {"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "And here?"}]},
        ],
        None,
        {"add_generation_prompt": True},
    ),
    (
        [
            {"role": "user", "content": "Add 1 and 2, think first."},
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "Need the add tool.",
                "tool_calls": [_call("add", {"a": 1, "b": 2})],
            },
            {"role": "tool", "content": "3"},
        ],
        [CALC_TOOL],
        {"add_generation_prompt": True, "enable_thinking": False},
    ),
    (
        [
            {"role": "system", "content": "Multilingual 🌍"},
            {"role": "user", "content": "你好！Ça va ?"},
            {"role": "assistant", "content": ""},
            {"role": "user", "content": "   spaces   \n\nand newlines\n"},
            {"role": "assistant", "content": "Noted.\n", "reasoning_content": "Whitespace test."},
        ],
        None,
        {"add_generation_prompt": False},
    ),
]

ARCHS = ["qwen3_5", "glm5_next"]


@pytest.fixture(scope="module")
def tokenizers_by_arch(hf_model_dir: Callable) -> dict[str, tuple[Any, Tokenizer]]:
    return {
        arch: (
            AutoTokenizer.from_pretrained(hf_model_dir(arch)),
            Tokenizer.from_file(str(hf_model_dir(arch) / "tokenizer.json")),
        )
        for arch in ARCHS
    }


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("index", range(len(CONVERSATIONS)))
def test_plain_jinja_matches_transformers(arch: str, index: int, tokenizers_by_arch: dict) -> None:
    tok, raw = tokenizers_by_arch[arch]
    messages, tools, kwargs = CONVERSATIONS[index]
    rendered = render_chat(tok.chat_template, copy.deepcopy(messages), tools=tools, **kwargs)
    via_hf = tok.apply_chat_template(copy.deepcopy(messages), tools=tools, tokenize=False, **kwargs)
    assert rendered == via_hf

    ids = tok.apply_chat_template(
        copy.deepcopy(messages), tools=tools, tokenize=True, return_dict=False, **kwargs
    )
    assert ids == tok.encode(rendered, add_special_tokens=False)
    assert ids == raw.encode(rendered, add_special_tokens=False).ids


def test_qwen_rendering_golden() -> None:
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "U"},
        {
            "role": "assistant",
            "content": "A",
            "reasoning_content": "R",
            "tool_calls": [_call("add", {"a": 1})],
        },
        {"role": "tool", "content": "3"},
        {"role": "tool", "content": "4"},
    ]
    out = render_chat(
        QWEN.chat_template(),
        messages,
        tools=[CALC_TOOL],
        add_generation_prompt=True,
        enable_thinking=False,
    )
    signature = (
        '{"name": "add", "description": "Add two integers.", "parameters": {"type": "object", '
        '"properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}'
    )
    # product.md 7.1: the tools header first, the user's system text after a blank line
    assert out.startswith("<|im_start|>system\n# Tools\n\n")
    assert f"<tools>\n{signature}\n</tools>" in out
    assert "</tool_call>\n\nS<|im_end|>\n" in out
    # reasoning of the assistant turn after the last user query is kept; calls in the XML format
    assert out.endswith(
        "<|im_start|>user\nU<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nR\n</think>\n\nA\n\n"
        "<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n3\n</tool_response>\n<tool_response>\n4\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


def test_qwen_reasoning_of_earlier_turns_is_dropped() -> None:
    messages = [
        {"role": "user", "content": "U1"},
        {"role": "assistant", "content": "A1", "reasoning_content": "old"},
        {"role": "user", "content": "U2"},
    ]
    out = render_chat(QWEN.chat_template(), messages, add_generation_prompt=True)
    assert "old" not in out
    assert out.endswith("<|im_start|>assistant\n<think>\n")


@pytest.mark.parametrize("arch", ARCHS)
def test_misplaced_system_message_raises(arch: str, tokenizers_by_arch: dict) -> None:
    tok, _ = tokenizers_by_arch[arch]
    messages = [{"role": "user", "content": "a"}, {"role": "system", "content": "late"}]
    with pytest.raises(jinja2.exceptions.TemplateError, match="first message"):
        render_chat(tok.chat_template, messages)
    with pytest.raises(jinja2.exceptions.TemplateError, match="first message"):
        tok.apply_chat_template(messages, tokenize=False)
