"""Building the request-log record and the stderr lifecycle lines of one generation request."""

from __future__ import annotations

import logging
import time
from typing import Any

from .errors import ApiError
from .generation import Outcome
from .requests import sampling_record

log = logging.getLogger("ninfer.serve")


class RequestRecord:
    """Collects what is known about a request as it is handled; `write` logs it once."""

    def __init__(self, service: Any, ctx: Any, endpoint: str) -> None:
        self.service = service
        self.ctx = ctx
        self.number = service.next_number()
        self.data: dict[str, Any] = {"request_id": self.number, "http_request_id": ctx.request_id,
                                     "protocol": ctx.protocol, "endpoint": endpoint}
        self.status = 200
        self.outcome: Outcome | None = None
        self.error: ApiError | None = None
        self._prompt_text: str | None = None
        self._written = False

    def describe(self, *, model: str, stream: bool, message_count: int, prepared: Any, plan: Any = None,
                 thinking: bool | None = None, has_tool_history: bool = False) -> None:
        params = prepared.job.params
        self.data.update({
            "model": model, "stream": stream, "message_count": message_count,
            "requested_output_tokens": prepared.max_tokens,
            "requested_output_tokens_source": prepared.max_tokens_source,
            "tool_count": len(plan.tools) if plan is not None else 0,
            "tool_choice": plan.choice if plan is not None else "none",
            "has_tool_history": has_tool_history, "enable_thinking": thinking,
            "constrained": prepared.job.controller is not None and prepared.job.controller.matcher is not None,
            "sampling": sampling_record(params.sampling),
        })
        self._prompt_text = prepared.prompt_text
        line = (f"[req {self.number}] {self.ctx.protocol} {'stream' if stream else 'non-stream'} "
                f"msgs={message_count} max_tokens={prepared.max_tokens} ({prepared.max_tokens_source}) "
                f"tools={self.data['tool_count']} tool_choice={self.data['tool_choice']} "
                f"thinking={'on' if thinking else 'off'} prompt={len(prepared.job.prompt_ids)} -> running")
        log.info(line)

    def fail(self, err: ApiError, status: int | None = None) -> None:
        self.error = err
        self.status = status or err.status

    def disconnected(self) -> None:
        """The client closed the connection before the response ended (nginx's 499)."""
        self.status = 499
        self.data["client_disconnected"] = True

    def write(self) -> None:
        if self._written:
            return
        self._written = True
        service, out = self.service, self.outcome
        record = dict(self.data)
        record["status"] = self.status
        record["timings_seconds"] = {"total": time.perf_counter() - self.ctx.started}
        if out is not None:
            ttft = None if out.first_token_at is None else out.first_token_at - out.queued_at
            decode = (None if out.first_token_at is None or out.finished_at is None
                      else out.finished_at - out.first_token_at)
            record["timings_seconds"].update({"prepare": out.queued_at - self.ctx.started, "ttft": ttft,
                                              "decode": decode})
            record["result"] = {"finish_reason": out.finish_reason, "stop_sequence": out.stop_sequence,
                                "prompt_tokens": out.prompt_tokens, "completion_tokens": out.completion_tokens,
                                "reasoning_tokens": out.reasoning_tokens,
                                "prefix_cache_hit_tokens": out.cached_tokens,
                                "tool_call_count": len(out.tool_calls)}
        record["error"] = (None if self.error is None else
                           {"status": self.status, "code": self.error.code, "param": self.error.param,
                            "message": self.error.message})
        if service.request_log.include_text:
            record["prompt"] = self._prompt_text
            if out is not None:
                record["output"] = {"reasoning": out.reasoning_text, "content": out.text,
                                    "tool_calls": [{"name": c.name, "arguments": c.arguments_json}
                                                   for c in out.tool_calls]}
        service.request_log.write("request", record)
        n = self.number
        if self.error is not None:
            log.info("[req %d] error %d %s", n, self.status, self.error.message)
        elif out is not None:
            ttft = record["timings_seconds"].get("ttft")
            log.info("[req %d] done finish=%s tool_calls=%d prompt=%d gen=%d cache=%d ttft=%s wall=%.2fs", n,
                     out.finish_reason, len(out.tool_calls), out.prompt_tokens, out.completion_tokens,
                     out.cached_tokens, "n/a" if ttft is None else f"{ttft * 1000:.0f}ms",
                     record["timings_seconds"]["total"])
