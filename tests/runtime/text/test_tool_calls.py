"""Qwen tool-call parsing (product spec 7.2): a corpus checked in batch and streamed at every split."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ninfer_runtime.text import (
    ParsedOutput,
    StreamingToolCallParser,
    ToolCall,
    new_call_id,
    parse_tool_calls,
    render_tool_call,
)


def call(name: str, params: list[tuple[str, str]], ws: str = "\n") -> str:
    """A block in the wire format; `params` values are written as given."""
    body = "".join(f"<parameter={k}>{ws}{v}{ws}</parameter>{ws}" for k, v in params)
    return f"<tool_call>{ws}<function={name}>{ws}{body}</function>{ws}</tool_call>"


def tool(name: str, properties: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "parameters": {"type": "object", "properties": properties or {}},
        },
    }


WEATHER = tool(
    "get_weather",
    {"city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"}},
)
TYPED = tool(
    "typed",
    {
        "s": {"type": "string"},
        "i": {"type": "integer"},
        "n": {"type": "number"},
        "b": {"type": "boolean"},
        "o": {"type": "object"},
        "maybe": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
        "str_or_null": {"type": ["string", "null"]},
        "complex": {"anyOf": [{"type": "integer"}, {"$ref": "#/defs/x"}]},
        "free": {"description": "no type"},
    },
)
ANTHROPIC_TOOL = {
    "name": "lookup",
    "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}},
}

SINGLE = call("get_weather", [("city", "Paris")])
NESTED_VALUE = (
    "Use <parameter=inner>x</parameter> and <function=other> </function>\n"
    "<tool_call> </tool_call> verbatim"
)


@dataclass
class Case:
    name: str
    text: str
    content: str
    calls: list[tuple[str, str]] = field(default_factory=list)  # (name, arguments_json)
    tools: list[dict[str, Any]] | None = None
    max_name_len: int = 64


CORPUS = [
    Case("no call", "Just an answer.  ", "Just an answer.  "),
    Case("no call, leading whitespace dropped", "\n\n  Hi", "Hi"),
    Case("partial marker only", "see <tool_call", "see <tool_call"),
    Case("single call", SINGLE, "", [("get_weather", '{"city":"Paris"}')]),
    Case(
        "leading whitespace then call",
        "\n \n" + SINGLE + "\n",
        "",
        [("get_weather", '{"city":"Paris"}')],
    ),
    Case(
        "text before call",
        "Sure, let me check.\n\n" + SINGLE,
        "Sure, let me check.",
        [("get_weather", '{"city":"Paris"}')],
    ),
    Case(
        "several calls",
        SINGLE
        + "\n"
        + call("get_weather", [("city", "Tokyo"), ("days", "3")])
        + " \n\t"
        + call("noop", []),
        "",
        [
            ("get_weather", '{"city":"Paris"}'),
            ("get_weather", '{"city":"Tokyo","days":3}'),
            ("noop", "{}"),
        ],
    ),
    Case(
        "compact layout",
        "<tool_call><function=f><parameter=a>1</parameter></function></tool_call>",
        "",
        [("f", '{"a":1}')],
    ),
    Case(
        "json values",
        call(
            "f",
            [
                ("int", "42"),
                ("float", "-1.5e3"),
                ("obj", '{ "b": [1, {"c": null}], "a": "x y" }'),
                ("arr", "[true, false, null]"),
                ("t", "true"),
                ("nul", "null"),
                ("str", '"quoted \\" value"'),
                ("nan", "NaN"),
                ("inf", "Infinity"),
                ("almost", "{'a': 1}"),
            ],
        ),
        "",
        [
            (
                "f",
                '{"int":42,"float":-1.5e3,"obj":{"b":[1,{"c":null}],"a":"x y"},"arr":[true,false,null],'
                '"t":true,"nul":null,"str":"quoted \\" value","nan":"NaN","inf":"Infinity","almost":"{\'a\': 1}"}',
            )
        ],
    ),
    Case(
        "multi-line string",
        call("write", [("code", "def f():\n    return 1\n\n# end")]),
        "",
        [("write", json.dumps({"code": "def f():\n    return 1\n\n# end"}, separators=(",", ":")))],
    ),
    Case(
        "value trimmed, inner whitespace kept",
        call("f", [("v", "  \t a  b \n\n")], ws=""),
        "",
        [("f", '{"v":"a  b"}')],
    ),
    Case(
        "nested markup in value",
        call("f", [("text", NESTED_VALUE)]),
        "",
        [("f", json.dumps({"text": NESTED_VALUE}, separators=(",", ":")))],
    ),
    Case(
        "unicode",
        "Voilà 😀\n" + call("f", [("q", "日本語 «é»"), ("k", '{"ключ": "値"}')]),
        "Voilà 😀",
        [("f", '{"q":"日本語 «é»","k":{"ключ":"値"}}')],
    ),
    Case(
        "key with spaces and name charset",
        call("A-b_9", [("my key", "x")]),
        "",
        [("A-b_9", '{"my key":"x"}')],
    ),
    Case("empty function", call("f", []), "", [("f", "{}")]),
    Case("empty parameter without schema", call("f", [("x", "")]), "", [("f", '{"x":""}')]),
    Case(
        "known function with tool set",
        SINGLE,
        "",
        [("get_weather", '{"city":"Paris"}')],
        tools=[WEATHER],
    ),
    Case(
        "type guided",
        call(
            "typed",
            [
                ("s", "123"),
                ("i", "7"),
                ("n", "2.5"),
                ("b", "TRUE"),
                ("o", '{"k": 1}'),
                ("maybe", "null"),
                ("str_or_null", "null"),
                ("complex", "5"),
                ("free", "true"),
            ],
        ),
        "",
        [
            (
                "typed",
                '{"s":"123","i":7,"n":2.5,"b":true,"o":{"k":1},"maybe":null,"str_or_null":"null",'
                '"complex":5,"free":true}',
            )
        ],
        tools=[TYPED],
    ),
    Case(
        "type guided empties and mismatches",
        call(
            "typed",
            [
                ("s", ""),
                ("i", ""),
                ("b", ""),
                ("maybe", "  "),
                ("free", ""),
                ("i2", ""),
                ("n", "abc"),
                ("o", "[1]"),
                ("complex", ""),
            ],
        ).replace("i2", "b2"),
        "",
        [("typed", '{"s":"","free":"","b2":"","n":"abc","o":[1],"complex":""}')],
        tools=[TYPED],
    ),
    Case(
        "booleans only folded when declared",
        call("typed", [("s", "True"), ("free", "True"), ("b", "False")]),
        "",
        [("typed", '{"s":"True","free":"True","b":false}')],
        tools=[TYPED],
    ),
    Case(
        "anthropic tool set and long name",
        call("lookup", [("q", "42")]),
        "",
        [("lookup", '{"q":"42"}')],
        tools=[ANTHROPIC_TOOL],
        max_name_len=128,
    ),
    Case("name up to the limit", call("n" * 64, []), "", [("n" * 64, "{}")]),
    # malformed: the whole output is content
    Case(
        "missing </function>",
        "ok " + SINGLE.replace("</function>", ""),
        "ok " + SINGLE.replace("</function>", ""),
    ),
    Case(
        "stray </parameter>",
        call("f", [("a", "1")]).replace("</function>", "</parameter>\n</function>"),
        call("f", [("a", "1")]).replace("</function>", "</parameter>\n</function>"),
    ),
    Case("text between calls", SINGLE + "\nand then\n" + SINGLE, SINGLE + "\nand then\n" + SINGLE),
    Case("text after calls", "pre " + SINGLE + " post", "pre " + SINGLE + " post"),
    Case("bad function name", call("get weather", []), call("get weather", [])),
    Case("dotted function name", call("a.b", []), call("a.b", [])),
    Case("empty function name", call("", []), call("", [])),
    Case("name too long", call("n" * 65, []), call("n" * 65, [])),
    Case(
        "unknown function with tool set",
        "x " + SINGLE + call("other", []),
        "x " + SINGLE + call("other", []),
        tools=[WEATHER],
    ),
    Case("unknown function with empty tool set", SINGLE, SINGLE, tools=[]),
    Case("unterminated block", "Checking. " + SINGLE[:-5], "Checking. " + SINGLE[:-5]),
    Case(
        "unterminated value",
        "<tool_call>\n<function=f>\n<parameter=a>\nopen",
        "<tool_call>\n<function=f>\n<parameter=a>\nopen",
    ),
    Case(
        "unmatched nested opener",
        call("f", [("a", "x <parameter=b> y")]),
        call("f", [("a", "x <parameter=b> y")]),
    ),
    Case("duplicate key", call("f", [("a", "1"), ("a", "2")]), call("f", [("a", "1"), ("a", "2")])),
    Case(
        "key with newline",
        "<tool_call><function=f><parameter=a\nb>1</parameter></function></tool_call>",
        "<tool_call><function=f><parameter=a\nb>1</parameter></function></tool_call>",
    ),
    Case("empty key", call("f", [("", "1")]), call("f", [("", "1")])),
    Case(
        "junk inside function",
        "<tool_call><function=f>junk</function></tool_call>",
        "<tool_call><function=f>junk</function></tool_call>",
    ),
    Case(
        "missing </tool_call>",
        "<tool_call><function=f></function>\n",
        "<tool_call><function=f></function>\n",
    ),
]


def counter_ids() -> Callable[[], str]:
    numbers = itertools.count()
    return lambda: f"call_{next(numbers):016x}"


def batch(case: Case) -> ParsedOutput:
    return parse_tool_calls(case.text, case.tools, case.max_name_len, id_factory=counter_ids())


def stream(case: Case, chunks: list[str]) -> tuple[ParsedOutput, str, list[ToolCall], bool]:
    parser = StreamingToolCallParser(case.tools, case.max_name_len, id_factory=counter_ids())
    content, calls, fallback = [], [], False
    for update in [*(parser.push(c) for c in chunks), parser.finish()]:
        content.append(update.content)
        calls.extend(update.tool_calls)
        fallback |= update.fallback
    return parser.result, "".join(content), calls, fallback


@pytest.mark.parametrize("case", CORPUS, ids=[c.name for c in CORPUS])
def test_batch(case: Case) -> None:
    result = batch(case)
    assert result.content == case.content
    assert [(c.name, c.arguments_json) for c in result.tool_calls] == case.calls
    for c in result.tool_calls:
        assert json.loads(c.arguments_json) == c.arguments  # valid JSON object text


def _splits(text: str) -> list[list[str]]:
    return [[text[:i], text[i:]] for i in range(len(text) + 1)] + [list(text)]


@pytest.mark.parametrize("case", CORPUS, ids=[c.name for c in CORPUS])
def test_streaming_matches_batch_at_every_split(case: Case) -> None:
    expected = batch(case)
    for chunks in _splits(case.text):
        result, content, calls, fallback = stream(case, chunks)
        assert result == expected, chunks
        assert content == expected.content, chunks
        if fallback:
            assert expected.tool_calls == [], chunks
        else:
            assert calls == expected.tool_calls, chunks


def test_default_ids() -> None:
    result = parse_tool_calls(SINGLE + SINGLE)
    ids = [c.id for c in result.tool_calls]
    assert all(re.fullmatch(r"call_[0-9a-f]{16}", i) for i in ids) and ids[0] != ids[1]
    assert re.fullmatch(r"call_[0-9a-f]{16}", new_call_id())


def test_content_streams_before_the_region_and_calls_when_blocks_close() -> None:
    parser = StreamingToolCallParser()
    assert parser.push("Hello wor").content == "Hello wor"
    update = parser.push("ld! <tool")
    assert update.content == "ld!"  # " <tool" may start a call: held
    update = parser.push(
        "_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_"
    )
    assert update.content == "" and update.tool_calls == []
    update = parser.push("call>\n")
    assert [(c.name, c.arguments_json) for c in update.tool_calls] == [("f", '{"a":1}')]
    assert parser.finish().content == ""
    assert parser.result.content == "Hello world!"


def test_false_start_is_released_as_content() -> None:
    parser = StreamingToolCallParser()
    assert parser.push("a <too").content == "a"
    assert parser.push("l>").content == " <tool>"


def test_malformed_region_falls_back_as_soon_as_known() -> None:
    parser = StreamingToolCallParser(tools=[WEATHER])
    first = parser.push("Answer: " + SINGLE)
    assert first.content == "Answer:" and len(first.tool_calls) == 1
    update = parser.push("\n<tool_call>\n<function=unknown>")
    assert update.fallback and update.tool_calls == []
    assert update.content == " " + SINGLE + "\n<tool_call>\n<function=unknown>"
    assert parser.push(" rest").content == " rest"  # after a fallback everything is content
    parser.finish()
    assert parser.result.tool_calls == []
    with pytest.raises(RuntimeError):
        parser.push("x")


def test_result_needs_finish() -> None:
    with pytest.raises(RuntimeError, match="after finish"):
        _ = StreamingToolCallParser().result


def test_render_tool_call_wire_format() -> None:
    text = render_tool_call(
        "f", {"city": "Paris", "n": 2, "o": {"a": [1, "é"]}, "flag": False, "none": None}
    )
    assert text == (
        "<tool_call>\n<function=f>\n"
        "<parameter=city>\nParis\n</parameter>\n"
        "<parameter=n>\n2\n</parameter>\n"
        '<parameter=o>\n{"a":[1,"é"]}\n</parameter>\n'
        "<parameter=flag>\nfalse\n</parameter>\n"
        "<parameter=none>\nnull\n</parameter>\n"
        "</function>\n</tool_call>"
    )
    assert render_tool_call("f", '{"b": 1, "a": "x"}') == render_tool_call("f", {"b": 1, "a": "x"})
    with pytest.raises(ValueError, match="JSON object"):
        render_tool_call("f", "[1]")


json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**12), 10**12),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
raw_strings = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="<", exclude_categories=("Cs",)),
    max_size=20,
).map(lambda s: s.strip(" \t\n\r\x0b\x0c"))
param_names = st.text(alphabet="abcdefghij_ XYZ0123456789", min_size=1, max_size=8)


@settings(max_examples=150, deadline=None)
# (a top-level string is written raw, so its edges' whitespace is the format's: `raw_strings` only)
@given(args=st.dictionaries(param_names, st.one_of(raw_strings, json_values.filter(lambda v: not isinstance(v, str))),
                            max_size=5))
def test_render_then_parse_round_trips(args: dict[str, Any]) -> None:
    properties = {k: {"type": "string"} if isinstance(v, str) else {} for k, v in args.items()}
    text = render_tool_call("fn", args)
    result = parse_tool_calls(text, tools=[tool("fn", properties)])
    assert [c.name for c in result.tool_calls] == ["fn"]
    assert result.tool_calls[0].arguments_json == json.dumps(
        args, ensure_ascii=False, separators=(",", ":")
    )
