"""The official `anthropic` client against the real server: messages, streaming events,
thinking blocks, tool use (grammar-forced), count_tokens, errors."""

from __future__ import annotations

import json

import anthropic
import jsonschema
import pytest

from ninfer_runtime.text import ChatTemplate

pytestmark = pytest.mark.slow

WEATHER = {
    "name": "get_weather",
    "description": "Current weather of a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12},
                       "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city"],
    },
}
USER = [{"role": "user", "content": "What is the weather in Paris?"}]
NO_THINKING = {"type": "disabled"}


def test_message_non_streaming(anthropic_client):
    m = anthropic_client.messages.create(model="anything", max_tokens=8, messages=USER, thinking=NO_THINKING)
    assert m.type == "message" and m.role == "assistant" and m.model == "anything"
    assert m.id.startswith("msg_")
    assert [b.type for b in m.content] == ["text"]
    assert m.stop_reason in ("end_turn", "max_tokens")
    assert m.usage.output_tokens <= 8 and m.usage.input_tokens > 0


def test_thinking_blocks_and_streaming_events(anthropic_client):
    # greedy: the served defaults sample with a fresh seed, and a sampled reply may close the
    # thinking block at once (then the first block is text)
    with anthropic_client.messages.stream(model="m", max_tokens=10, messages=USER, extra_body={"temperature": 0.0},
                                          system="You are terse.") as stream:
        events = [e.type for e in stream]
        final = stream.get_final_message()
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert "message_delta" in events
    assert final.content[0].type == "thinking" and final.content[0].thinking
    assert final.usage.output_tokens <= 10


def test_raw_stream_event_order(anthropic_client):
    raw = anthropic_client.messages.create(model="m", max_tokens=6, messages=USER, stream=True,
                                           thinking=NO_THINKING)
    events = list(raw)
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    starts = [e.index for e in events if e.type == "content_block_start"]
    stops = [e.index for e in events if e.type == "content_block_stop"]
    assert starts == stops == list(range(len(starts))) and starts


def test_stop_sequence(anthropic_client):
    base = anthropic_client.messages.create(model="m", max_tokens=12, messages=USER, thinking=NO_THINKING,
                                            extra_body={"temperature": 0.0})
    text = base.content[0].text
    # greedy on fixed weights: deterministic, so a short answer is a regression, not bad luck
    assert len(text) >= 4, f"the tiny model's greedy answer is too short to pick a stop sequence: {text!r}"
    stop = text[2:4]
    m = anthropic_client.messages.create(model="m", max_tokens=12, messages=USER, thinking=NO_THINKING,
                                         extra_body={"temperature": 0.0}, stop_sequences=[stop])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop
    assert m.content[0].text == text[: text.index(stop)]


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "get_weather"}])
def test_forced_tool_use_round_trip_streamed(anthropic_client, choice):
    with anthropic_client.messages.stream(model="m", max_tokens=400, messages=USER, tools=[WEATHER],
                                          tool_choice={**choice, "disable_parallel_tool_use": True},
                                          thinking={"type": "enabled", "budget_tokens": 2}) as stream:
        partial = [e.delta.partial_json for e in stream
                   if e.type == "content_block_delta" and e.delta.type == "input_json_delta"]
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    uses = [b for b in final.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "get_weather"
    jsonschema.validate(uses[0].input, WEATHER["input_schema"])
    assert json.loads("".join(partial)) == uses[0].input
    history = USER + [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in final.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "21 C, sunny"},
                                     {"type": "text", "text": "Thanks!"}]},
    ]
    with anthropic_client.messages.stream(model="m", max_tokens=6, messages=history, tools=[WEATHER],
                                          thinking=NO_THINKING) as stream:
        follow = stream.get_final_message()
    assert follow.stop_reason in ("end_turn", "max_tokens", "tool_use")


def test_count_tokens_matches_the_tokenizer(anthropic_client, served_tokenizer):
    kwargs = dict(model="m", messages=USER, system="Be brief.", tools=[WEATHER], thinking=NO_THINKING)
    counted = anthropic_client.messages.count_tokens(**kwargs).input_tokens
    tools = [{"type": "function", "function": {"name": WEATHER["name"], "description": WEATHER["description"],
                                               "parameters": WEATHER["input_schema"]}}]
    text = ChatTemplate.from_tokenizer(served_tokenizer).render(
        [{"role": "system", "content": "Be brief."}, *USER], tools=tools, add_generation_prompt=True,
        enable_thinking=False)
    assert counted == len(served_tokenizer.encode(text))
    used = anthropic_client.messages.create(max_tokens=2, **kwargs).usage.input_tokens
    assert counted == used


def test_assistant_prefill_is_continued(anthropic_client):
    plain = anthropic_client.messages.count_tokens(model="m", messages=USER, thinking=NO_THINKING).input_tokens
    m = anthropic_client.messages.create(model="m", max_tokens=3, thinking=NO_THINKING,
                                         messages=[*USER, {"role": "assistant", "content": "The weather"}])
    assert m.usage.input_tokens > plain


def test_wrong_api_key_and_error_shape(server):
    bad = anthropic.Anthropic(base_url=server.base_url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as info:
        bad.messages.create(model="m", max_tokens=4, messages=USER)
    assert info.value.status_code == 401
    assert info.value.body["type"] == "error" and info.value.body["error"]["type"] == "authentication_error"


def test_bad_request_shape(anthropic_client):
    with pytest.raises(anthropic.BadRequestError) as info:
        anthropic_client.messages.create(model="m", max_tokens=4, messages=[{"role": "robot", "content": "x"}])
    assert info.value.body["error"]["type"] == "invalid_request_error"
