"""From a validated chat request (either dialect) to an engine job.

Both dialects reduce their body to a `ChatSpec`; `prepare_chat` renders the prompt through the
artifact's chat template, checks it against the context limit, resolves sampling, compiles the
grammar that constrained output needs and builds the `allowed_tokens` controller.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..engine import GenerationParams
from .constrained import OutputController
from .errors import ApiError, bad_request
from .generation import Job
from .requests import output_limit, resolve_sampling
from .tools import ToolPlan


@dataclass
class ChatSpec:
    protocol: str  # openai_chat_completions | anthropic_messages
    model: str
    messages: list[dict[str, Any]]
    plan: ToolPlan = field(default_factory=ToolPlan)
    thinking: bool = True
    thinking_budget: int | None = None
    max_tokens: int | None = None  # as requested
    sampling: dict[str, Any] = field(default_factory=dict)
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    logprobs: int | None = None  # top alternatives per token; None: not requested
    json_schema: Any = None  # constrain the answer to this JSON schema
    ignore_eos: bool = False
    prefill: str | None = None  # Anthropic: a final assistant text the answer continues
    stream: bool = False
    max_name_len: int = 64
    has_tool_history: bool = False


@dataclass
class Prepared:
    job: Job
    prompt_text: str
    max_tokens: int
    max_tokens_source: str


def parse_body(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object (400 otherwise; never a 500)."""
    try:
        body = json.loads(raw or b"")
    except (ValueError, RecursionError):
        raise bad_request("request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise bad_request("request body must be a JSON object")
    if _depth(body) > MAX_DEPTH:
        raise bad_request(f"request body nests deeper than {MAX_DEPTH} levels")
    return body


MAX_DEPTH = 64


def _depth(value: Any) -> int:
    """Nesting depth of parsed JSON, without recursion (templates and grammars do recurse)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if depth > MAX_DEPTH:
            break
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)
    return deepest


def prepare_chat(service: Any, spec: ChatSpec) -> Prepared:
    thinking = spec.thinking and spec.prefill is None
    tools = spec.plan.tools if spec.plan.active else None
    text = service.render(spec.messages, tools, thinking)
    if spec.prefill is not None:
        text += spec.prefill
    prompt_ids = service.encode(text)
    default = service.config.sampling.max_tokens
    max_tokens = output_limit(spec.max_tokens, default, len(prompt_ids), service.max_context)
    sampling = resolve_sampling(service.defaults, spec.sampling, spec.logprobs)
    grammar = None
    if spec.plan.forced:
        grammar = service.grammars.tool_calls(spec.plan.tools, spec.plan.parallel)
    elif spec.json_schema is not None:
        grammar = service.grammars.json_schema(spec.json_schema)
    budget = spec.thinking_budget if thinking else None
    if budget is not None and max_tokens > budget and max_tokens < budget + len(service.budget_close_ids) + 1:
        raise ApiError(400, f"max_tokens {max_tokens} leaves no room to close a thinking budget of {budget} "
                            f"tokens ({len(service.budget_close_ids)} closing tokens plus an answer)",
                       code="thinking_budget_capacity_insufficient", param="max_tokens")
    controller = None
    if grammar is not None or (budget is not None and service.budget_close_ids):
        controller = OutputController(
            service.vocab_size, reasoning=thinking, think_close_id=service.grammars.think_close_id,
            budget=budget, close_ids=service.budget_close_ids,
            matcher=service.grammars.matcher(grammar) if grammar is not None else None,
            eos_ids=(*service.eos_token_ids, *spec.stop_token_ids))
    params = GenerationParams(max_tokens=max_tokens, sampling=sampling, stop_token_ids=spec.stop_token_ids,
                              logprobs=spec.logprobs, allowed_tokens=controller, ignore_eos=spec.ignore_eos)
    job = Job(prompt_ids, params, thinking=thinking, tools=tools, max_name_len=spec.max_name_len, stop=spec.stop,
              controller=controller)
    return Prepared(job, text, max_tokens, "client" if spec.max_tokens is not None else "server_default")


def read_thinking(body: dict[str, Any], default: bool) -> bool:
    """`enable_thinking` at top level or in `chat_template_kwargs`, `reasoning_effort: none`."""
    from .requests import opt_bool, opt_str, opt_type

    top = opt_bool(body, "enable_thinking")
    kwargs = opt_type(body, "chat_template_kwargs", dict) or {}
    nested = opt_bool(kwargs, "enable_thinking", param="chat_template_kwargs.enable_thinking")
    if top is not None and nested is not None and top != nested:
        raise ApiError(400, "enable_thinking and chat_template_kwargs.enable_thinking disagree",
                       code="conflicting_template_option", param="enable_thinking")
    effort = opt_str(body, "reasoning_effort")
    if effort is not None and effort not in ("none", "minimal", "low", "medium", "high", "xhigh", "max"):
        raise ApiError(400, f"reasoning_effort {effort!r} is not supported", code="reasoning_effort_not_supported",
                       param="reasoning_effort")
    chosen = top if top is not None else nested
    if effort == "none":
        if chosen:
            raise ApiError(400, "reasoning_effort none contradicts enable_thinking true",
                           code="conflicting_template_option", param="reasoning_effort")
        return False
    return default if chosen is None else chosen
