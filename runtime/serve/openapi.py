"""An OpenAPI 3.0 description of the server's endpoints (served at `/openapi.json`).

It documents what the handlers accept, loosely enough that valid client requests conform and
strictly enough that a property-based fuzzer (schemathesis) can generate meaningful requests.
"""

from __future__ import annotations

from typing import Any

_ERROR = {"type": "object", "properties": {"error": {"type": "object"}}}
_TEXT_PART = {"type": "object", "required": ["type", "text"],
              "properties": {"type": {"type": "string", "enum": ["text"]}, "text": {"type": "string"}}}
_STOP = {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "maxItems": 4}]}
_SAMPLING = {
    "temperature": {"type": "number", "minimum": 0, "maximum": 2},
    "top_p": {"type": "number", "minimum": 0, "maximum": 1},
    "top_k": {"type": "integer", "minimum": -1},
    "min_p": {"type": "number", "minimum": 0, "maximum": 1},
    "presence_penalty": {"type": "number", "minimum": -2, "maximum": 2},
    "frequency_penalty": {"type": "number", "minimum": -2, "maximum": 2},
    "repetition_penalty": {"type": "number", "exclusiveMinimum": 0, "maximum": 2},
    "seed": {"type": "integer"},
}
_OPENAI_TOOL = {"type": "object", "required": ["type", "function"], "properties": {
    "type": {"type": "string", "enum": ["function"]},
    "function": {"type": "object", "required": ["name"], "properties": {
        "name": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"}, "description": {"type": "string"},
        "parameters": {"type": "object"}}}}}
_CHAT_MESSAGE = {"type": "object", "required": ["role", "content"], "properties": {
    "role": {"type": "string", "enum": ["system", "developer", "user", "assistant", "tool"]},
    "content": {"oneOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART, "minItems": 1}],
                "nullable": True},
    "tool_call_id": {"type": "string"}, "reasoning_content": {"type": "string"},
    "tool_calls": {"type": "array", "items": {"type": "object"}}}}
_ANTHROPIC_MESSAGE = {"type": "object", "required": ["role", "content"], "properties": {
    "role": {"type": "string", "enum": ["user", "assistant"]},
    "content": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}]}}}


def _post(summary: str, schema: dict[str, Any], ok: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"post": {
        "summary": summary,
        "requestBody": {"required": True, "content": {"application/json": {"schema": schema}}},
        "responses": {
            "200": {"description": "OK", "content": {"application/json": {"schema": ok or {"type": "object"}},
                                                     "text/event-stream": {"schema": {"type": "string"}}}},
            "400": {"description": "Invalid request", "content": {"application/json": {"schema": _ERROR}}},
            "401": {"description": "Missing or invalid API key"},
            "404": {"description": "Unknown model"},
            "413": {"description": "Body too large"},
            "429": {"description": "Server at capacity"},
        }}}


def openapi_document(model_id: str) -> dict[str, Any]:
    chat = {"type": "object", "required": ["model", "messages"], "properties": {
        "model": {"type": "string", "enum": [model_id]},
        "messages": {"type": "array", "items": _CHAT_MESSAGE, "minItems": 1},
        "max_tokens": {"type": "integer", "minimum": 1, "maximum": 16},
        "max_completion_tokens": {"type": "integer", "minimum": 1, "maximum": 16},
        "stream": {"type": "boolean"},
        "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
        "stop": _STOP, "n": {"type": "integer"},
        "tools": {"type": "array", "items": _OPENAI_TOOL},
        "tool_choice": {"oneOf": [{"type": "string", "enum": ["none", "auto", "required"]}, {"type": "object"}]},
        "response_format": {"type": "object", "properties": {
            "type": {"type": "string", "enum": ["text", "json_object", "json_schema"]},
            "json_schema": {"type": "object"}}},
        "logprobs": {"type": "boolean"}, "top_logprobs": {"type": "integer", "minimum": 0, "maximum": 20},
        "enable_thinking": {"type": "boolean"}, "thinking_budget": {"type": "integer", "minimum": 0},
        **_SAMPLING}}
    completion = {"type": "object", "required": ["model", "prompt"], "properties": {
        "model": {"type": "string", "enum": [model_id]},
        "prompt": {"oneOf": [{"type": "string", "minLength": 1},
                             {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}]},
        "max_tokens": {"type": "integer", "minimum": 1, "maximum": 16}, "echo": {"type": "boolean"},
        "logprobs": {"type": "integer", "minimum": 0, "maximum": 5}, "stream": {"type": "boolean"},
        "stop": _STOP, **_SAMPLING}}
    messages = {"type": "object", "required": ["model", "messages"], "properties": {
        "model": {"type": "string"},
        "messages": {"type": "array", "items": _ANTHROPIC_MESSAGE, "minItems": 1},
        "system": {"oneOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART}]},
        "max_tokens": {"type": "integer", "minimum": 1, "maximum": 16},
        "stop_sequences": {"type": "array", "items": {"type": "string"}}, "stream": {"type": "boolean"},
        "tools": {"type": "array", "items": {"type": "object", "required": ["name", "input_schema"], "properties": {
            "name": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,128}$"}, "input_schema": {"type": "object"}}}},
        "tool_choice": {"type": "object", "properties": {
            "type": {"type": "string", "enum": ["auto", "any", "none", "tool"]}, "name": {"type": "string"}}},
        "thinking": {"type": "object", "properties": {
            "type": {"type": "string", "enum": ["enabled", "disabled", "adaptive"]},
            "budget_tokens": {"type": "integer", "minimum": 1}}},
        "temperature": _SAMPLING["temperature"], "top_p": _SAMPLING["top_p"], "top_k": _SAMPLING["top_k"]}}
    get_ok = {"responses": {"200": {"description": "OK", "content": {"application/json": {
        "schema": {"type": "object"}}}}}}
    return {
        "openapi": "3.0.3",
        "info": {"title": "ninfer serve", "version": "1", "description":
                 "OpenAI- and Anthropic-compatible inference server for a compiled ninfer package."},
        "components": {"securitySchemes": {
            "bearer": {"type": "http", "scheme": "bearer"},
            "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"}}},
        "security": [{"bearer": []}, {"apiKey": []}],
        "paths": {
            "/health": {"get": {"summary": "Liveness", "security": [], **get_ok}},
            "/v1/models": {"get": {"summary": "List the served model", **get_ok}},
            "/v1/models/{model_id}": {"get": {
                "summary": "One model", "parameters": [{"name": "model_id", "in": "path", "required": True,
                                                        "schema": {"type": "string"}}],
                "responses": {"200": {"description": "OK"}, "404": {"description": "Unknown model"}}}},
            "/v1/chat/completions": _post("OpenAI Chat Completions", chat),
            "/v1/completions": _post("OpenAI legacy text completions", completion),
            "/v1/messages": _post("Anthropic Messages", messages),
            "/v1/messages/count_tokens": _post("Anthropic token count", messages,
                                               {"type": "object", "required": ["input_tokens"]}),
            "/metrics": {"get": {"summary": "Prometheus metrics",
                                 "responses": {"200": {"description": "OK", "content": {"text/plain": {
                                     "schema": {"type": "string"}}}}}}},
        },
    }
