"""The Qwen tool-call wire format (product spec 7.2): rendering, batch and streaming parsing.

A model calls tools by ending its answer with one or more blocks::

    <tool_call>
    <function=NAME>
    <parameter=KEY>
    VALUE
    </parameter>
    </function>
    </tool_call>

Parsing is all or nothing: the text before the first `<tool_call>` (trimmed) is the content and
every block must be well formed, separated only by whitespace; any deviation (or, with a tool set,
a function outside it) makes the whole output plain content. String values may hold balanced
nested `<parameter=...>...</parameter>` and other markers verbatim. One incremental parser does the
work for both the batch and the streaming API, so the two always agree.

Resolved details the spec leaves open: the answer's leading ASCII whitespace is never content
(with or without calls, so a stream can emit text before knowing whether calls follow); a
duplicated parameter key, an empty key, or a key containing `<` or a line break is a deviation;
JSON values keep their original text (member order, number spelling) minus insignificant
whitespace.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ParsedOutput",
    "StreamingToolCallParser",
    "ToolCall",
    "ToolCallUpdate",
    "new_call_id",
    "parse_tool_calls",
    "render_tool_call",
]

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
FUNCTION_OPEN = "<function="
FUNCTION_CLOSE = "</function>"
PARAMETER_OPEN = "<parameter="
PARAMETER_CLOSE = "</parameter>"

_ASCII_WS = " \t\n\r\x0b\x0c"
_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_KEY_FORBIDDEN = re.compile(r"[<\r\n]")
_PRIMITIVE_TYPES = frozenset({"string", "number", "integer", "boolean", "null"})
# A JSON string literal, or a run of insignificant JSON whitespace (the text is known-valid JSON).
_JSON_STRING_OR_WS = re.compile(r'("(?:[^"\\]|\\.)*")|[ \t\n\r]+')


@dataclass(frozen=True)
class ToolCall:
    """One parsed call; `arguments_json` is a JSON object text with the model's member order."""

    id: str
    name: str
    arguments_json: str

    @property
    def arguments(self) -> dict[str, Any]:
        return json.loads(self.arguments_json)


@dataclass(frozen=True)
class ParsedOutput:
    """The final split of an answer: content text (maybe empty) and the calls."""

    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)


@dataclass
class ToolCallUpdate:
    """What one `push`/`finish` released.

    `content` is final answer text. `tool_calls` are calls whose block just completed. `fallback`
    means the tool region turned out malformed: calls released earlier are void and the region's
    text is now (part of) `content`.
    """

    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    fallback: bool = False


def new_call_id() -> str:
    """A fresh `call_<16 lowercase hex>` id."""
    return "call_" + secrets.token_hex(8)


# -- rendering --------------------------------------------------------------------------------


def render_tool_call(name: str, arguments: Mapping[str, Any] | str) -> str:
    """One call in the wire format: string values raw, other values as compact JSON."""
    if isinstance(arguments, str):
        arguments = json.loads(arguments)
        if not isinstance(arguments, dict):
            raise ValueError(f"tool call {name!r}: arguments must be a JSON object")
    parts = [f"{TOOL_CALL_OPEN}\n{FUNCTION_OPEN}{name}>\n"]
    for key, value in arguments.items():
        text = value if isinstance(value, str) else _dumps_compact(value)
        parts.append(f"{PARAMETER_OPEN}{key}>\n{text}\n{PARAMETER_CLOSE}\n")
    parts.append(f"{FUNCTION_CLOSE}\n{TOOL_CALL_CLOSE}")
    return "".join(parts)


def _dumps_compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


# -- tool schemas and value conversion --------------------------------------------------------


def _tool_function(tool: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]]:
    """(name, parameter schema) of an OpenAI, flat-function or Anthropic tool object."""
    spec = tool["function"] if isinstance(tool.get("function"), Mapping) else tool
    name = spec.get("name")
    if not isinstance(name, str):
        raise ValueError(f"tool without a string name: {tool!r}")
    schema = spec.get("parameters", spec.get("input_schema"))
    return name, schema if isinstance(schema, Mapping) else {}


def _declared_types(schema: Any) -> frozenset[str] | None:
    """Types a parameter schema states directly (`type`, or anyOf/oneOf of primitive types)."""
    if not isinstance(schema, Mapping):
        return None
    declared = schema.get("type")
    if isinstance(declared, str):
        return frozenset({declared})
    if isinstance(declared, list) and declared and all(isinstance(t, str) for t in declared):
        return frozenset(declared)
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if not isinstance(options, list) or not options:
            continue
        types: set[str] = set()
        for option in options:
            option_type = option.get("type") if isinstance(option, Mapping) else None
            names = [option_type] if isinstance(option_type, str) else option_type
            if not isinstance(names, list) or not names or not _PRIMITIVE_TYPES.issuperset(names):
                return None
            types.update(names)
        return frozenset(types)
    return None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _json_text(value: str) -> str | None:
    """`value` as compact JSON text keeping its spelling, or None when it is not JSON."""
    try:
        json.loads(value, parse_constant=_reject_constant)
    except ValueError:
        return None
    return _JSON_STRING_OR_WS.sub(lambda m: m.group(1) or "", value)


def _convert_value(raw: str, types: frozenset[str] | None) -> str | None:
    """JSON text of one parameter value; None when the parameter is to be omitted."""
    value = raw.strip(_ASCII_WS)
    if types is not None:
        if "string" in types:
            return json.dumps(value, ensure_ascii=False)
        if not value:
            return None
        if "boolean" in types and value.lower() in ("true", "false"):
            return value.lower()
    as_json = _json_text(value)
    return as_json if as_json is not None else json.dumps(value, ensure_ascii=False)


class _ToolSet:
    """Function names and parameter schemas of the effective tool set (None: accept any)."""

    def __init__(self, tools: Iterable[Mapping[str, Any]] | None) -> None:
        self.properties: dict[str, Mapping[str, Any]] | None = None
        if tools is not None:
            self.properties = {}
            for tool in tools:
                name, schema = _tool_function(tool)
                props = schema.get("properties")
                self.properties[name] = props if isinstance(props, Mapping) else {}

    def allows(self, name: str) -> bool:
        return self.properties is None or name in self.properties

    def arguments_json(self, name: str, params: Sequence[tuple[str, str]]) -> str:
        props = self.properties.get(name, {}) if self.properties is not None else None
        members = []
        for key, raw in params:
            types = _declared_types(props.get(key)) if props is not None else None
            value = _convert_value(raw, types)
            if value is not None:
                members.append(f"{json.dumps(key, ensure_ascii=False)}:{value}")
        return "{" + ",".join(members) + "}"


# -- the incremental region parser ------------------------------------------------------------

_NEED_MORE = object()
_FAIL = object()
_DONE = object()
_BETWEEN, _OPEN, _NAME, _PARAMS, _KEY, _VALUE, _CLOSE = range(7)


class _Region:
    """Parses the tool region (from the first `<tool_call>` on) as text arrives.

    Each state consumes one token; a token cut by the end of the text waits for more, so the
    result never depends on where the chunks were split.
    """

    def __init__(self, tool_set: _ToolSet, max_name_len: int) -> None:
        self.text = ""
        self.failed = False
        self._tool_set = tool_set
        self._max_name_len = max_name_len
        self._pos = 0
        self._state = _BETWEEN
        self._name = ""
        self._params: list[tuple[str, str]] = []
        self._key = ""
        self._value_start = 0
        self._scan = 0
        self._depth = 0

    def feed(self, chunk: str) -> list[tuple[str, list[tuple[str, str]]]]:
        """Add text; return the blocks it completed as (name, [(key, raw value)])."""
        self.text += chunk
        return self._run(final=False)

    def finish(self) -> list[tuple[str, list[tuple[str, str]]]]:
        """End of text: complete blocks, and `failed` set unless the region is well formed."""
        return self._run(final=True)

    def _run(self, final: bool) -> list[tuple[str, list[tuple[str, str]]]]:
        blocks = []
        while not self.failed:
            step = self._step(final)
            if step is _DONE:
                break
            if step is _NEED_MORE:
                self.failed = final
                break
            if step is _FAIL:
                self.failed = True
            elif step is not None:
                blocks.append(step)
        return blocks

    def _skip_ws(self) -> bool:
        """Skip whitespace; whether any text is left to look at."""
        text, pos = self.text, self._pos
        while pos < len(text) and text[pos] in _ASCII_WS:
            pos += 1
        self._pos = pos
        return pos < len(text)

    def _take(self, literal: str) -> bool | None:
        """Consume `literal`: True, False on a mismatch, None if the text ends inside it."""
        if self.text.startswith(literal, self._pos):
            self._pos += len(literal)
            return True
        if len(self.text) - self._pos >= len(literal):
            return False
        return None if literal.startswith(self.text[self._pos :]) else False

    def _step(self, final: bool) -> Any:
        state = self._state
        if state == _VALUE:
            return self._value()
        if state == _NAME:
            return self._function_name()
        if state == _KEY:
            return self._parameter_key()
        if not self._skip_ws():
            return _DONE if final and state == _BETWEEN else _NEED_MORE
        if state == _BETWEEN:
            return self._expect(TOOL_CALL_OPEN, _OPEN)
        if state == _OPEN:
            return self._expect(FUNCTION_OPEN, _NAME)
        if state == _PARAMS:
            opened = self._take(PARAMETER_OPEN)
            if opened:
                self._state = _KEY
                return None
            closed = self._take(FUNCTION_CLOSE)
            if closed:
                self._state = _CLOSE
                return None
            return _NEED_MORE if opened is None or closed is None else _FAIL
        # _CLOSE: `</function>` was read, the block ends with `</tool_call>`.
        taken = self._take(TOOL_CALL_CLOSE)
        if taken:
            self._state = _BETWEEN
            return (self._name, self._params)
        return _NEED_MORE if taken is None else _FAIL

    def _expect(self, literal: str, next_state: int) -> Any:
        taken = self._take(literal)
        if taken:
            self._state = next_state
            return None
        return _NEED_MORE if taken is None else _FAIL

    def _function_name(self) -> Any:
        text, start = self.text, self._pos
        end = start
        while end < len(text) and text[end] in _NAME_CHARS and end - start <= self._max_name_len:
            end += 1
        if end - start > self._max_name_len:
            return _FAIL
        if end == len(text):
            return _NEED_MORE
        if text[end] != ">" or end == start:
            return _FAIL
        name = text[start:end]
        if not self._tool_set.allows(name):
            return _FAIL
        self._name, self._params = name, []
        self._pos = end + 1
        self._state = _PARAMS
        return None

    def _parameter_key(self) -> Any:
        text, start = self.text, self._pos
        end = text.find(">", start)
        key = text[start:] if end < 0 else text[start:end]
        if _KEY_FORBIDDEN.search(key):
            return _FAIL
        if end < 0:
            return _NEED_MORE
        if not key or any(key == seen for seen, _ in self._params):
            return _FAIL
        self._key = key
        self._pos = self._value_start = self._scan = end + 1
        self._depth = 1
        self._state = _VALUE
        return None

    def _value(self) -> Any:
        # Nested `<parameter=` ... `</parameter>` pairs belong to the value; the closer that
        # brings the depth back to zero ends it.
        text = self.text
        while True:
            opener = text.find(PARAMETER_OPEN, self._scan)
            closer = text.find(PARAMETER_CLOSE, self._scan)
            if opener < 0 and closer < 0:
                # Keep scanning from where a cut-off marker could start.
                self._scan = max(self._scan, len(text) - len(PARAMETER_CLOSE) + 1)
                return _NEED_MORE
            if opener >= 0 and (closer < 0 or opener < closer):
                self._depth += 1
                self._scan = opener + len(PARAMETER_OPEN)
                continue
            self._depth -= 1
            self._scan = closer + len(PARAMETER_CLOSE)
            if self._depth == 0:
                self._params.append((self._key, text[self._value_start : closer]))
                self._pos = self._scan
                self._state = _PARAMS
                return None


# -- the public parsers -----------------------------------------------------------------------

_CONTENT, _REGION, _PLAIN = range(3)


class StreamingToolCallParser:
    """Incremental tool-call parser over answer text arriving in arbitrary chunks.

    Content is released as soon as it can no longer belong to a `<tool_call>` region (trailing
    whitespace and a possible partial `<tool_call>` are held); each call is released when its
    block closes. If the region turns out malformed, the update says `fallback` and the region's
    text becomes content. After `finish()`, `result` equals `parse_tool_calls` of the whole text.
    """

    def __init__(
        self,
        tools: Iterable[Mapping[str, Any]] | None = None,
        max_name_len: int = 64,
        id_factory: Callable[[], str] = new_call_id,
    ) -> None:
        self._tool_set = _ToolSet(tools)
        self._max_name_len = max_name_len
        self._new_id = id_factory
        self._mode = _CONTENT
        self._held = ""  # content-mode tail that may precede or start `<tool_call>`
        self._pre_ws = ""  # whitespace between the content and the region
        self._region: _Region | None = None
        self._started = False  # some non-whitespace content was released
        self._content: list[str] = []
        self._calls: list[ToolCall] = []
        self._result: ParsedOutput | None = None

    @property
    def result(self) -> ParsedOutput:
        """The final content and calls (available after `finish`)."""
        if self._result is None:
            raise RuntimeError("StreamingToolCallParser.result is only known after finish()")
        return self._result

    def push(self, text: str) -> ToolCallUpdate:
        """Add answer text; return what became final."""
        if self._result is not None:
            raise RuntimeError("StreamingToolCallParser.push after finish()")
        update = ToolCallUpdate()
        if self._mode == _PLAIN:
            self._emit(update, text)
        elif self._mode == _REGION:
            self._feed_region(update, text)
        else:
            self._push_content(update, text)
        return update

    def finish(self) -> ToolCallUpdate:
        """End of the answer: release what was held and settle the result."""
        if self._result is not None:
            return ToolCallUpdate()
        update = ToolCallUpdate()
        if self._mode == _CONTENT:
            held, self._held = self._held, ""
            self._emit(update, held)
        elif self._mode == _REGION:
            assert self._region is not None
            self._take_blocks(update, self._region.finish())
            if self._region.failed:
                self._fall_back(update)
        self._result = ParsedOutput("".join(self._content), list(self._calls))
        return update

    def _emit(self, update: ToolCallUpdate, text: str) -> None:
        if not self._started:
            text = text.lstrip(_ASCII_WS)
            self._started = bool(text)
        if text:
            update.content += text
            self._content.append(text)

    def _push_content(self, update: ToolCallUpdate, text: str) -> None:
        buffer = self._held + text
        self._held = ""
        at = buffer.find(TOOL_CALL_OPEN)
        if at >= 0:
            before = buffer[:at]
            content = before.rstrip(_ASCII_WS)
            self._pre_ws = before[len(content) :]
            self._emit(update, content)
            self._mode = _REGION
            self._region = _Region(self._tool_set, self._max_name_len)
            self._feed_region(update, buffer[at:])
            return
        # Hold a possible partial `<tool_call>` and the whitespace before it: both vanish if
        # the marker completes.
        end = len(buffer)
        lt = buffer.rfind("<")
        if lt >= 0 and TOOL_CALL_OPEN.startswith(buffer[lt:]):
            end = lt
        start = end
        while start > 0 and buffer[start - 1] in _ASCII_WS:
            start -= 1
        self._emit(update, buffer[:start])
        self._held = buffer[start:]

    def _feed_region(self, update: ToolCallUpdate, text: str) -> None:
        assert self._region is not None
        self._take_blocks(update, self._region.feed(text))
        if self._region.failed:
            self._fall_back(update)

    def _take_blocks(
        self, update: ToolCallUpdate, blocks: list[tuple[str, list[tuple[str, str]]]]
    ) -> None:
        for name, params in blocks:
            call = ToolCall(self._new_id(), name, self._tool_set.arguments_json(name, params))
            self._calls.append(call)
            update.tool_calls.append(call)

    def _fall_back(self, update: ToolCallUpdate) -> None:
        assert self._region is not None
        self._mode = _PLAIN
        self._calls.clear()
        update.tool_calls.clear()
        update.fallback = True
        self._emit(update, self._pre_ws + self._region.text)


def parse_tool_calls(
    text: str,
    tools: Iterable[Mapping[str, Any]] | None = None,
    max_name_len: int = 64,
    id_factory: Callable[[], str] = new_call_id,
) -> ParsedOutput:
    """Split a complete answer into content and tool calls (all or nothing, see module doc).

    `tools` is the effective tool set (OpenAI `{"type": "function", "function": {...}}`, a flat
    function object, or Anthropic `{name, input_schema}`); when given, only its functions are
    accepted and parameter values are converted as their schema's type directs.
    `max_name_len` is 64 for OpenAI dialects, 128 for Anthropic.
    """
    parser = StreamingToolCallParser(tools, max_name_len, id_factory)
    parser.push(text)
    parser.finish()
    return parser.result
