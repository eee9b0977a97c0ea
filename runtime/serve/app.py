"""The Sanic application: routes, authentication, CORS, body limit and error rendering.

`create_app(service)` wires the endpoints of product spec 3.5 to a loaded `Service`. Request
middleware authenticates (every route but `GET /health` and CORS preflight) and assigns the
request id; the error handler turns every exception into the dialect's JSON error shape, so
clients never see an HTML page, and an unexpected exception is a logged 500, never a crash.
"""

from __future__ import annotations

import hmac
import logging
from typing import Any

from sanic import Sanic, response
from sanic.exceptions import SanicException

from . import anthropic_api, openai_api
from .errors import ApiError, error_body, is_anthropic_path
from .openapi import openapi_document

log = logging.getLogger("ninfer.serve")

_CORS_HEADERS = {"Access-Control-Allow-Headers": "Authorization, Content-Type, x-api-key, anthropic-version",
                 "Access-Control-Allow-Methods": "GET, POST, OPTIONS", "Access-Control-Max-Age": "600"}
_PROTOCOLS = {"/v1/chat/completions": "openai_chat_completions", "/v1/completions": "openai_completions",
              "/v1/messages": "anthropic_messages", "/v1/messages/count_tokens": "anthropic_count_tokens"}


def _endpoint(path: str) -> str:
    """The metrics label of a path (bounded set, whatever clients send)."""
    if path in _PROTOCOLS or path in ("/health", "/v1/models", "/metrics", "/openapi.json"):
        return path
    if path.startswith("/v1/models/"):
        return "/v1/models/{id}"
    return "other"


def _authorized(request: Any, key: str) -> bool:
    """`Authorization: Bearer KEY` or `x-api-key: KEY`, compared in constant time."""
    given = []
    if request.headers.get("x-api-key") is not None:
        given.append(request.headers["x-api-key"])
    auth = request.headers.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        given.append(auth[7:].strip())
    return any(hmac.compare_digest(g.encode(), key.encode()) for g in given)


def create_app(service: Any, name: str = "ninfer") -> Sanic:
    server = service.config.server
    app = Sanic(name, configure_logging=False)
    app.config.REQUEST_MAX_SIZE = server.max_body_bytes
    app.config.RESPONSE_TIMEOUT = 7 * 24 * 3600  # generation time is bounded by max_tokens, not by Sanic
    app.config.REQUEST_TIMEOUT = 120
    app.config.KEEP_ALIVE_TIMEOUT = 75
    app.config.FALLBACK_ERROR_FORMAT = "json"
    app.config.NOISY_EXCEPTIONS = False
    app.config.ACCESS_LOG = False
    app.config.MOTD = False
    app.ctx.service = service
    cors_origins = tuple(server.cors_origins)
    api_key = server.api_key

    def cors_headers(request: Any) -> dict[str, str]:
        if not cors_origins:
            return {}
        origin = request.headers.get("origin")
        if "*" in cors_origins:
            allowed = "*"
        elif origin in cors_origins:
            allowed = origin
        else:
            return {}
        headers = {"Access-Control-Allow-Origin": allowed, **_CORS_HEADERS}
        if allowed != "*":
            headers["Vary"] = "Origin"
        return headers

    @app.on_request
    async def before(request: Any) -> Any:
        if getattr(request.ctx, "info", None) is None:
            request.ctx.info = service.new_context(_PROTOCOLS.get(request.path, "other"))
        if request.method == "OPTIONS" and cors_origins:
            return response.empty(status=204, headers=cors_headers(request))
        if api_key and not (request.path == "/health" and request.method in ("GET", "HEAD")):
            if not _authorized(request, api_key):
                raise ApiError(401, "missing or invalid API key", code="invalid_api_key")
        return None

    @app.on_response
    async def after(request: Any, resp: Any) -> None:
        info = getattr(request.ctx, "info", None)
        if info is not None:
            resp.headers["request-id" if is_anthropic_path(request.path) else "x-request-id"] = info.request_id
        for key, value in cors_headers(request).items():
            resp.headers.setdefault(key, value)
        service.metrics.count_request(_endpoint(request.path), resp.status)

    @app.exception(Exception)
    async def on_error(request: Any, exc: Exception) -> Any:
        err = _as_api_error(exc, server.max_body_bytes)
        info = getattr(request.ctx, "info", None)
        status, body = error_body(request.path, err, info.request_id if info else None)
        if not isinstance(exc, ApiError | SanicException):
            log.error("internal error on %s: %s", request.path, exc, exc_info=exc)
        elif status >= 500:
            log.warning("%s %s: %d %s", request.method, request.path, status, err.message)
        return response.json(body, status=status)

    async def health(request: Any) -> Any:
        if not service.healthy:
            return response.json({"status": "unavailable"}, status=503)
        return response.json({"status": "ok"})

    async def metrics(request: Any) -> Any:
        if not server.metrics:
            raise ApiError(404, "metrics are disabled (server.metrics = false)", code="not_found")
        return response.text(service.metrics_text(), content_type="text/plain; version=0.0.4; charset=utf-8")

    async def openapi(request: Any) -> Any:
        return response.json(openapi_document(service.model_id))

    get, post = ["GET", "OPTIONS"], ["POST", "OPTIONS"]
    app.add_route(health, "/health", methods=get)
    app.add_route(openai_api.list_models, "/v1/models", methods=get)
    app.add_route(openai_api.get_model, "/v1/models/<model_id:path>", methods=get)
    app.add_route(openai_api.chat_completions, "/v1/chat/completions", methods=post)
    app.add_route(openai_api.completions, "/v1/completions", methods=post)
    app.add_route(anthropic_api.messages, "/v1/messages", methods=post)
    app.add_route(anthropic_api.count_tokens, "/v1/messages/count_tokens", methods=post)
    app.add_route(metrics, "/metrics", methods=get)
    app.add_route(openapi, "/openapi.json", methods=get)
    return app


def _as_api_error(exc: Exception, max_body: int) -> ApiError:
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, SanicException):
        status = getattr(exc, "status_code", 500) or 500
        if status == 413:
            return ApiError(413, f"request body exceeds the limit of {max_body} bytes", code="request_too_large")
        if status == 404:
            return ApiError(404, "no such endpoint", code="not_found")
        if status == 405:
            return ApiError(405, "method not allowed on this endpoint", code="method_not_allowed")
        if status < 500:
            return ApiError(status, str(exc) or "bad request")
        return ApiError(status, str(exc) or "server error", type="internal_error")
    return ApiError(500, "internal error", type="internal_error")
