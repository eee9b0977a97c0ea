"""The official `openai` client against the real server: chat, completions, tools, JSON schema,
reasoning, logprobs, errors. The model has random weights, so tests check shapes and whatever a
grammar guarantees, never the wording."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

pytestmark = pytest.mark.slow

NO_THINKING = {"enable_thinking": False}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string", "maxLength": 8}}, "required": ["zone"]}}}
USER = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_models_list_and_retrieve(openai_client, server):
    models = openai_client.models.list().data
    assert [m.id for m in models] == [server.model_id]
    assert openai_client.models.retrieve(server.model_id).id == server.model_id
    with pytest.raises(openai.NotFoundError) as info:
        openai_client.models.retrieve("no-such-model")
    assert info.value.body["code"] == "model_not_found"


def test_chat_non_streaming(openai_client, server):
    r = openai_client.chat.completions.create(model=server.model_id, messages=USER, max_tokens=8, seed=3,
                                              extra_body=NO_THINKING)
    choice = r.choices[0]
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= 8 and r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    again = openai_client.chat.completions.create(model=server.model_id, messages=USER, max_tokens=8, seed=3,
                                                  extra_body=NO_THINKING)
    assert again.choices[0].message.content == choice.message.content  # a seed makes it reproducible


def test_chat_streaming_with_usage(openai_client, server):
    chunks = list(openai_client.chat.completions.create(
        model=server.model_id, messages=USER, max_tokens=10, stream=True, stream_options={"include_usage": True},
        extra_body=NO_THINKING))
    assert chunks[0].choices[0].delta.role == "assistant"
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason in ("stop", "length")
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens <= 10
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert isinstance(text, str)


def test_reasoning_split_and_enable_thinking(openai_client, server):
    on = openai_client.chat.completions.create(model=server.model_id, messages=USER, max_tokens=12, seed=1)
    msg = on.choices[0].message.model_dump()
    assert msg.get("reasoning_content")  # thinking on: output starts in the reasoning channel
    assert on.usage.completion_tokens_details.reasoning_tokens > 0
    off = openai_client.chat.completions.create(model=server.model_id, messages=USER, max_tokens=12, seed=1,
                                               extra_body=NO_THINKING)
    assert not off.choices[0].message.model_dump().get("reasoning_content")
    assert off.usage.completion_tokens_details.reasoning_tokens == 0
    stream = openai_client.chat.completions.create(model=server.model_id, messages=USER, max_tokens=12, seed=1,
                                                   stream=True)
    streamed = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in stream if c.choices)
    assert streamed == msg["reasoning_content"]


def test_thinking_budget_closes_reasoning(openai_client, server):
    r = openai_client.chat.completions.create(model=server.model_id, messages=USER, max_tokens=120, seed=2,
                                              extra_body={"thinking_budget": 4})
    msg = r.choices[0].message.model_dump()
    assert msg["reasoning_content"].endswith("thinking directly now.\n")
    assert r.usage.completion_tokens_details.reasoning_tokens > 4  # the forced closing text counts too


def _streamed_calls(stream) -> tuple[list[dict], str | None]:
    calls: dict[int, dict] = {}
    finish = None
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        for tc in delta.tool_calls or []:
            entry = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
            entry["id"] = tc.id or entry["id"]
            entry["name"] += tc.function.name or ""
            entry["arguments"] += tc.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    return [calls[i] for i in sorted(calls)], finish


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_tool_call_round_trip_streamed(openai_client, server, choice):
    stream = openai_client.chat.completions.create(
        model=server.model_id, messages=USER, tools=[WEATHER, TIME], tool_choice=choice, max_tokens=400,
        stream=True, parallel_tool_calls=False, seed=21, extra_body={"thinking_budget": 2})
    calls, finish = _streamed_calls(stream)
    assert finish == "tool_calls" and len(calls) == 1
    call = calls[0]
    assert call["id"].startswith("call_")
    tool = WEATHER if call["name"] == "get_weather" else TIME
    if choice != "required":
        assert call["name"] == "get_weather"
    args = json.loads(call["arguments"])
    jsonschema.validate(args, tool["function"]["parameters"])
    history = USER + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": call["arguments"]}}]},
        {"role": "tool", "tool_call_id": call["id"], "content": json.dumps({"temperature": 21})},
    ]
    follow = openai_client.chat.completions.create(model=server.model_id, messages=history, tools=[WEATHER, TIME],
                                                   max_tokens=8, stream=True, extra_body=NO_THINKING)
    _, finish = _streamed_calls(follow)
    assert finish in ("stop", "length", "tool_calls")


def test_parallel_forced_tool_calls_non_streaming(openai_client, server):
    r = openai_client.chat.completions.create(model=server.model_id, messages=USER, tools=[WEATHER, TIME],
                                              tool_choice="required", max_tokens=600, seed=5, extra_body=NO_THINKING)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and msg.tool_calls
    for call in msg.tool_calls:
        tool = {"get_weather": WEATHER, "get_time": TIME}[call.function.name]
        jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])


def test_tool_choice_none_renders_no_tools(openai_client, server):
    r = openai_client.chat.completions.create(model=server.model_id, messages=USER, tools=[WEATHER],
                                              tool_choice="none", max_tokens=4, extra_body=NO_THINKING)
    plain = openai_client.chat.completions.create(model=server.model_id, messages=USER, max_tokens=4,
                                                  extra_body=NO_THINKING)
    assert r.usage.prompt_tokens == plain.usage.prompt_tokens
    with_tools = openai_client.chat.completions.create(model=server.model_id, messages=USER, tools=[WEATHER],
                                                       max_tokens=4, extra_body=NO_THINKING)
    assert with_tools.usage.prompt_tokens > plain.usage.prompt_tokens


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "role": {"type": "string", "enum": ["admin", "user", "guest"]},
        "active": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 3},
    },
    "required": ["name", "age", "role", "active"],
    "additionalProperties": False,
}


def test_json_schema_output_validates(openai_client, server):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    for seed in range(20):
        r = openai_client.chat.completions.create(
            model=server.model_id, messages=[{"role": "user", "content": "Describe a person as JSON."}],
            response_format=fmt, max_tokens=300, seed=seed, temperature=1.0, extra_body=NO_THINKING)
        assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
        jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)


def test_json_schema_after_reasoning(openai_client, server):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    r = openai_client.chat.completions.create(model=server.model_id, messages=USER, response_format=fmt,
                                              max_tokens=400, seed=7, extra_body={"thinking_budget": 3})
    assert r.choices[0].message.model_dump()["reasoning_content"]
    jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)


def test_json_object_mode(openai_client, server):
    r = openai_client.chat.completions.create(model=server.model_id, messages=USER, max_tokens=200, seed=4,
                                              response_format={"type": "json_object"}, extra_body=NO_THINKING)
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:  # an open-ended object may run out of tokens; it is still a JSON prefix
        assert r.choices[0].message.content.startswith("{")


def test_invalid_json_schema_is_a_400(openai_client, server):
    with pytest.raises(openai.BadRequestError):
        openai_client.chat.completions.create(
            model=server.model_id, messages=USER, max_tokens=4,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 12}}})


def test_logprobs(openai_client, server):
    r = openai_client.chat.completions.create(model=server.model_id, messages=USER, max_tokens=5, logprobs=True,
                                              top_logprobs=3, extra_body=NO_THINKING)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3


def test_stop_string_is_withheld(openai_client, server):
    base = openai_client.chat.completions.create(model=server.model_id, messages=USER, max_tokens=12, seed=11,
                                                 extra_body=NO_THINKING).choices[0].message.content
    # seeded sampling on fixed weights: deterministic, so a short answer is a regression, not bad luck
    assert len(base) >= 4, f"the tiny model's seeded answer is too short to pick a stop string: {base!r}"
    stop = base[2:4]
    r = openai_client.chat.completions.create(model=server.model_id, messages=USER, max_tokens=12, seed=11, stop=[stop],
                                              extra_body=NO_THINKING)
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == base[: base.index(stop)]


def test_completions(openai_client, server):
    r = openai_client.completions.create(model=server.model_id, prompt="Once upon a time", max_tokens=6, echo=True,
                                         logprobs=2)
    assert r.object == "text_completion" and r.choices[0].text.startswith("Once upon a time")
    assert len(r.choices[0].logprobs.tokens) == r.usage.completion_tokens
    chunks = list(openai_client.completions.create(model=server.model_id, prompt=[5, 6, 7], max_tokens=6, stream=True))
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_n_greater_than_one_is_rejected(openai_client, server):
    with pytest.raises(openai.BadRequestError) as info:
        openai_client.chat.completions.create(model=server.model_id, messages=USER, n=2)
    assert info.value.body["code"] == "n_not_supported" and info.value.body["param"] == "n"


def test_wrong_api_key(server):
    bad = openai.OpenAI(base_url=server.base_url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as info:
        bad.models.list()
    assert info.value.status_code == 401 and info.value.body["code"] == "invalid_api_key"
