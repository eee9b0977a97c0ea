"""Property-based fuzzing of the running server from its own OpenAPI document: request bodies
drawn from each endpoint's schema, then mutated (a field replaced by arbitrary JSON, arbitrary
top-level JSON, raw bytes). Whatever arrives, the answer is never a 5xx. Loopback only, a
bounded number of examples, on a server whose default output is a few tokens."""

from __future__ import annotations

import json
import os
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from .conftest import start_server

pytestmark = pytest.mark.slow

EXAMPLES = int(os.environ.get("NINFER_FUZZ_EXAMPLES", "40"))
HELLO = [{"role": "user", "content": "hello"}]
# One known-good body per endpoint, so the success path is always among the examples.
VALID = {
    "/v1/chat/completions": {"messages": HELLO, "stream": True, "stream_options": {"include_usage": True}},
    "/v1/completions": {"prompt": "hello", "logprobs": 2},
    "/v1/messages": {"model": "m", "messages": HELLO, "stream": True},
    "/v1/messages/count_tokens": {"model": "m", "messages": HELLO},
}

JSON_LEAF = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
                      st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=30))
ANY_JSON = st.recursive(JSON_LEAF, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                           st.dictionaries(st.text(max_size=12), inner, max_size=4)),
                        max_leaves=12)


def from_schema(schema: dict[str, Any], optional: bool = True) -> st.SearchStrategy:
    """Instances of the JSON-schema subset our OpenAPI document uses (`optional`: with optional
    properties too, else the required ones only)."""
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if "oneOf" in schema:
        return st.one_of(*(from_schema(s) for s in schema["oneOf"]))
    kind = schema.get("type")
    if kind == "object":
        props = schema.get("properties", {})
        required = set(schema.get("required", []))
        fixed = {k: from_schema(v) for k, v in props.items() if k in required}
        extra = {k: from_schema(v) for k, v in props.items() if k not in required} if optional else {}
        return st.fixed_dictionaries(fixed, optional=extra) if props else st.dictionaries(
            st.text(max_size=8), JSON_LEAF, max_size=3)
    if kind == "array":
        return st.lists(from_schema(schema.get("items", {})), min_size=schema.get("minItems", 0),
                        max_size=min(schema.get("maxItems", 3), 3))
    if kind == "string":
        return st.text(min_size=schema.get("minLength", 0), max_size=20)
    if kind == "integer":
        return st.integers(schema.get("minimum", -(2**40)), schema.get("maximum", 2**40))
    if kind == "number":
        lo, hi = schema.get("minimum", -1e6), schema.get("maximum", 1e6)
        return st.floats(lo, hi, exclude_min="exclusiveMinimum" in schema, allow_nan=False)
    if kind == "boolean":
        return st.booleans()
    return JSON_LEAF


def mutated(valid: st.SearchStrategy) -> st.SearchStrategy:
    """A valid body with one value somewhere inside (at any depth) replaced by arbitrary JSON."""
    def mutate(node: Any, data: st.DataObject) -> Any:
        if isinstance(node, dict) and node:
            key = data.draw(st.sampled_from(sorted(node)))
            deeper = data.draw(st.booleans()) and isinstance(node[key], dict | list)
            return {**node, key: mutate(node[key], data) if deeper else data.draw(ANY_JSON)}
        if isinstance(node, list) and node:
            i = data.draw(st.integers(0, len(node) - 1))
            deeper = data.draw(st.booleans()) and isinstance(node[i], dict | list)
            return [*node[:i], mutate(node[i], data) if deeper else data.draw(ANY_JSON), *node[i + 1:]]
        return data.draw(ANY_JSON)

    return st.builds(mutate, valid, st.data())


@pytest.fixture(scope="module")
def fuzz_server(tiny_package, tmp_path_factory):
    server = start_server(tiny_package, tmp_path_factory.mktemp("fuzz"), "--max-tokens", "4",
                          "--max-body-bytes", "65536", request_log=False)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def document(fuzz_server) -> dict:
    doc = fuzz_server.http.get("/openapi.json").json()
    assert doc["openapi"].startswith("3.")
    return doc


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/messages",
                                  "/v1/messages/count_tokens"])
def test_no_server_errors(fuzz_server, document, path):
    schema = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    valid = from_schema(schema)
    bodies = st.one_of(from_schema(schema, optional=False), valid, mutated(valid), ANY_JSON,
                       st.binary(max_size=64))
    statuses: list[int] = []
    errors: list[str] = []

    known = dict(VALID[path])
    if "model" not in known:
        known["model"] = fuzz_server.model_id

    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @example(body=known)
    @given(body=bodies)
    def check(body: Any) -> None:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        r = fuzz_server.http.post(path, content=content, headers={"content-type": "application/json"},
                                  timeout=30)
        statuses.append(r.status_code)
        if r.status_code >= 400:
            errors.append(r.text[:120])
        assert r.status_code < 500, (body, r.text)
        if r.headers.get("content-type", "").startswith("application/json"):
            r.json()

    check()
    assert any(s == 200 for s in statuses) and any(400 <= s < 500 for s in statuses), (statuses, errors)


def test_openapi_document_lists_the_endpoints(document):
    assert {"/health", "/v1/models", "/v1/models/{model_id}", "/v1/chat/completions", "/v1/completions",
            "/v1/messages", "/v1/messages/count_tokens", "/metrics"} <= set(document["paths"])


def test_raw_garbage_requests(fuzz_server):
    for content in (b"", b"null", b"[]", b'{"model": 1}', b"\x00" * 10, b'{"a":' * 5000):
        for path in ("/v1/chat/completions", "/v1/messages", "/v1/completions", "/v1/messages/count_tokens"):
            r = httpx.post(fuzz_server.base_url + path, content=content, timeout=10)
            assert 400 <= r.status_code < 500, (path, content[:20], r.text)
