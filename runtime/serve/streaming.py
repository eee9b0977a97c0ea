"""Server-sent events: frame formatting and opening a stream response in Sanic."""

from __future__ import annotations

import json
from typing import Any

KEEPALIVE_FRAME = ": keep-alive\n\n"
DONE_FRAME = "data: [DONE]\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def data_frame(obj: Any) -> str:
    """OpenAI style: `data: <json>`."""
    return f"data: {dumps(obj)}\n\n"


def event_frame(event: str, obj: Any) -> str:
    """Anthropic style: `event: <type>` then `data: <json>`."""
    return f"event: {event}\ndata: {dumps(obj)}\n\n"


async def open_stream(request: Any) -> Any:
    """Start a `text/event-stream` response; returns Sanic's response to `send` frames on."""
    return await request.respond(content_type="text/event-stream", headers=dict(SSE_HEADERS))
