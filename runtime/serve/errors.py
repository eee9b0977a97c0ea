"""HTTP errors and their two JSON dialects (product spec 3.13).

Every failure a handler can foresee is an `ApiError` carrying the status, the OpenAI `type` /
`code` / `param` and a message; the app renders it in the OpenAI shape, or the Anthropic shape for
paths under `/v1/messages`, so a client library always finds the error where it looks for it.
"""

from __future__ import annotations

from typing import Any

_OPENAI_TYPES = {401: "invalid_request_error", 404: "invalid_request_error", 429: "rate_limit_error",
                 503: "service_unavailable", 504: "timeout_error"}
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                    504: "timeout_error", 529: "overloaded_error"}


class ApiError(Exception):
    """A request failure with its HTTP status; `param` names the offending field when known."""

    def __init__(self, status: int, message: str, *, code: str | None = None, param: str | None = None,
                 type: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.type = type


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def is_anthropic_path(path: str) -> bool:
    return path.startswith("/v1/messages")


def openai_body(err: ApiError) -> dict[str, Any]:
    kind = err.type or (_OPENAI_TYPES.get(err.status) or
                        ("invalid_request_error" if err.status < 500 else "internal_error"))
    return {"error": {"message": err.message, "type": kind, "param": err.param, "code": err.code}}


def anthropic_body(err: ApiError, request_id: str | None = None) -> dict[str, Any]:
    status = anthropic_status(err)
    kind = _ANTHROPIC_TYPES.get(status) or ("invalid_request_error" if status < 500 else "api_error")
    body: dict[str, Any] = {"type": "error", "error": {"type": kind, "message": err.message}}
    if request_id:
        body["request_id"] = request_id
    return body


def anthropic_status(err: ApiError) -> int:
    """Anthropic clients expect 529 for overload and 504 for a queue timeout."""
    if err.code == "server_overloaded":
        return 529
    if err.code == "request_queue_timeout":
        return 504
    return err.status


def error_body(path: str, err: ApiError, request_id: str | None = None) -> tuple[int, dict[str, Any]]:
    """(status, body) of `err` in the dialect of `path`."""
    if is_anthropic_path(path):
        return anthropic_status(err), anthropic_body(err, request_id)
    return err.status, openai_body(err)
