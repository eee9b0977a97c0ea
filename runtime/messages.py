"""Chat requests from a messages file (`ninfer run --messages FILE`), validated with clear errors.

The file is a non-empty JSON array of messages, or `{"messages": [...], "tools": [...]}`. Each
message allows only role, content, reasoning_content, tool_calls and tool_call_id; assistant tool
call arguments may be an object or a string holding one. The result is what the chat template
receives: messages with tool-call arguments as objects, plus the tools list.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROLES = ("system", "developer", "user", "assistant", "tool")
MESSAGE_KEYS = {"role", "content", "reasoning_content", "tool_calls", "tool_call_id"}
MEDIA_TYPES = ("image", "image_url", "video", "video_url")


class MessagesError(ValueError):
    """The messages file or request is malformed (the message says where)."""


@dataclass
class ChatRequest:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)

    @property
    def has_media(self) -> bool:
        for m in self.messages:
            if isinstance(m.get("content"), list) and any(p.get("type") in MEDIA_TYPES for p in m["content"]):
                return True
        return False


def from_prompt(prompt: str) -> ChatRequest:
    if not prompt:
        raise MessagesError("--prompt must not be empty")
    return ChatRequest([{"role": "user", "content": prompt}])


def load_messages_file(path: str | Path) -> ChatRequest:
    path = Path(path)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise MessagesError(f"{path}: no such messages file") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise MessagesError(f"{path}: not valid JSON ({exc})") from None
    try:
        return parse_request(raw)
    except MessagesError as exc:
        raise MessagesError(f"{path}: {exc}") from None


def parse_request(raw: Any) -> ChatRequest:
    tools: list = []
    if isinstance(raw, dict):
        extra = set(raw) - {"messages", "tools"}
        if extra:
            raise MessagesError(f"unsupported top-level field(s): {', '.join(sorted(extra))}")
        if "messages" not in raw:
            raise MessagesError("the object form needs a 'messages' array")
        tools = raw.get("tools", [])
        if not isinstance(tools, list) or not all(_is_function_tool(t) for t in tools):
            raise MessagesError("'tools' must be an array of function tools ({type: function, function: {name, ...}})")
        raw = raw["messages"]
    if not isinstance(raw, list) or not raw:
        raise MessagesError("messages must be a non-empty JSON array")
    messages = [_message(i, m) for i, m in enumerate(raw)]
    if not any(m["role"] == "user" for m in messages):
        raise MessagesError("at least one user message is required")
    return ChatRequest(messages, tools)


def _is_function_tool(tool: Any) -> bool:
    return (isinstance(tool, dict) and tool.get("type", "function") == "function" and isinstance(tool.get("function"), dict)
            and isinstance(tool["function"].get("name"), str) and bool(tool["function"]["name"]))


def _message(i: int, m: Any) -> dict[str, Any]:
    if not isinstance(m, dict):
        raise MessagesError(f"message {i} must be an object")
    for key in m:
        if key not in MESSAGE_KEYS:
            raise MessagesError(f"message {i} contains unsupported field: {key}")
    role = m.get("role")
    if role not in ROLES:
        raise MessagesError(f"message {i}: role must be one of {', '.join(ROLES)}, got {role!r}")
    if "content" not in m:
        raise MessagesError(f"message {i}: 'content' is required (use null with tool_calls)")
    content = m["content"]
    out: dict[str, Any] = {"role": "system" if role == "developer" else role}
    if content is None or isinstance(content, str):
        out["content"] = content
    elif isinstance(content, list) and content:
        out["content"] = [_part(i, j, p) for j, p in enumerate(content)]
    else:
        raise MessagesError(f"message {i}: content must be a string, a non-empty array of parts, or null")
    if "reasoning_content" in m:
        if not isinstance(m["reasoning_content"], str):
            raise MessagesError(f"message {i}: reasoning_content must be a string")
        out["reasoning_content"] = m["reasoning_content"]
    if "tool_calls" in m:
        if role != "assistant":
            raise MessagesError(f"message {i}: only assistant messages may have tool_calls")
        calls = m["tool_calls"]
        if not isinstance(calls, list) or not calls:
            raise MessagesError(f"message {i}: tool_calls must be a non-empty array")
        out["tool_calls"] = [_tool_call(i, j, c) for j, c in enumerate(calls)]
    if "tool_call_id" in m:
        if role != "tool" or not isinstance(m["tool_call_id"], str):
            raise MessagesError(f"message {i}: tool_call_id must be a string, on tool messages only")
        out["tool_call_id"] = m["tool_call_id"]
    empty = out["content"] is None or out["content"] == ""
    if empty and not out.get("tool_calls"):
        raise MessagesError(f"message {i}: empty content and no tool calls")
    return out


def _part(i: int, j: int, p: Any) -> dict[str, Any]:
    if not isinstance(p, dict):
        raise MessagesError(f"message {i} part {j} must be an object")
    kind = p.get("type", "text" if "text" in p else None)
    if kind == "text" or (kind is None and "text" in p):
        if not isinstance(p.get("text"), str):
            raise MessagesError(f"message {i} part {j}: text must be a string")
        return {"type": "text", "text": p["text"]}
    if kind in MEDIA_TYPES:
        return dict(p)
    raise MessagesError(f"message {i} part {j}: unsupported content part type {kind!r}")


def _tool_call(i: int, j: int, c: Any) -> dict[str, Any]:
    if not isinstance(c, dict):
        raise MessagesError(f"message {i} tool call {j} must be an object")
    fn = c.get("function", c)
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise MessagesError(f"message {i} tool call {j}: a function name is required")
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            raise MessagesError(f"message {i} tool call {j}: arguments is not valid JSON") from None
    if not isinstance(args, dict):
        raise MessagesError(f"message {i} tool call {j}: arguments must be a JSON object")
    call = {"type": "function", "function": {"name": fn["name"], "arguments": args}}
    if isinstance(c.get("id"), str):
        call["id"] = c["id"]
    return call
