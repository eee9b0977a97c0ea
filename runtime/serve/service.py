"""Everything a request handler needs, loaded once at startup: package, tokenizer, engine.

`Service.load(config)` opens the compiled package (runner and context pool), the tokenizer and
chat template from its resources, starts the engine thread and resolves the sampling defaults.
Handlers reach it as `app.ctx.service`.
"""

from __future__ import annotations

import itertools
import json
import logging
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import Config
from ..engine import Engine, QueueFull, RequestError
from ..package import PackageError, resource
from ..pools import PoolExhausted
from ..runner import ModelRunner, RunnerOptions
from ..text import ChatTemplate, ChatTemplateError, Tokenizer
from .constrained import BUDGET_CLOSE_TEXT, Grammars
from .errors import ApiError
from .metrics import Metrics
from .request_log import RequestLog
from .requests import SamplingDefaults

log = logging.getLogger("ninfer.serve")


class StartupError(Exception):
    """The server cannot start with this configuration (message says why)."""


@dataclass
class RequestContext:
    """Per-HTTP-request bookkeeping (request.ctx.info)."""

    request_id: str
    protocol: str
    started: float


class Service:
    def __init__(self, config: Config, runner: Any, tokenizer: Tokenizer, template: ChatTemplate, engine: Any,
                 generation_config: dict[str, Any], request_log: RequestLog, load_seconds: float) -> None:
        self.config = config
        self.runner = runner
        self.tokenizer = tokenizer
        self.template = template
        self.engine = engine
        self.generation_config = generation_config
        self.request_log = request_log
        self.load_seconds = load_seconds
        manifest = runner.manifest
        self.model_id = config.model.id or manifest.raw["model"].get("name") or runner.package.name
        self.vocab_size = int(manifest.raw["model"]["vocab_size"])
        self.max_context = int(getattr(engine, "token_limit", runner.max_context))
        self.eos_token_ids = tuple(tokenizer.eos_token_ids)
        self.defaults = SamplingDefaults.from_config(config.sampling, generation_config)
        self.grammars = Grammars(tokenizer, self.vocab_size, self.eos_token_ids)
        ids = tokenizer.encode(BUDGET_CLOSE_TEXT)
        self.budget_close_ids = ids if self.grammars.think_close_id in ids else []
        self.metrics = Metrics()
        self.created = int(time.time())
        self._numbers = itertools.count(1)
        self.healthy = True
        self.queue_timeout = config.server.queue_timeout_ms / 1000.0

    @staticmethod
    def check(config: Config) -> None:
        """What can be refused before binding the port or loading anything."""
        if config.model.path is None:
            raise StartupError("no model: give the package directory (ninfer serve PKG) or set model.path")
        package = Path(config.model.path)
        if package.suffix == ".ninfer" and package.is_file():
            raise StartupError(f"{package} is an artifact; compile it first: ninfer compile {package} -o PKG")
        if config.speculative.method != "none":
            raise StartupError(f"speculative decoding ({config.speculative.method}) is not available in this build yet")
        if config.vision.enabled:
            raise StartupError("vision input is not available in this build yet")
        if config.distributed.ranks != 1:
            raise StartupError("distributed serving is not available in this build yet")

    @classmethod
    def load(cls, config: Config, request_log: RequestLog) -> Service:
        cls.check(config)
        package = Path(config.model.path)
        started = time.perf_counter()
        try:
            runner = ModelRunner(package, options=RunnerOptions(
                max_active=config.engine.max_active, context_capacity=config.context.context_capacity,
                auto_headroom_bytes=config.context.auto_headroom_bytes))
            generation_config = json.loads(resource(package, "generation_config.json"))
            template_bytes = (Path(config.model.chat_template).read_bytes() if config.model.chat_template
                              else resource(package, "chat_template.jinja"))
            tokenizer = Tokenizer.from_bytes(resource(package, "tokenizer.json"),
                                             resource(package, "tokenizer_config.json"),
                                             json.dumps(generation_config), template_bytes)
            template = ChatTemplate.from_tokenizer(tokenizer)
        except (PackageError, ChatTemplateError, PoolExhausted, OSError, ValueError) as exc:
            raise StartupError(str(exc)) from None
        max_context = config.context.max_context
        engine = Engine(runner, tokenizer, max_active=config.engine.max_active, max_queue=config.server.max_queue,
                        eos_token_ids=tuple(tokenizer.eos_token_ids),
                        max_context=None if max_context == "auto" else max_context)
        engine.start()
        service = cls(config, runner, tokenizer, template, engine, generation_config, request_log,
                   time.perf_counter() - started)
        service.grammars.ll_tokenizer  # noqa: B018 - build the grammar tokenizer now, not on a request
        return service

    def close(self) -> None:
        try:
            self.engine.stop()
        finally:
            self.request_log.close()

    # -- per request --------------------------------------------------------------------------

    def new_context(self, protocol: str) -> RequestContext:
        return RequestContext(secrets.token_hex(16), protocol, time.perf_counter())

    def next_number(self) -> int:
        """The next generation request's number (monotonic per process, for logs)."""
        return next(self._numbers)

    def submit(self, prompt_ids: list[int], params: Any) -> Any:
        try:
            return self.engine.submit(prompt_ids, params)
        except QueueFull:
            raise ApiError(429, "the server is at capacity (active and queued requests); retry later",
                           code="server_overloaded") from None
        except RequestError as exc:
            raise ApiError(400, str(exc), code="invalid_request") from None

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, thinking: bool,
               add_generation_prompt: bool = True) -> str:
        try:
            return self.template.render(messages, tools=tools or None, add_generation_prompt=add_generation_prompt,
                                        enable_thinking=thinking)
        except ChatTemplateError as exc:
            raise ApiError(400, f"the messages cannot be rendered: {exc}", code="invalid_prompt",
                           param="messages") from None

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    # -- reporting ----------------------------------------------------------------------------

    def pool_gauges(self) -> dict[str, tuple[str, float]]:
        pool = self.runner.pool
        return {
            "ninfer_kv_pages_free": ("Free KV pages in the context pool.", pool.free_pages),
            "ninfer_kv_pages_total": ("KV pages in the context pool.", pool.plan.num_pages),
            "ninfer_state_slots_free": ("Free recurrent-state slots.", pool.free_slots),
            "ninfer_state_slots_total": ("Recurrent-state slots.", pool.plan.num_slots),
            "ninfer_kv_token_capacity": ("Tokens the KV pages hold in total.", pool.plan.token_capacity),
            "ninfer_max_context_tokens": ("Per-request context limit.", self.max_context),
        }

    def engine_metrics(self) -> dict[str, Any]:
        try:
            metrics = self.engine.metrics()
        except Exception as exc:  # noqa: BLE001 - a scrape must not fail on an engine hiccup
            log.warning("engine metrics failed: %s", exc)
            return {}
        return metrics if isinstance(metrics, dict) else {}

    def metrics_text(self) -> str:
        m = self.runner.manifest
        info = {"model": self.model_id, "target": str(m.target.get("name")), "architecture": m.architecture}
        return self.metrics.render(self.engine_metrics(), self.pool_gauges(), info)

    def startup_report(self) -> list[tuple[str, str, str]]:
        try:
            return list(self.engine.report())
        except Exception:  # noqa: BLE001 - the report is informative only
            return []

    def startup_summary(self) -> dict[str, Any]:
        m = self.runner.manifest
        plan = self.runner.pool.plan
        return {"model": self.model_id, "architecture": m.architecture, "target": m.target.get("name"),
                "device": m.target.get("device"), "max_context": self.max_context,
                "max_active": self.config.engine.max_active, "max_queue": self.config.server.max_queue,
                "context_pool_bytes": plan.total_bytes, "kv_pages": plan.num_pages, "page_size": plan.page_size,
                "state_slots": plan.num_slots, "token_capacity": plan.token_capacity,
                "load_seconds": round(self.load_seconds, 3)}
