"""ChatTemplate renders exactly what transformers' apply_chat_template(tokenize=False) renders."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from ninfer_runtime.text import ChatTemplate, ChatTemplateError, Tokenizer, render_tool_call

from .qwen_template import QWEN_TEMPLATE

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city — «météo» 天气",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
            },
            "required": ["city"],
        },
    },
}
SEARCH_TOOL = {
    "name": "search",
    "description": "Web <search> & more",
    "parameters": {"type": "object"},
}

CALL_1 = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 3}},
}
CALL_2 = {
    "id": "call_2",
    "type": "function",
    "function": {
        "name": "search",
        "arguments": {"q": "a\nb <x>", "filters": {"lang": ["fr", "en"], "safe": True}},
    },
}

CASES: list[tuple[str, dict[str, Any]]] = [
    ("single user", {"messages": [{"role": "user", "content": "Hi there"}]}),
    (
        "system and user",
        {
            "messages": [
                {"role": "system", "content": "  Be brief.\n"},
                {"role": "user", "content": "What is 2+2?"},
            ]
        },
    ),
    (
        "multi turn",
        {
            "messages": [
                {"role": "user", "content": "Hello"},
                {"role": "assistant", "content": "Hi! How can I help?"},
                {"role": "user", "content": "Tell me a joke."},
                {"role": "assistant", "content": "Why did the chicken cross the road?"},
                {"role": "user", "content": "Why?"},
            ]
        },
    ),
    (
        "tools",
        {
            "messages": [{"role": "user", "content": "Weather in Paris?"}],
            "tools": [WEATHER_TOOL, SEARCH_TOOL],
        },
    ),
    (
        "tools and system",
        {
            "messages": [
                {"role": "system", "content": "You are a helpful agent."},
                {"role": "user", "content": "Weather in Paris?"},
            ],
            "tools": [WEATHER_TOOL],
        },
    ),
    (
        "assistant tool call and response",
        {
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [CALL_1]},
                {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
            ],
            "tools": [WEATHER_TOOL],
        },
    ),
    (
        "several calls, grouped responses, reasoning after last query",
        {
            "messages": [
                {"role": "system", "content": "sys"},
                {"role": "user", "content": "Plan my trip."},
                {
                    "role": "assistant",
                    "content": "Let me check.",
                    "reasoning_content": "\nNeed weather and search.\n",
                    "tool_calls": [CALL_1, CALL_2],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
                {"role": "tool", "tool_call_id": "call_2", "content": "results"},
            ],
            "tools": [WEATHER_TOOL, SEARCH_TOOL],
            "enable_thinking": True,
        },
    ),
    (
        "reasoning before last query is dropped",
        {
            "messages": [
                {"role": "user", "content": "First"},
                {"role": "assistant", "content": "One", "reasoning_content": "old thoughts"},
                {"role": "user", "content": "Second"},
                {"role": "assistant", "content": "Two", "reasoning_content": "new thoughts"},
            ],
            "add_generation_prompt": False,
        },
    ),
    (
        "reasoning split from content",
        {
            "messages": [
                {"role": "user", "content": "Q"},
                {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nThe answer."},
                {"role": "user", "content": "<tool_response>\nnot a query\n</tool_response>"},
            ]
        },
    ),
    (
        "thinking off",
        {"messages": [{"role": "user", "content": "Quick answer"}], "enable_thinking": False},
    ),
    (
        "reasoning alias and content parts",
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "part one, "},
                        {"type": "text", "text": "part two"},
                    ],
                },
                {"role": "assistant", "content": "ok", "reasoning": "aliased reasoning"},
            ],
            "add_generation_prompt": False,
        },
    ),
    (
        "unicode everywhere",
        {
            "messages": [
                {"role": "user", "content": '你好 😀 «quotes» "dq" <b>&amp;</b>'},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {
                            "function": {
                                "name": "search",
                                "arguments": {"q": "日本語", "n": 1.5, "none": None},
                            }
                        }
                    ],
                },
                {"role": "tool", "content": "ok"},
                {"role": "user", "content": "thanks"},
            ],
            "tools": [SEARCH_TOOL],
            "enable_thinking": False,
        },
    ),
]


@pytest.fixture(scope="module")
def template(tokenizer: Tokenizer) -> ChatTemplate:
    return ChatTemplate(QWEN_TEMPLATE, tokenizer.special_tokens_map)


def _hf_render(hf_tokenizer, source: str, case: dict[str, Any]) -> str:
    case = dict(case)
    messages = case.pop("messages")
    tools = case.pop("tools", None)
    add_generation_prompt = case.pop("add_generation_prompt", True)
    return hf_tokenizer.apply_chat_template(
        messages,
        tools=tools,
        chat_template=source,
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
        **case,
    )


def _our_render(template: ChatTemplate, case: dict[str, Any]) -> str:
    case = dict(case)
    messages = case.pop("messages")
    tools = case.pop("tools", None)
    add_generation_prompt = case.pop("add_generation_prompt", True)
    return template.render(messages, tools, add_generation_prompt, **case)


@pytest.mark.parametrize("name,case", CASES, ids=[name for name, _ in CASES])
def test_same_prompt_as_transformers(template, tokenizer, hf_tokenizer, name, case) -> None:
    expected = _hf_render(hf_tokenizer, QWEN_TEMPLATE, case)
    assert _our_render(template, case) == expected
    # and the same prompt ids
    assert tokenizer.encode(expected) == hf_tokenizer.apply_chat_template(
        case["messages"],
        tools=case.get("tools"),
        chat_template=QWEN_TEMPLATE,
        tokenize=True,
        return_dict=False,
        add_generation_prompt=case.get("add_generation_prompt", True),
        **{
            k: v for k, v in case.items() if k not in ("messages", "tools", "add_generation_prompt")
        },
    )


def test_rendered_shape_follows_spec(template) -> None:
    prompt = _our_render(template, dict(CASES[6][1]))
    assert prompt.startswith("<|im_start|>system\n# Tools\n")
    assert (
        '{"name": "get_weather", "description": "Current weather for a city — «météo» 天气"'
        in prompt
    )
    calls = "\n".join(
        render_tool_call(c["function"]["name"], c["function"]["arguments"])
        for c in (CALL_1, CALL_2)
    )
    assert (
        "<think>\nNeed weather and search.\n</think>\n\nLet me check.\n\n" + calls + "<|im_end|>\n"
        in prompt
    )
    assert (
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\nresults\n</tool_response><|im_end|>\n"
        in prompt
    )
    assert prompt.endswith("<|im_start|>assistant\n<think>\n")
    off = _our_render(template, dict(CASES[9][1]))
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


FEATURE_TEMPLATES = {
    "tojson variants": (
        "{{ messages[0] | tojson }}|{{ messages[0] | tojson(indent=2) }}|"
        "{{ messages[0] | tojson(ensure_ascii=True) }}|{{ messages[0] | tojson(sort_keys=True) }}|"
        "{{ messages[0] | tojson(separators=(',', ':')) }}|{{ '<b>&\\'' | tojson }}"
    ),
    "whitespace control": "{% for m in messages %}\n  {% if m.role %}\n{{ m.role }}\n  {% endif %}\n{% endfor %}\n  end\n",
    "generation block": "{% for m in messages %}{% generation %}[{{ m.content }}]{% endgeneration %}{% endfor %}",
    "dict and namespace": "{% set d = dict(a=1, b=messages|length) %}{% set ns = namespace(n=0) %}"
    "{% for k, v in d | items %}{% set ns.n = ns.n + v %}{% endfor %}{{ ns.n }}{{ d | tojson }}",
    "special token variables": "{{ eos_token }}{{ pad_token }}{{ bos_token is defined }}{{ extra | default('-') }}",
    "loop controls": "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i > 4 %}{% break %}{% endif %}{{ i }}{% endfor %}",
    "none keys dropped": "{{ messages[0].content is defined }}{{ messages[0].tool_calls is defined }}{{ messages[0].keys() | list }}",
}


@pytest.mark.parametrize("source", FEATURE_TEMPLATES.values(), ids=FEATURE_TEMPLATES.keys())
def test_environment_features_match_transformers(tokenizer, hf_tokenizer, source: str) -> None:
    case = {
        "messages": [
            {"role": "user", "content": 'é <x> "q"', "tool_calls": None, "reasoning": "r"}
        ],
        "extra": "E",
        "add_generation_prompt": False,
    }
    assert _our_render(ChatTemplate(source, tokenizer.special_tokens_map), case) == _hf_render(
        hf_tokenizer, source, case
    )


def test_strftime_now(tokenizer) -> None:
    rendered = ChatTemplate("{{ strftime_now('%Y-%m-%d') }}").render(
        [{"role": "user", "content": "x"}]
    )
    assert rendered == datetime.now().strftime("%Y-%m-%d")


def test_named_templates() -> None:
    template = ChatTemplate({"default": "plain", "tool_use": "with tools"})
    messages = [{"role": "user", "content": "x"}]
    assert template.render(messages) == "plain"
    assert template.render(messages, tools=[SEARCH_TOOL]) == "with tools"
    assert template.render(messages, template_name="tool_use") == "with tools"
    with pytest.raises(ChatTemplateError, match="no chat template named 'other'"):
        template.render(messages, template_name="other")
    with pytest.raises(ChatTemplateError, match="none named 'default'"):
        ChatTemplate({"a": "x", "b": "y"}).render(messages)


def test_errors_are_chat_template_errors(template) -> None:
    with pytest.raises(ChatTemplateError, match="No user query found"):
        template.render([{"role": "system", "content": "only system"}])
    with pytest.raises(ChatTemplateError, match="Unexpected message role: robot"):
        template.render([{"role": "user", "content": "x"}, {"role": "robot", "content": "y"}])
    with pytest.raises(ChatTemplateError, match=r"does not compile \(line 2\)"):
        ChatTemplate("ok\n{% if %}")
    with pytest.raises(ChatTemplateError, match="empty conversation"):
        template.render([])
    messages = [{"role": "user", "content": "x"}]
    with pytest.raises(ChatTemplateError, match="UndefinedError|undefined"):
        ChatTemplate("{{ nothing.attr }}").render(messages)
    with pytest.raises(ChatTemplateError, match="underscore"):
        ChatTemplate("{% set ns = namespace() %}{% set ns._x = 1 %}").render(messages)
    with pytest.raises(ChatTemplateError, match="unsafe|not safely|SecurityError|access"):
        ChatTemplate("{{ messages.append(1) }}").render(messages)
    with pytest.raises(ChatTemplateError, match="message 0 must be an object"):
        template.render(["hello"])  # type: ignore[list-item]


def test_caller_messages_untouched(template) -> None:
    messages = [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": "y", "reasoning": "r"},
    ]
    snapshot = [dict(m) for m in messages]
    template.render(messages)
    assert messages == snapshot


def test_from_tokenizer(hf_dir) -> None:
    tok = Tokenizer.from_bytes(
        (hf_dir / "tokenizer.json").read_bytes(),
        (hf_dir / "tokenizer_config.json").read_bytes(),
        None,
        QWEN_TEMPLATE.encode(),
    )
    rendered = ChatTemplate.from_tokenizer(tok).render(
        [{"role": "user", "content": "hi"}], enable_thinking=False
    )
    assert (
        rendered == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    with pytest.raises(ChatTemplateError, match="no chat template"):
        ChatTemplate.from_tokenizer(Tokenizer.from_dir(hf_dir))
