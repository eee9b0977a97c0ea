"""Anthropic dialect: `/v1/messages` and `/v1/messages/count_tokens` (product spec 3.8).

Requests are reduced to the same `ChatSpec` as OpenAI's: the system text leads, `tool_result`
blocks become tool turns before the user's text, assistant `thinking` / `tool_use` blocks become
reasoning and tool-call history. A final text-only assistant message is a prefill that the answer
continues. Streaming emits message_start, content blocks in order (thinking, text, tool_use),
message_delta and message_stop.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from typing import Any

from sanic import response

from .errors import ApiError, anthropic_body, bad_request
from .generation import KEEPALIVE, Delta, Generation, Outcome
from .jobs import ChatSpec, parse_body, prepare_chat
from .records import RequestRecord
from .requests import opt_bool, opt_int, read_sampling, stop_strings
from .streaming import KEEPALIVE_FRAME, event_frame, open_stream
from .tools import anthropic_tools

KEEPALIVE_SECONDS = 5.0
_MEDIA = ("image", "document", "video")


def _system_text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for i, block in enumerate(value):
            if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
                raise bad_request(f"system[{i}] must be a text block", "system")
            texts.append(block["text"])
        return "\n".join(texts)
    raise bad_request("system must be a string or an array of text blocks", "system")


def _tool_result_text(block: dict[str, Any], where: str) -> str:
    content = block.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise bad_request(f"{where}.content[{j}] must be a block", "messages")
            if part["type"] in _MEDIA:
                raise ApiError(400, "Vision is disabled for this server", code="vision_disabled", param="messages")
            if part["type"] != "text" or not isinstance(part.get("text"), str):
                raise bad_request(f"{where}.content[{j}]: only text blocks are supported in tool results", "messages")
            texts.append(part["text"])
        return "\n".join(texts)
    raise bad_request(f"{where}.content must be a string or an array of blocks", "messages")


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise bad_request(f"{where}.content must be a string or an array of blocks", "messages")
    for j, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise bad_request(f"{where}.content[{j}] must be an object with a type", "messages")
    return content


def _user_turns(content: Any, where: str) -> tuple[list[dict[str, Any]], bool]:
    """Template messages of one user message: tool results first, then its text."""
    tools, texts = [], []
    for j, block in enumerate(_blocks(content, where)):
        kind, w = block["type"], f"{where}.content[{j}]"
        if kind == "text":
            if not isinstance(block.get("text"), str):
                raise bad_request(f"{w}.text must be a string", "messages")
            texts.append(block["text"])
        elif kind == "tool_result":
            if not isinstance(block.get("tool_use_id"), str) or not block["tool_use_id"]:
                raise bad_request(f"{w}.tool_use_id must be a non-empty string", "messages")
            if block.get("is_error") is not None and not isinstance(block["is_error"], bool):
                raise bad_request(f"{w}.is_error must be a boolean", "messages")
            text = _tool_result_text(block, w)
            if block.get("is_error"):
                text = f"Error: {text}"
            tools.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": text})
        elif kind in _MEDIA:
            raise ApiError(400, "Vision is disabled for this server", code="vision_disabled", param="messages")
        else:
            raise bad_request(f"{w}: block type '{kind}' is not supported in user messages", "messages")
    turns = list(tools)
    if texts:
        turns.append({"role": "user", "content": "\n".join(texts)})
    return turns, bool(texts)


def _assistant_turn(content: Any, where: str) -> dict[str, Any]:
    texts, reasoning, calls = [], [], []
    for j, block in enumerate(_blocks(content, where)):
        kind, w = block["type"], f"{where}.content[{j}]"
        if kind == "text":
            if not isinstance(block.get("text"), str):
                raise bad_request(f"{w}.text must be a string", "messages")
            texts.append(block["text"])
        elif kind == "thinking":
            if not isinstance(block.get("thinking"), str):
                raise bad_request(f"{w}.thinking must be a string", "messages")
            reasoning.append(block["thinking"])
        elif kind == "redacted_thinking":
            continue
        elif kind == "tool_use":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str) or not block["name"]:
                raise bad_request(f"{w} needs a string id and name", "messages")
            if not isinstance(block.get("input"), dict):
                raise bad_request(f"{w}.input must be an object", "messages")
            calls.append({"id": block["id"], "type": "function",
                          "function": {"name": block["name"], "arguments": block["input"]}})
        else:
            raise bad_request(f"{w}: block type '{kind}' is not supported in assistant messages", "messages")
    turn: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts)}
    if reasoning:
        turn["reasoning_content"] = "\n".join(reasoning)
    if calls:
        turn["tool_calls"] = calls
    return turn


def anthropic_messages(body: dict[str, Any]) -> tuple[list[dict[str, Any]], bool, str | None]:
    """(template messages, tool history present, assistant prefill)."""
    system = _system_text(body.get("system"))
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise bad_request("messages must be a non-empty array", "messages")
    system_parts = [system] if system else []
    turns: list[dict[str, Any]] = []
    history = has_query = False
    prefill = None
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise bad_request(f"{where} must be an object with a string role", "messages")
        role = m["role"]
        if "content" not in m:
            raise bad_request(f"{where}.content is required", "messages")
        if role == "system":
            system_parts.append(_system_text(m["content"]) or "")
        elif role == "user":
            user, query = _user_turns(m["content"], where)
            history = history or any(t["role"] == "tool" for t in user)
            has_query = has_query or query
            turns.extend(user)
        elif role == "assistant":
            turn = _assistant_turn(m["content"], where)
            history = history or bool(turn.get("tool_calls"))
            last = i == len(raw) - 1
            if last and not turn.get("tool_calls") and not turn.get("reasoning_content") and turn["content"]:
                prefill = turn["content"]
            else:
                turns.append(turn)
        else:
            raise ApiError(400, f"role '{role}' is not supported", code="unsupported_role", param="messages")
    if not has_query:
        raise ApiError(400, "at least one user message with text is required", code="invalid_prompt",
                       param="messages")
    if system_parts:
        turns.insert(0, {"role": "system", "content": "\n".join(system_parts)})
    return turns, history, prefill


def _thinking(body: dict[str, Any], service: Any) -> tuple[bool, int | None]:
    value = body.get("thinking")
    default_budget = service.config.sampling.thinking_budget
    if value is None:
        return service.config.sampling.thinking, default_budget
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise bad_request("thinking must be an object with a string type", "thinking")
    if value["type"] == "disabled":
        return False, None
    budget = opt_int(value, "budget_tokens", 1, 2**31 - 1, param="thinking.budget_tokens")
    return True, budget if budget is not None else default_budget


def messages_spec(service: Any, body: dict[str, Any], *, count_only: bool = False) -> ChatSpec:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("model is required (a non-empty string)", "model")
    plan = anthropic_tools(body)
    messages, history, prefill = anthropic_messages(body)
    thinking, budget = _thinking(body, service)
    if count_only:
        return ChatSpec("anthropic_count_tokens", model, messages, plan=plan, thinking=thinking, prefill=prefill,
                        max_name_len=128, has_tool_history=history)
    stop = stop_strings(body.get("stop_sequences"), "stop_sequences")
    sampling = read_sampling(body, penalties=False, seed=False)
    stream = bool(opt_bool(body, "stream"))
    max_tokens = opt_int(body, "max_tokens", 1, 2**31 - 1)
    if budget is not None and max_tokens is not None and budget >= max_tokens:
        raise bad_request("thinking.budget_tokens must be less than max_tokens", "thinking.budget_tokens")
    return ChatSpec("anthropic_messages", model, messages, plan=plan, thinking=thinking, thinking_budget=budget,
                    max_tokens=max_tokens, sampling=sampling, stop=stop, prefill=prefill, stream=stream,
                    max_name_len=128, has_tool_history=history)


async def count_tokens(request: Any) -> Any:
    service = request.app.ctx.service
    spec = messages_spec(service, parse_body(request.body), count_only=True)

    def count() -> int:
        text = service.render(spec.messages, spec.plan.tools if spec.plan.active else None,
                              spec.thinking and spec.prefill is None)
        return len(service.encode(text + (spec.prefill or "")))

    return response.json({"input_tokens": await asyncio.to_thread(count)})


# -- responses --------------------------------------------------------------------------------


def stop_reason(out: Outcome) -> str:
    if out.tool_calls:
        return "tool_use"
    if out.finish_reason == "stop_string":
        return "stop_sequence"
    if out.finish_reason == "length":
        return "max_tokens"
    if out.finish_reason == "context_capacity":
        return "model_context_window_exceeded"
    return "end_turn"


def _usage(out: Outcome, output_tokens: int | None = None) -> dict[str, Any]:
    return {"input_tokens": out.prompt_tokens,
            "output_tokens": out.completion_tokens if output_tokens is None else output_tokens,
            "cache_read_input_tokens": out.cached_tokens, "cache_creation_input_tokens": 0}


def tool_use_block(call: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": call.id, "name": call.name, "input": json.loads(call.arguments_json)}


def message_response(message_id: str, model: str, out: Outcome) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if out.reasoning_text:
        content.append({"type": "thinking", "thinking": out.reasoning_text, "signature": ""})
    if out.text:
        content.append({"type": "text", "text": out.text})
    content.extend(tool_use_block(c) for c in out.tool_calls)
    if not content:
        content.append({"type": "text", "text": ""})
    return {"id": message_id, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": stop_reason(out),
            "stop_sequence": out.stop_sequence if out.finish_reason == "stop_string" else None,
            "usage": _usage(out)}


async def messages(request: Any) -> Any:
    service = request.app.ctx.service
    ctx = request.ctx.info
    record = RequestRecord(service, ctx, "/v1/messages")
    try:
        spec = messages_spec(service, parse_body(request.body))
        prepared = await asyncio.to_thread(prepare_chat, service, spec)  # templates, tokenizer, grammar
        record.describe(model=spec.model, stream=spec.stream, message_count=len(spec.messages), prepared=prepared,
                        plan=spec.plan, thinking=prepared.job.thinking, has_tool_history=spec.has_tool_history)
        gen = Generation(service, prepared.job, keepalive=KEEPALIVE_SECONDS if spec.stream else None)
        gen.submit()
        record.outcome = gen.outcome
        message_id = "msg_" + secrets.token_hex(8)
        if spec.stream:
            await _stream_messages(request, gen, message_id, spec.model, record)
            return None
        async for _ in gen.run():
            pass
        return response.json(message_response(message_id, spec.model, gen.outcome))
    except ApiError as err:
        record.fail(err)
        raise
    except asyncio.CancelledError:  # the client went away; its request was cancelled
        record.disconnected()
        raise
    finally:
        record.write()


class _Blocks:
    """Content-block bookkeeping of one streamed message: indices in emission order."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.index = -1
        self.open: str | None = None

    async def start(self, block: dict[str, Any]) -> None:
        await self.close()
        self.index += 1
        self.open = block["type"]
        await self.stream.send(event_frame("content_block_start", {"type": "content_block_start",
                                                                   "index": self.index, "content_block": block}))

    async def delta(self, delta: dict[str, Any]) -> None:
        await self.stream.send(event_frame("content_block_delta", {"type": "content_block_delta",
                                                                   "index": self.index, "delta": delta}))

    async def close(self) -> None:
        if self.open is None:
            return
        if self.open == "thinking":
            await self.delta({"type": "signature_delta", "signature": ""})
        await self.stream.send(event_frame("content_block_stop", {"type": "content_block_stop", "index": self.index}))
        self.open = None

    async def text(self, kind: str, text: str) -> None:
        if self.open != kind:
            await self.start({"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking"
                             else {"type": "text", "text": ""})
        key = "thinking" if kind == "thinking" else "text"
        await self.delta({"type": f"{key}_delta", key: text})


async def _stream_messages(request: Any, gen: Generation, message_id: str, model: str,
                           record: RequestRecord) -> None:
    events = gen.run()
    try:
        try:
            item = await events.__anext__()
        except StopAsyncIteration:
            item = None
        stream = await open_stream(request)
        out = gen.outcome
        start = {"id": message_id, "type": "message", "role": "assistant", "model": model, "content": [],
                 "stop_reason": None, "stop_sequence": None, "usage": _usage(out, 0)}
        await stream.send(event_frame("message_start", {"type": "message_start", "message": start}))
        blocks = _Blocks(stream)
        while item is not None:
            if item is KEEPALIVE:
                await stream.send(KEEPALIVE_FRAME)
            elif isinstance(item, Delta):
                if item.reasoning:
                    await blocks.text("thinking", item.reasoning)
                if item.content:
                    await blocks.text("text", item.content)
                for call in item.tool_calls:
                    await blocks.start({"type": "tool_use", "id": call.id, "name": call.name, "input": {}})
                    await blocks.delta({"type": "input_json_delta", "partial_json": call.arguments_json})
                    await blocks.close()
            try:
                item = await events.__anext__()
            except StopAsyncIteration:
                break
            except ApiError as err:
                record.fail(err)
                await stream.send(event_frame("error", anthropic_body(err)))
                await stream.eof()
                return
        if blocks.index < 0:
            await blocks.start({"type": "text", "text": ""})
        await blocks.close()
        await stream.send(event_frame("message_delta", {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason(out),
                      "stop_sequence": out.stop_sequence if out.finish_reason == "stop_string" else None},
            "usage": {"output_tokens": out.completion_tokens}}))
        await stream.send(event_frame("message_stop", {"type": "message_stop"}))
        await stream.eof()
    finally:
        await events.aclose()
