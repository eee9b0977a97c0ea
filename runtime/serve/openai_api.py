"""OpenAI dialect: `/v1/models`, `/v1/chat/completions` and legacy `/v1/completions`.

Validation follows product spec 3.7.1's order (unsupported features, model, tools, tool_choice,
messages, stop, sampling, stream flags, max tokens); each failure is a 400 naming the field.
Streaming emits the chunk sequence of spec 3.7.4, with content streamed live and each tool call
sent as one chunk when its block closes.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from typing import Any

from sanic import response

from .errors import ApiError, bad_request, openai_body
from .generation import KEEPALIVE, Delta, Generation, Job, Outcome, TokenLogprob
from .jobs import ChatSpec, Prepared, parse_body, prepare_chat, read_thinking
from .records import RequestRecord
from .requests import (
    opt_bool,
    opt_int,
    opt_type,
    output_limit,
    read_sampling,
    resolve_sampling,
    stop_strings,
    token_ids,
)
from .streaming import DONE_FRAME, KEEPALIVE_FRAME, data_frame, open_stream
from .tools import openai_tools

KEEPALIVE_SECONDS = 5.0
_ROLES = ("system", "developer", "user", "assistant", "tool")
_MEDIA = ("image_url", "video_url", "input_image", "image", "video")


def model_object(service: Any) -> dict[str, Any]:
    return {"id": service.model_id, "object": "model", "created": service.created, "owned_by": "ninfer",
            "max_model_len": service.max_context}


async def list_models(request: Any) -> Any:
    return response.json({"object": "list", "data": [model_object(request.app.ctx.service)]})


async def get_model(request: Any, model_id: str) -> Any:
    service = request.app.ctx.service
    if model_id != service.model_id:
        raise ApiError(404, f"model '{model_id}' not found", code="model_not_found", param="model")
    return response.json(model_object(service))


def check_model(service: Any, body: dict[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("model is required (a non-empty string)", "model")
    if model != service.model_id:
        raise ApiError(404, f"model '{model}' not found", code="model_not_found", param="model")
    return model


def _unsupported(body: dict[str, Any]) -> None:
    n = opt_int(body, "n")
    if n is not None and n != 1:
        raise ApiError(400, "n must be 1: several choices per request are not supported", code="n_not_supported",
                       param="n")
    best_of = body.get("best_of")
    if best_of is not None and best_of != 1:
        raise ApiError(400, "best_of must be 1", code="n_not_supported", param="best_of")
    for key in ("functions", "function_call"):
        if body.get(key):
            raise ApiError(400, f"legacy '{key}' is not supported; use tools", code="tools_not_supported", param=key)
    bias = body.get("logit_bias")
    if bias is not None:
        if not isinstance(bias, dict) or not all(isinstance(v, int | float) and not isinstance(v, bool)
                                                 for v in bias.values()):
            raise bad_request("logit_bias must be an object of token id -> number", "logit_bias")
        if any(v for v in bias.values()):
            raise ApiError(400, "non-zero logit_bias is not supported", code="logit_bias_not_supported",
                           param="logit_bias")
    if body.get("audio") is not None:
        raise ApiError(400, "audio output is not supported", code="modality_not_supported", param="audio")


def response_schema(body: dict[str, Any]) -> Any:
    """The JSON schema `response_format` asks for (None for plain text)."""
    fmt = body.get("response_format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or not isinstance(fmt.get("type"), str):
        raise bad_request("response_format must be an object with a type", "response_format")
    kind = fmt["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict):
            raise bad_request("response_format.json_schema must be an object", "response_format")
        if not isinstance(spec.get("name", ""), str):
            raise bad_request("response_format.json_schema.name must be a string", "response_format")
        schema = spec.get("schema", {"type": "object"})
        if not isinstance(schema, dict):
            raise bad_request("response_format.json_schema.schema must be an object", "response_format")
        return schema
    raise ApiError(400, f"response_format type {kind!r} is not supported", code="response_format_not_supported",
                   param="response_format")


def _text_of(content: Any, where: str) -> str:
    """A message's content as text; media and unknown parts are refused by name."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not content:
        raise bad_request(f"{where}.content must be a string or a non-empty array of parts", "messages")
    pieces = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise bad_request(f"{where}.content[{j}] must be an object with a type", "messages")
        kind = part["type"]
        if kind in ("text", "input_text", "output_text"):
            if not isinstance(part.get("text"), str):
                raise bad_request(f"{where}.content[{j}].text must be a string", "messages")
            pieces.append(part["text"])
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            pieces.append(part["refusal"])
        elif kind in _MEDIA:
            raise ApiError(400, "Vision is disabled for this server", code="vision_disabled", param="messages")
        else:
            raise ApiError(400, f"content type '{kind}' is not supported", code="modality_not_supported",
                           param="messages")
    return "".join(pieces)


def _tool_call_history(calls: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(calls, list) or not calls:
        raise bad_request(f"{where}.tool_calls must be a non-empty array", "messages")
    out = []
    for j, call in enumerate(calls):
        w = f"{where}.tool_calls[{j}]"
        if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
            raise bad_request(f"{w} must be an object with a function", "messages")
        if call.get("type", "function") != "function":
            raise ApiError(400, f"{w}: only function tool calls are supported", code="tool_type_not_supported",
                           param="messages")
        fn = call["function"]
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise bad_request(f"{w}.function.name must be a non-empty string", "messages")
        args = fn.get("arguments", "{}")
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except (ValueError, RecursionError):
                raise bad_request(f"{w}.function.arguments is not valid JSON", "messages") from None
        if not isinstance(args, dict):
            raise bad_request(f"{w}.function.arguments must be a JSON object", "messages")
        entry = {"type": "function", "function": {"name": fn["name"], "arguments": args}}
        if isinstance(call.get("id"), str):
            entry["id"] = call["id"]
        out.append(entry)
    return out


def openai_messages(raw: Any) -> tuple[list[dict[str, Any]], bool]:
    """Chat messages for the template, and whether tool history is present (spec 3.7.2)."""
    if not isinstance(raw, list) or not raw:
        raise bad_request("messages must be a non-empty array", "messages")
    messages: list[dict[str, Any]] = []
    history = False
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise bad_request(f"{where} must be an object with a string role", "messages")
        role = m["role"]
        if m.get("function_call") is not None:
            raise ApiError(400, f"{where}: function_call is not supported; use tool_calls",
                           code="tools_not_supported", param="messages")
        if role not in _ROLES:
            raise ApiError(400, f"role '{role}' is not supported", code="unsupported_role", param="messages")
        out: dict[str, Any] = {"role": "system" if role == "developer" else role}
        content = m.get("content")
        if role == "assistant":
            if m.get("tool_calls") is not None:
                out["tool_calls"] = _tool_call_history(m["tool_calls"], where)
                history = True
            out["content"] = "" if content is None else _text_of(content, where)
            reasoning = m.get("reasoning_content", m.get("reasoning"))
            if reasoning is not None:
                if not isinstance(reasoning, str):
                    raise bad_request(f"{where}.reasoning_content must be a string", "messages")
                out["reasoning_content"] = reasoning
            if not out["content"] and not out.get("tool_calls") and not out.get("reasoning_content"):
                raise bad_request(f"{where}: an assistant message needs content or tool_calls", "messages")
        else:
            if m.get("tool_calls") is not None:
                raise bad_request(f"{where}: tool_calls are only allowed on assistant messages", "messages")
            if content is None:
                raise bad_request(f"{where}.content is required", "messages")
            out["content"] = _text_of(content, where)
        if role == "tool":
            call_id = m.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id:
                raise bad_request(f"{where}.tool_call_id must be a non-empty string", "messages")
            out["tool_call_id"] = call_id
            history = True
        elif m.get("tool_call_id") is not None:
            raise bad_request(f"{where}: tool_call_id is only allowed on tool messages", "messages")
        messages.append(out)
    if not any(m["role"] == "user" for m in messages):
        raise ApiError(400, "at least one user message is required", code="invalid_prompt", param="messages")
    return messages, history


def _logprobs_fields(body: dict[str, Any]) -> int | None:
    wanted = opt_bool(body, "logprobs")
    top = opt_int(body, "top_logprobs", 0, 20)
    if top and not wanted:
        raise bad_request("top_logprobs requires logprobs: true", "top_logprobs")
    return (top or 0) if wanted else None


def _stream_flags(body: dict[str, Any]) -> tuple[bool, bool]:
    stream = bool(opt_bool(body, "stream"))
    options = opt_type(body, "stream_options", dict) or {}
    include_usage = bool(opt_bool(options, "include_usage", param="stream_options.include_usage"))
    return stream, include_usage


def chat_spec(service: Any, body: dict[str, Any]) -> ChatSpec:
    _unsupported(body)
    schema = response_schema(body)
    model = check_model(service, body)
    plan = openai_tools(body)
    if plan.forced and schema is not None:
        raise bad_request("response_format cannot be combined with a forced tool_choice", "response_format")
    messages, history = openai_messages(body.get("messages"))
    stop = stop_strings(body.get("stop"), "stop")
    stop_ids = token_ids(body.get("stop_token_ids"), "stop_token_ids", service.vocab_size)
    sampling = read_sampling(body)
    logprobs = _logprobs_fields(body)
    stream, _ = _stream_flags(body)
    thinking = read_thinking(body, service.config.sampling.thinking)
    budget = opt_int(body, "thinking_budget", 0, 2**31 - 1)
    max_tokens = opt_int(body, "max_completion_tokens", 1, 2**31 - 1)
    if max_tokens is None:
        max_tokens = opt_int(body, "max_tokens", 1, 2**31 - 1)
    return ChatSpec("openai_chat_completions", model, messages, plan=plan, thinking=thinking,
                    thinking_budget=budget if budget is not None else service.config.sampling.thinking_budget,
                    max_tokens=max_tokens, sampling=sampling, stop=stop, stop_token_ids=stop_ids, logprobs=logprobs,
                    json_schema=schema, ignore_eos=bool(opt_bool(body, "ignore_eos")), stream=stream,
                    has_tool_history=history)


# -- responses --------------------------------------------------------------------------------


def finish_reason(out: Outcome) -> str:
    if out.tool_calls:
        return "tool_calls"
    return "length" if out.truncated else "stop"


def usage(out: Outcome) -> dict[str, Any]:
    return {"prompt_tokens": out.prompt_tokens, "completion_tokens": out.completion_tokens,
            "total_tokens": out.prompt_tokens + out.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": out.cached_tokens},
            "completion_tokens_details": {"reasoning_tokens": out.reasoning_tokens}}


def _token_text(service: Any, token: int) -> tuple[str, list[int]]:
    try:
        raw = service.tokenizer.token_bytes(token)
    except Exception:  # noqa: BLE001 - non byte-level tokenizers: decode the id alone
        raw = service.tokenizer.decode([token]).encode("utf-8")
    return raw.decode("utf-8", errors="replace"), list(raw)


def chat_logprobs(service: Any, entries: list[TokenLogprob]) -> dict[str, Any]:
    content = []
    for e in entries:
        text, raw = _token_text(service, e.token)
        top = []
        for t, lp in e.top:
            t_text, t_raw = _token_text(service, t)
            top.append({"token": t_text, "logprob": lp, "bytes": t_raw})
        content.append({"token": text, "logprob": e.logprob, "bytes": raw, "top_logprobs": top})
    return {"content": content}


def tool_call_json(call: Any, index: int | None = None) -> dict[str, Any]:
    entry = {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments_json}}
    return entry if index is None else {"index": index, **entry}


def chat_response(service: Any, completion_id: str, created: int, out: Outcome, logprobs: bool) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": out.text or (None if out.tool_calls else "")}
    if out.reasoning_text:
        message["reasoning_content"] = out.reasoning_text
    if out.tool_calls:
        message["tool_calls"] = [tool_call_json(c) for c in out.tool_calls]
    message["refusal"] = None
    choice = {"index": 0, "message": message, "logprobs": chat_logprobs(service, out.logprobs) if logprobs else None,
              "finish_reason": finish_reason(out)}
    return {"id": completion_id, "object": "chat.completion", "created": created, "model": service.model_id,
            "choices": [choice], "usage": usage(out)}


async def chat_completions(request: Any) -> Any:
    service = request.app.ctx.service
    ctx = request.ctx.info
    record = RequestRecord(service, ctx, "/v1/chat/completions")
    try:
        body = parse_body(request.body)
        spec = chat_spec(service, body)
        prepared = await asyncio.to_thread(prepare_chat, service, spec)  # templates, tokenizer, grammar
        record.describe(model=spec.model, stream=spec.stream, message_count=len(spec.messages), prepared=prepared,
                        plan=spec.plan, thinking=prepared.job.thinking, has_tool_history=spec.has_tool_history)
        _, include_usage = _stream_flags(body)
        gen = Generation(service, prepared.job, keepalive=KEEPALIVE_SECONDS if spec.stream else None)
        gen.submit()
        record.outcome = gen.outcome
        completion_id = "chatcmpl-" + secrets.token_hex(8)
        created = int(time.time())
        if spec.stream:
            await _stream_chat(request, service, gen, completion_id, created, include_usage, spec.logprobs is not None,
                               record)
            return None
        async for _ in gen.run():
            pass
        return response.json(chat_response(service, completion_id, created, gen.outcome, spec.logprobs is not None))
    except ApiError as err:
        record.fail(err)
        raise
    except asyncio.CancelledError:  # the client went away; its request was cancelled
        record.disconnected()
        raise
    finally:
        record.write()


async def _first(agen: Any) -> Any:
    try:
        return await agen.__anext__()
    except StopAsyncIteration:
        return None


async def _stream_chat(request: Any, service: Any, gen: Generation, completion_id: str, created: int,
                       include_usage: bool, logprobs: bool, record: RequestRecord) -> None:
    base = {"id": completion_id, "object": "chat.completion.chunk", "created": created, "model": service.model_id}

    def chunk(delta: dict[str, Any], finish: str | None = None, lp: Any = None) -> str:
        body = {**base, "choices": [{"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish}]}
        if include_usage:
            body["usage"] = None
        return data_frame(body)

    events = gen.run()
    try:
        first = await _first(events)  # errors before the first token are plain HTTP errors
        stream = await open_stream(request)
        await stream.send(chunk({"role": "assistant", "content": ""}))
        calls = 0
        item = first
        while True:
            if item is KEEPALIVE:
                await stream.send(KEEPALIVE_FRAME)
            elif isinstance(item, Delta):
                delta: dict[str, Any] = {}
                if item.reasoning:
                    delta["reasoning_content"] = item.reasoning
                if item.content:
                    delta["content"] = item.content
                if item.tool_calls:
                    delta["tool_calls"] = [tool_call_json(c, calls + i) for i, c in enumerate(item.tool_calls)]
                    calls += len(item.tool_calls)
                lp = chat_logprobs(service, item.logprobs) if logprobs and item.logprobs else None
                if delta or lp:
                    await stream.send(chunk(delta, lp=lp))
            try:
                item = await events.__anext__()
            except StopAsyncIteration:
                break
            except ApiError as err:
                record.fail(err)
                await stream.send(data_frame(openai_body(err)))
                await stream.eof()
                return
        out = gen.outcome
        await stream.send(chunk({}, finish_reason(out)))
        if include_usage:
            await stream.send(data_frame({**base, "choices": [], "usage": usage(out)}))
        await stream.send(DONE_FRAME)
        await stream.eof()
    finally:
        await events.aclose()


# -- legacy completions -----------------------------------------------------------------------


def _completion_prompt(service: Any, value: Any) -> tuple[list[int], str]:
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str | list):
        value = value[0]
    if isinstance(value, str):
        if not value:
            raise bad_request("prompt must not be empty", "prompt")
        return service.encode(value), value
    if isinstance(value, list) and value and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        ids = list(token_ids(value, "prompt", service.vocab_size))
        return ids, service.tokenizer.decode(ids)
    raise bad_request("prompt must be a string, one-element array of strings, or an array of token ids "
                      "(batched prompts are not supported)", "prompt")


def completion_logprobs(service: Any, entries: list[TokenLogprob], offset: int) -> dict[str, Any]:
    tokens, lps, tops, offsets = [], [], [], []
    for e in entries:
        text, _ = _token_text(service, e.token)
        tokens.append(text)
        lps.append(e.logprob)
        tops.append({_token_text(service, t)[0]: lp for t, lp in e.top} if e.top else None)
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


async def completions(request: Any) -> Any:
    service = request.app.ctx.service
    ctx = request.ctx.info
    record = RequestRecord(service, ctx, "/v1/completions")
    try:
        body = parse_body(request.body)
        _unsupported(body)
        model = check_model(service, body)
        if body.get("suffix"):
            raise bad_request("suffix is not supported", "suffix")
        prompt_ids, prompt_text = _completion_prompt(service, body.get("prompt"))
        echo = bool(opt_bool(body, "echo"))
        stop = stop_strings(body.get("stop"), "stop")
        stop_ids = token_ids(body.get("stop_token_ids"), "stop_token_ids", service.vocab_size)
        sampling = read_sampling(body)
        logprobs = opt_int(body, "logprobs", 0, 20)
        stream, include_usage = _stream_flags(body)
        requested = opt_int(body, "max_tokens", 1, 2**31 - 1)
        max_tokens = output_limit(requested if requested is not None else 16, 16, len(prompt_ids),
                                  service.max_context)
        params = _params(max_tokens, resolve_sampling(service.defaults, sampling, logprobs), stop_ids, logprobs,
                         bool(opt_bool(body, "ignore_eos")))
        job = Job(prompt_ids, params, raw=True, stop=stop)
        prepared = Prepared(job, prompt_text, max_tokens, "client" if requested is not None else "server_default")
        record.describe(model=model, stream=stream, message_count=1, prepared=prepared, thinking=False)
        gen = Generation(service, job, keepalive=KEEPALIVE_SECONDS if stream else None)
        gen.submit()
        record.outcome = gen.outcome
        cid, created = "cmpl-" + secrets.token_hex(8), int(time.time())
        prefix = prompt_text if echo else ""
        if stream:
            await _stream_completion(request, service, gen, cid, created, prefix, include_usage, logprobs, record)
            return None
        async for _ in gen.run():
            pass
        out = gen.outcome
        choice = {"text": prefix + out.text, "index": 0,
                  "logprobs": completion_logprobs(service, out.logprobs, len(prefix)) if logprobs is not None else None,
                  "finish_reason": "length" if out.truncated else "stop"}
        return response.json({"id": cid, "object": "text_completion", "created": created, "model": service.model_id,
                              "choices": [choice], "usage": usage(out)})
    except ApiError as err:
        record.fail(err)
        raise
    except asyncio.CancelledError:  # the client went away; its request was cancelled
        record.disconnected()
        raise
    finally:
        record.write()


def _params(max_tokens: int, sampling: Any, stop_ids: tuple[int, ...], logprobs: int | None, ignore_eos: bool) -> Any:
    from ..engine import GenerationParams

    return GenerationParams(max_tokens=max_tokens, sampling=sampling, stop_token_ids=stop_ids, logprobs=logprobs,
                            ignore_eos=ignore_eos)


async def _stream_completion(request: Any, service: Any, gen: Generation, cid: str, created: int, prefix: str,
                             include_usage: bool, logprobs: int | None, record: RequestRecord) -> None:
    base = {"id": cid, "object": "text_completion", "created": created, "model": service.model_id}

    def chunk(text: str, finish: str | None = None, lp: Any = None) -> str:
        body = {**base, "choices": [{"text": text, "index": 0, "logprobs": lp, "finish_reason": finish}]}
        if include_usage:
            body["usage"] = None
        return data_frame(body)

    events = gen.run()
    offset = len(prefix)
    try:
        item = await _first(events)
        stream = await open_stream(request)
        if prefix:
            await stream.send(chunk(prefix))
        while True:
            if item is KEEPALIVE:
                await stream.send(KEEPALIVE_FRAME)
            elif isinstance(item, Delta) and (item.content or item.logprobs):
                lp = completion_logprobs(service, item.logprobs, offset) if logprobs is not None else None
                offset += len(item.content)
                await stream.send(chunk(item.content, lp=lp))
            try:
                item = await events.__anext__()
            except StopAsyncIteration:
                break
            except ApiError as err:
                record.fail(err)
                await stream.send(data_frame(openai_body(err)))
                await stream.eof()
                return
        out = gen.outcome
        await stream.send(chunk("", "length" if out.truncated else "stop"))
        if include_usage:
            await stream.send(data_frame({**base, "choices": [], "usage": usage(out)}))
        await stream.send(DONE_FRAME)
        await stream.eof()
    finally:
        await events.aclose()
