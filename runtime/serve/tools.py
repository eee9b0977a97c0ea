"""Tool definitions and tool_choice of both dialects, normalized for the chat template.

The template (and the Qwen tool-call parser) take OpenAI function tools
`{"type": "function", "function": {name, description?, parameters}}`; Anthropic tools
`{name, description?, input_schema}` are converted to that. `ToolPlan` says which tools are
rendered into the prompt, which calls the parser accepts, and whether a grammar forces a call.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from .errors import ApiError, bad_request

_NAME = {64: re.compile(r"[A-Za-z0-9_-]{1,64}"), 128: re.compile(r"[A-Za-z0-9_-]{1,128}")}
EMPTY_PARAMETERS = {"type": "object", "properties": {}}


@dataclass
class ToolPlan:
    """The effective tool set of a request."""

    tools: list[dict[str, Any]] = field(default_factory=list)  # rendered and parsed (OpenAI form)
    choice: str = "auto"  # auto | none | required | the forced function's name (for the log)
    forced: bool = False  # a grammar forces at least one call
    parallel: bool = True
    declared: int = 0  # tools the request defined

    @property
    def active(self) -> bool:
        return bool(self.tools)


def _function_tool(name: str, description: Any, parameters: Any, where: str, name_len: int) -> dict[str, Any]:
    if not isinstance(name, str) or not _NAME[name_len].fullmatch(name):
        raise bad_request(f"{where}.name must match [A-Za-z0-9_-]{{1,{name_len}}}", "tools")
    if description is not None and not isinstance(description, str):
        raise bad_request(f"{where}.description must be a string", "tools")
    if parameters is None:
        parameters = dict(EMPTY_PARAMETERS)
    if not isinstance(parameters, dict):
        raise bad_request(f"{where} parameters must be a JSON schema object", "tools")
    fn: dict[str, Any] = {"name": name}
    if description is not None:
        fn["description"] = description
    fn["parameters"] = parameters
    return {"type": "function", "function": fn}


def _unique(tools: list[dict[str, Any]]) -> None:
    names = [t["function"]["name"] for t in tools]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise bad_request(f"duplicate tool name {dupes[0]!r}", "tools")


def openai_tools(body: dict[str, Any]) -> ToolPlan:
    """`tools`, `tool_choice` and `parallel_tool_calls` of a Chat Completions request."""
    raw = body.get("tools")
    tools: list[dict[str, Any]] = []
    if raw is not None:
        if not isinstance(raw, list):
            raise bad_request("tools must be an array", "tools")
        for i, tool in enumerate(raw):
            if not isinstance(tool, dict):
                raise bad_request(f"tools[{i}] must be an object", "tools")
            if tool.get("type", "function") != "function":
                raise ApiError(400, f"tools[{i}]: only function tools are supported", param="tools",
                               code="tool_type_not_supported")
            fn = tool.get("function")
            if not isinstance(fn, dict):
                raise bad_request(f"tools[{i}].function must be an object", "tools")
            if fn.get("strict") is not None and not isinstance(fn.get("strict"), bool):
                raise bad_request(f"tools[{i}].function.strict must be a boolean", "tools")
            tools.append(_function_tool(fn.get("name"), fn.get("description"), fn.get("parameters"),
                                        f"tools[{i}].function", 64))
    _unique(tools)
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise bad_request("parallel_tool_calls must be a boolean", "parallel_tool_calls")
    plan = ToolPlan(tools, declared=len(tools), parallel=parallel is not False)
    choice = body.get("tool_choice")
    if choice is None:
        plan.choice = "auto" if tools else "none"
        return plan
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise bad_request("tool_choice must be none, auto, required or a function object", "tool_choice")
        name = None
    elif isinstance(choice, dict):
        if choice.get("type") != "function":
            raise ApiError(400, "tool_choice object must have type 'function'", param="tool_choice",
                           code="tool_type_not_supported")
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str):
            raise bad_request("tool_choice.function.name must be a string", "tool_choice")
        choice = "named"
    else:
        raise bad_request("tool_choice must be a string or an object", "tool_choice")
    return _apply_choice(plan, choice, name)


def _apply_choice(plan: ToolPlan, choice: str, name: str | None) -> ToolPlan:
    if choice != "none" and not plan.tools:
        raise bad_request("tool_choice requires tools", "tool_choice")
    if choice == "none":
        plan.tools, plan.choice = [], "none"
    elif choice == "required":
        plan.choice, plan.forced = "required", True
    elif choice == "named":
        chosen = [t for t in plan.tools if t["function"]["name"] == name]
        if not chosen:
            raise bad_request(f"tool_choice names function {name!r}, which is not in tools", "tool_choice")
        plan.tools, plan.choice, plan.forced = chosen, str(name), True
    return plan


def anthropic_tools(body: dict[str, Any]) -> ToolPlan:
    """`tools` and `tool_choice` of a Messages request (client tools only)."""
    raw = body.get("tools")
    tools: list[dict[str, Any]] = []
    if raw is not None:
        if not isinstance(raw, list):
            raise bad_request("tools must be an array", "tools")
        for i, tool in enumerate(raw):
            if not isinstance(tool, dict):
                raise bad_request(f"tools[{i}] must be an object", "tools")
            if "input_schema" not in tool or tool.get("type") not in (None, "custom"):
                raise ApiError(400, f"tools[{i}]: only client tools with an input_schema are supported",
                               param="tools", code="tool_type_not_supported")
            tools.append(_function_tool(tool.get("name"), tool.get("description"), tool.get("input_schema"),
                                        f"tools[{i}]", 128))
    _unique(tools)
    plan = ToolPlan(tools, declared=len(tools))
    choice = body.get("tool_choice")
    if choice is None:
        plan.choice = "auto" if tools else "none"
        return plan
    if not isinstance(choice, dict) or choice.get("type") not in ("auto", "any", "none", "tool"):
        raise bad_request("tool_choice must be an object with type auto, any, none or tool", "tool_choice")
    disable_parallel = choice.get("disable_parallel_tool_use")
    if disable_parallel is not None and not isinstance(disable_parallel, bool):
        raise bad_request("tool_choice.disable_parallel_tool_use must be a boolean", "tool_choice")
    plan.parallel = not disable_parallel
    kind = choice["type"]
    name = choice.get("name")
    if kind == "tool" and not isinstance(name, str):
        raise bad_request("tool_choice of type tool needs a name", "tool_choice")
    return _apply_choice(plan, {"any": "required", "tool": "named"}.get(kind, kind), name)
