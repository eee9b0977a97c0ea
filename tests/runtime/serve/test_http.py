"""Plain HTTP against the real server: error shapes and status codes, auth, CORS, body limit,
queue-full rejection, disconnects, metrics."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from .conftest import API_KEY, BODY_LIMIT

pytestmark = pytest.mark.slow

USER = [{"role": "user", "content": "hello"}]


def chat(server, **fields):
    return {"model": server.model_id, "messages": USER, "max_tokens": 4, **fields}


def assert_openai_error(r: httpx.Response, status: int, code: str | None = None, param: str | None = None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if code is not None:
        assert err["code"] == code
    if param is not None:
        assert err["param"] == param
    assert r.headers.get("x-request-id")
    return err


def assert_anthropic_error(r: httpx.Response, status: int, kind: str) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == kind and body["error"]["message"]
    assert r.headers.get("request-id")
    return body


def test_health_needs_no_key_and_everything_else_does(server):
    assert httpx.get(server.base_url + "/health").json() == {"status": "ok"}
    assert_openai_error(httpx.get(server.base_url + "/v1/models"), 401, "invalid_api_key")
    assert_openai_error(httpx.get(server.base_url + "/metrics"), 401, "invalid_api_key")
    r = httpx.post(server.base_url + "/v1/messages", json={"model": "m", "messages": USER})
    assert_anthropic_error(r, 401, "authentication_error")
    ok = httpx.get(server.base_url + "/v1/models", headers={"x-api-key": API_KEY})
    assert ok.status_code == 200


def test_cors_preflight_and_headers(server):
    r = httpx.options(server.base_url + "/v1/chat/completions", headers={"Origin": "https://app.example"})
    assert r.status_code == 204 and r.headers["access-control-allow-origin"] == "*"
    assert "POST" in r.headers["access-control-allow-methods"]
    r = server.http.get("/v1/models", headers={"Origin": "https://app.example"})
    assert r.headers["access-control-allow-origin"] == "*"


def test_invalid_json_and_wrong_types_are_400(server):
    http = server.http
    headers = {"content-type": "application/json"}
    assert_openai_error(http.post("/v1/chat/completions", content=b"{not json", headers=headers), 400)
    assert_anthropic_error(http.post("/v1/messages", content=b"\xff\xfe", headers=headers), 400,
                           "invalid_request_error")
    assert_openai_error(http.post("/v1/chat/completions", json=[1, 2]), 400)
    deep: list = []
    for _ in range(500):
        deep = [deep]
    assert_openai_error(http.post("/v1/chat/completions", json=chat(server, tools=[{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {"x": {"default": deep}}}}}])), 400)
    cases = [
        ({"temperature": "hot"}, "temperature"),
        ({"temperature": 3}, "temperature"),
        ({"top_p": True}, "top_p"),
        ({"max_tokens": -1}, "max_tokens"),
        ({"max_tokens": 1.5}, "max_tokens"),
        ({"stream": "yes"}, "stream"),
        ({"seed": "x"}, "seed"),
        ({"stop": [1, 2]}, "stop"),
        ({"messages": "hello"}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "user"}]}, "messages"),
        ({"tools": {"a": 1}}, "tools"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"logprobs": 3}, "logprobs"),
        ({"response_format": {"type": "xml"}}, "response_format"),
    ]
    for fields, param in cases:
        assert_openai_error(http.post("/v1/chat/completions", json=chat(server, **fields)), 400, param=param)
    assert_openai_error(http.post("/v1/chat/completions", json=chat(server, model="other")), 404, "model_not_found")
    assert_openai_error(http.post("/v1/chat/completions", json=chat(server, messages=[
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}])),
        400, "vision_disabled")
    assert_openai_error(http.post("/v1/chat/completions", json=chat(server, messages=[
        {"role": "function", "content": "x"}])), 400, "unsupported_role")
    for fields in ({"max_tokens": "many"}, {"messages": [{"role": "user", "content": 5}]}, {"system": 3},
                   {"thinking": {"type": "enabled", "budget_tokens": "x"}}, {"tool_choice": "any"}):
        body = {"model": "m", "messages": USER, "max_tokens": 4, **fields}
        assert_anthropic_error(http.post("/v1/messages", json=body), 400, "invalid_request_error")


def test_over_long_prompt_is_400(server):
    long_text = " ".join(f"w{i}" for i in range(1500))
    r = server.http.post("/v1/chat/completions", json=chat(server, messages=[{"role": "user", "content": long_text}]))
    assert_openai_error(r, 400, "context_length_exceeded")
    r = server.http.post("/v1/messages", json={"model": "m", "max_tokens": 4,
                                               "messages": [{"role": "user", "content": long_text}]})
    assert_anthropic_error(r, 400, "invalid_request_error")


def test_body_size_limit_is_413(server):
    big = "x" * (BODY_LIMIT + 10)
    r = server.http.post("/v1/chat/completions", json=chat(server, messages=[{"role": "user", "content": big}]))
    assert_openai_error(r, 413, "request_too_large")
    r = server.http.post("/v1/messages", json={"model": "m", "messages": [{"role": "user", "content": big}]})
    assert_anthropic_error(r, 413, "request_too_large")


def test_unknown_path_and_method(server):
    assert_openai_error(server.http.get("/v1/nothing"), 404)
    assert server.http.get("/v1/chat/completions").status_code == 405


async def _open_streams(server, n: int, max_tokens: int = 900) -> list[asyncio.Task]:
    headers = {"Authorization": f"Bearer {server.api_key}"} if server.api_key else {}
    client = httpx.AsyncClient(base_url=server.base_url, headers=headers, timeout=60)

    async def one(i: int) -> None:
        body = chat(server, max_tokens=max_tokens, stream=True, ignore_eos=True, enable_thinking=False, seed=i)
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            async for _ in r.aiter_bytes():
                pass

    tasks = [asyncio.create_task(one(i)) for i in range(n)]
    tasks.append(asyncio.create_task(_closer(client)))
    return tasks


async def _closer(client: httpx.AsyncClient) -> None:
    try:
        await asyncio.sleep(3600)
    finally:
        await client.aclose()


async def _wait_until_full(server, live: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        m = await asyncio.to_thread(server.metrics)
        if m["ninfer_engine_active"] + m["ninfer_engine_queued"] >= live:
            return
        assert time.monotonic() < deadline, f"the engine never held {live} requests: {m}"
        await asyncio.sleep(0.05)


def test_queue_full_is_429_and_disconnects_free_everything(server):
    before = server.wait_idle()
    assert before["ninfer_kv_pages_free"] == before["ninfer_kv_pages_total"]

    async def scenario() -> None:
        tasks = await _open_streams(server, 12)  # 8 active + 4 queued: the engine is full
        await _wait_until_full(server, 12)
        async with httpx.AsyncClient(base_url=server.base_url, headers={"x-api-key": API_KEY}, timeout=30) as c:
            r = await c.post("/v1/chat/completions", json=chat(server))
            assert_openai_error(r, 429, "server_overloaded")
            r = await c.post("/v1/messages", json={"model": "m", "messages": USER, "max_tokens": 4})
            assert_anthropic_error(r, 529, "overloaded_error")
        for t in tasks:  # every client goes away mid-stream or while queued
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(scenario())
    after = server.wait_idle()
    assert after["ninfer_engine_active"] == 0 and after["ninfer_engine_queued"] == 0
    assert after["ninfer_kv_pages_free"] == after["ninfer_kv_pages_total"]
    assert after["ninfer_state_slots_free"] == after["ninfer_state_slots_total"]
    assert after['ninfer_request_finish_total{reason="cancelled"}'] >= 12


def test_eight_concurrent_streams_with_disconnects(server, openai_client):
    import openai

    async def scenario() -> list[str]:
        client = openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0)

        async def one(i: int) -> str:
            stream = await client.chat.completions.create(
                model=server.model_id, messages=USER, stream=True, max_tokens=200 if i % 2 else 600, seed=i,
                extra_body={"enable_thinking": False, "ignore_eos": True})
            got = 0
            async for chunk in stream:
                got += 1
                if i % 2 == 0 and got == 5:
                    await stream.close()  # disconnect mid-stream
                    return "closed"
                if chunk.choices and chunk.choices[0].finish_reason:
                    return chunk.choices[0].finish_reason
            return "ended"

        try:
            return await asyncio.gather(*(one(i) for i in range(8)))
        finally:
            await client.close()

    results = asyncio.run(scenario())
    assert results.count("closed") == 4 and results.count("length") == 4
    after = server.wait_idle()
    assert after["ninfer_kv_pages_free"] == after["ninfer_kv_pages_total"]
    assert after["ninfer_state_slots_free"] == after["ninfer_state_slots_total"]


def test_non_streaming_disconnect_cancels(server):
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.base_url + "/v1/chat/completions", headers={"x-api-key": API_KEY}, timeout=0.2,
                   json=chat(server, max_tokens=1000, ignore_eos=True, enable_thinking=False))
    server.wait_idle()
    deadline = time.monotonic() + 10
    while True:
        records = [r for r in server.log_records() if r.get("result", {}).get("finish_reason") == "cancelled"
                   and r["endpoint"] == "/v1/chat/completions" and not r["stream"]]
        if records or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert records and records[-1]["result"]["completion_tokens"] < 1000
    assert records[-1]["status"] == 499 and records[-1]["client_disconnected"]


def test_metrics_exposition(server):
    server.http.post("/v1/chat/completions", json=chat(server, enable_thinking=False))
    r = server.http.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    for family in ("ninfer_requests_total", "ninfer_prompt_tokens_total", "ninfer_generation_tokens_total",
                   "ninfer_time_to_first_token_seconds", "ninfer_inter_token_latency_seconds",
                   "ninfer_prefix_cache_hit_tokens_total", "ninfer_engine_active", "ninfer_engine_queued",
                   "ninfer_kv_pages_free", "ninfer_state_slots_free"):
        assert f"# TYPE {family} " in text, family
    m = server.metrics()
    assert m['ninfer_requests_total{endpoint="/v1/chat/completions",status="200"}'] >= 1
    assert m['ninfer_time_to_first_token_seconds_bucket{le="+Inf"}'] >= 1
    assert m["ninfer_generation_tokens_total"] >= 1


def test_request_log_records(server):
    before = len(server.log_records())
    secret = "my secret prompt text"
    server.http.post("/v1/chat/completions", json=chat(server, messages=[{"role": "user", "content": secret}]))
    server.http.post("/v1/messages", json={"model": "m", "max_tokens": 3, "stream": True,
                                           "messages": [{"role": "user", "content": secret}]})
    server.http.post("/v1/chat/completions", json=chat(server, temperature=9))
    records = server.log_records()[before:]
    assert [r["endpoint"] for r in records] == ["/v1/chat/completions", "/v1/messages", "/v1/chat/completions"]
    ok, streamed, bad = records
    for r in (ok, streamed):
        assert r["status"] == 200 and r["error"] is None
        assert r["result"]["prompt_tokens"] > 0 and 0 < r["result"]["completion_tokens"] <= 4
        assert r["result"]["finish_reason"] in ("stop", "length")
        assert "prefix_cache_hit_tokens" in r["result"]
        assert r["timings_seconds"]["ttft"] > 0 and r["timings_seconds"]["total"] >= r["timings_seconds"]["ttft"]
        assert r["sampling"]["seed"] is not None
    assert streamed["stream"] is True and streamed["protocol"] == "anthropic_messages"
    assert bad["status"] == 400 and bad["error"]["param"] == "temperature"
    text = server.request_log.read_text()
    assert secret not in text and API_KEY not in text
    assert json.loads(text.splitlines()[0])["event"] == "server_start"


def test_queue_timeout_is_503(tiny_package, tmp_path):
    from .conftest import start_server

    server = start_server(tiny_package, tmp_path / "small", "--max-active", "1", "--max-queue", "2",
                          "--queue-timeout-ms", "200", request_log=False)
    try:
        async def scenario() -> None:
            tasks = await _open_streams(server, 1, max_tokens=1000)  # holds the only active place
            await _wait_until_full(server, 1)
            async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as c:
                openai_r, anthropic_r = await asyncio.gather(
                    c.post("/v1/chat/completions", json=chat(server, enable_thinking=False)),
                    c.post("/v1/messages", json={"model": "m", "messages": USER, "max_tokens": 4}))
            assert_openai_error(openai_r, 503, "request_queue_timeout")
            assert_anthropic_error(anthropic_r, 504, "timeout_error")
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run(scenario())
        idle = server.wait_idle()
        assert idle["ninfer_state_slots_free"] == idle["ninfer_state_slots_total"]
    finally:
        server.stop()
