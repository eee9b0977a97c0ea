"""Server pieces without a server: grammars and the mask controller, error shapes, field
validation, sampling resolution, metrics exposition."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest

from ninfer_runtime.config import SamplingConfig
from ninfer_runtime.serve.constrained import BUDGET_CLOSE_TEXT, Grammars, OutputController
from ninfer_runtime.serve.errors import ApiError, error_body
from ninfer_runtime.serve.metrics import Metrics
from ninfer_runtime.serve.requests import (
    SamplingDefaults,
    opt_int,
    opt_number,
    resolve_sampling,
    stop_strings,
)
from ninfer_runtime.serve.tools import anthropic_tools, openai_tools
from ninfer_runtime.text import parse_tool_calls

VOCAB = 512
TOOLS = [
    {"type": "function", "function": {"name": "lookup", "parameters": {
        "type": "object",
        "properties": {"query": {"type": "string", "maxLength": 8}, "limit": {"type": "integer", "minimum": 1,
                                                                              "maximum": 9},
                       "exact": {"type": "boolean"}, "mode": {"type": "string", "enum": ["a", "b"]}},
        "required": ["query", "mode"]}}},
    {"type": "function", "function": {"name": "noop", "parameters": {"type": "object", "properties": {}}}},
]


@pytest.fixture(scope="module")
def grammars(served_tokenizer) -> Grammars:
    return Grammars(served_tokenizer, VOCAB, served_tokenizer.eos_token_ids)


def drive(controller: OutputController, eos: int, seed: int, limit: int = 400) -> list[int]:
    """Random logits through the controller's masks, as the engine's sampler would."""
    rng = np.random.default_rng(seed)
    out: list[int] = []
    for _ in range(limit):
        mask = controller(out)
        logits = rng.standard_normal(VOCAB)
        if mask is not None:
            logits[~mask] = -np.inf
        token = int(np.argmax(logits))
        out.append(token)
        if token == eos:
            break
    return out


def test_forced_tool_calls_always_parse_and_validate(grammars, served_tokenizer):
    eos = served_tokenizer.eos_token_ids[0]
    grammar = grammars.tool_calls(TOOLS, parallel=True)
    for seed in range(10):
        ctl = OutputController(VOCAB, reasoning=False, think_close_id=grammars.think_close_id,
                               matcher=grammars.matcher(grammar))
        out = drive(ctl, eos, seed)
        assert out[-1] == eos and ctl.failed is None
        parsed = parse_tool_calls(served_tokenizer.decode(out, skip_special_tokens=True), TOOLS)
        assert parsed.tool_calls and parsed.content == ""
        for call in parsed.tool_calls:
            schema = next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == call.name)
            jsonschema.validate(call.arguments, schema)


def test_json_schema_grammar(grammars, served_tokenizer):
    schema = {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "string", "maxLength": 3}},
              "required": ["x", "y"], "additionalProperties": False}
    eos = served_tokenizer.eos_token_ids[0]
    ctl = OutputController(VOCAB, reasoning=False, think_close_id=None,
                           matcher=grammars.matcher(grammars.json_schema(schema)))
    out = drive(ctl, eos, 0)
    jsonschema.validate(json.loads(served_tokenizer.decode(out, skip_special_tokens=True)), schema)
    with pytest.raises(ApiError):
        grammars.json_schema({"type": "no-such-type"})
    with pytest.raises(ApiError):
        grammars.json_schema([1, 2])


def test_thinking_budget_forces_the_close(grammars, served_tokenizer):
    close = served_tokenizer.encode(BUDGET_CLOSE_TEXT)
    ctl = OutputController(VOCAB, reasoning=True, think_close_id=grammars.think_close_id, budget=3, close_ids=close)
    out = [10, 11, 12]
    for expected in close:
        mask = ctl(out)
        assert mask is not None and mask.sum() == 1 and mask[expected]
        out.append(expected)
    assert ctl(out) is None and not ctl.reasoning  # answer: unconstrained again
    assert ctl.reasoning_tokens == 3


def test_reasoning_cannot_end_before_a_constrained_answer(grammars):
    ctl = OutputController(VOCAB, reasoning=True, think_close_id=grammars.think_close_id,
                           matcher=grammars.matcher(grammars.json_schema({"type": "object"})), eos_ids=[1])
    mask = ctl([20, 21])
    assert not mask[1] and mask.sum() == VOCAB - 1
    mask = ctl([20, 21, grammars.think_close_id])
    assert mask is not None and 0 < mask.sum() < VOCAB


def test_error_shapes_per_dialect():
    err = ApiError(429, "full", code="server_overloaded")
    status, body = error_body("/v1/chat/completions", err)
    assert status == 429 and body == {"error": {"message": "full", "type": "rate_limit_error", "param": None,
                                                "code": "server_overloaded"}}
    status, body = error_body("/v1/messages", err, "rid")
    assert status == 529 and body == {"type": "error", "error": {"type": "overloaded_error", "message": "full"},
                                      "request_id": "rid"}
    status, body = error_body("/v1/messages/count_tokens", ApiError(400, "bad"))
    assert status == 400 and body["error"]["type"] == "invalid_request_error"


def test_field_readers_are_strict():
    with pytest.raises(ApiError):
        opt_int({"n": True}, "n")
    with pytest.raises(ApiError):
        opt_number({"t": float("nan")}, "t", 0, 2)
    assert opt_int({"n": 3.0}, "n") == 3
    assert opt_int({"n": None}, "n") is None
    assert stop_strings(["a", "", "a", "b"], "stop") == ("a", "b")
    with pytest.raises(ApiError):
        stop_strings([1], "stop")


def test_sampling_precedence():
    defaults = SamplingDefaults.from_config(SamplingConfig(top_k=5), {"temperature": 0.7, "top_k": 20})
    params = resolve_sampling(defaults, {"temperature": 0.2, "seed": -1})
    assert (params.temperature, params.top_k, params.seed) == (0.2, 5, 2**64 - 1)
    greedy = SamplingDefaults.from_config(SamplingConfig(greedy=True), {})
    assert resolve_sampling(greedy, {"temperature": 1.5}).is_greedy
    assert resolve_sampling(defaults, {}).seed is not None  # a fresh seed, fixed for the log


def test_tool_choice_plans():
    tools = [{"type": "function", "function": {"name": "a"}}, {"type": "function", "function": {"name": "b"}}]
    plan = openai_tools({"tools": tools, "tool_choice": {"type": "function", "function": {"name": "b"}}})
    assert plan.forced and [t["function"]["name"] for t in plan.tools] == ["b"]
    assert openai_tools({"tools": tools, "tool_choice": "none"}).tools == []
    with pytest.raises(ApiError):
        openai_tools({"tool_choice": "required"})
    with pytest.raises(ApiError):
        openai_tools({"tools": [{"type": "web_search"}]})
    plan = anthropic_tools({"tools": [{"name": "a", "input_schema": {"type": "object"}}],
                            "tool_choice": {"type": "any", "disable_parallel_tool_use": True}})
    assert plan.forced and not plan.parallel and plan.tools[0]["function"]["parameters"] == {"type": "object"}


def test_metrics_exposition_format():
    m = Metrics()
    m.observe_ttft(0.02)
    m.observe_itl(0.004)
    m.count_request("/v1/messages", 200)
    text = m.render({"active": 1, "requests_finished": {"stop": 2}, "ttft_s": {"buckets": [(0.1, 1)]}},
                    {"ninfer_kv_pages_free": ("Free pages.", 10)}, {"model": 'a"b'})
    assert 'ninfer_info{model="a\\"b"} 1' in text
    assert 'ninfer_time_to_first_token_seconds_bucket{le="0.025"} 1' in text
    assert 'ninfer_requests_total{endpoint="/v1/messages",status="200"} 1' in text
    assert "ninfer_engine_active 1" in text and 'ninfer_engine_requests_finished{key="stop"} 2' in text
    assert "ninfer_kv_pages_free 10" in text
    for line in text.splitlines():
        assert line.startswith("#") or len(line.rsplit(" ", 1)) == 2


def test_request_log_text_only_when_asked(tmp_path):
    from types import SimpleNamespace

    from ninfer_runtime.serve.generation import Outcome
    from ninfer_runtime.serve.records import RequestRecord
    from ninfer_runtime.serve.request_log import RequestLog

    for include in (False, True):
        path = tmp_path / f"log-{include}.jsonl"
        log = RequestLog(path, include_text=include)
        service = SimpleNamespace(request_log=log, next_number=lambda: 7)
        ctx = SimpleNamespace(request_id="abc", protocol="openai_chat_completions", started=0.0)
        record = RequestRecord(service, ctx, "/v1/chat/completions")
        record._prompt_text = "PROMPT TEXT"
        record.outcome = Outcome(content=["ANSWER"], finish_reason="stop", prompt_tokens=3, completion_tokens=1,
                                 queued_at=0.0, first_token_at=0.1, finished_at=0.2)
        record.write()
        record.write()  # once only
        log.close()
        lines = path.read_text().splitlines()
        assert len(lines) == 1
        entry = json.loads(lines[0])
        assert entry["request_id"] == 7 and entry["result"]["finish_reason"] == "stop"
        assert ("PROMPT TEXT" in lines[0]) == include and ("ANSWER" in lines[0]) == include
