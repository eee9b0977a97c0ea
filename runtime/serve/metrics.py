"""Prometheus text exposition (format 0.0.4) of the server's counters and the engine's gauges.

Counters and histograms are updated on the event loop (and the TTFT / inter-token observations
come from there too, measured where the client sees them); engine gauges are read at scrape time
from `engine.metrics()` and the context pool, so /metrics shows free KV pages and state slots as
they are right now.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class Histogram:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.total = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.total += 1
        self.sum += value
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1

    def lines(self, name: str) -> list[str]:
        out = [f'{name}_bucket{{le="{_num(b)}"}} {c}' for b, c in zip(self.buckets, self.counts, strict=True)]
        out.append(f'{name}_bucket{{le="+Inf"}} {self.total}')
        out.append(f"{name}_sum {_num(self.sum)}")
        out.append(f"{name}_count {self.total}")
        return out


def _num(value: float) -> str:
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _metric_name(key: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in key).strip("_").lower()


class Metrics:
    def __init__(self) -> None:
        self.started = time.time()
        self._lock = threading.Lock()
        self.requests = Counter()  # (endpoint, status)
        self.finish = Counter()  # finish reason
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.reasoning_tokens = 0
        self.cache_hit_tokens = 0
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.duration = Histogram(DURATION_BUCKETS)

    def observe_ttft(self, seconds: float) -> None:
        with self._lock:
            self.ttft.observe(seconds)

    def observe_itl(self, seconds: float) -> None:
        with self._lock:
            self.itl.observe(seconds)

    def observe_outcome(self, outcome: Any) -> None:
        with self._lock:
            self.finish[outcome.finish_reason or "unknown"] += 1
            self.prompt_tokens += outcome.prompt_tokens
            self.generation_tokens += outcome.completion_tokens
            self.reasoning_tokens += outcome.reasoning_tokens
            self.cache_hit_tokens += outcome.cached_tokens
            if outcome.finished_at is not None:
                self.duration.observe(outcome.finished_at - outcome.queued_at)

    def count_request(self, endpoint: str, status: int) -> None:
        with self._lock:
            self.requests[(endpoint, status)] += 1

    def render(self, engine_metrics: Mapping[str, Any], gauges: Mapping[str, tuple[str, float]],
               info: Mapping[str, str]) -> str:
        lines: list[str] = []

        def family(name: str, kind: str, help_text: str, samples: list[str] | Callable[[], list[str]]) -> None:
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")
            lines.extend(samples() if callable(samples) else samples)

        with self._lock:
            labels = ",".join(f'{k}="{_label(v)}"' for k, v in info.items())
            family("ninfer_info", "gauge", "The served model.", [f"ninfer_info{{{labels}}} 1"])
            family("ninfer_uptime_seconds", "gauge", "Seconds since the server started.",
                   [f"ninfer_uptime_seconds {_num(time.time() - self.started)}"])
            family("ninfer_requests_total", "counter", "HTTP requests by endpoint and status.",
                   [f'ninfer_requests_total{{endpoint="{_label(e)}",status="{s}"}} {n}'
                    for (e, s), n in sorted(self.requests.items())])
            family("ninfer_request_finish_total", "counter", "Finished generations by finish reason.",
                   [f'ninfer_request_finish_total{{reason="{_label(r)}"}} {n}' for r, n in sorted(self.finish.items())])
            family("ninfer_prompt_tokens_total", "counter", "Prompt tokens of finished generations.",
                   [f"ninfer_prompt_tokens_total {self.prompt_tokens}"])
            family("ninfer_generation_tokens_total", "counter", "Generated tokens.",
                   [f"ninfer_generation_tokens_total {self.generation_tokens}"])
            family("ninfer_reasoning_tokens_total", "counter", "Generated tokens in the reasoning channel.",
                   [f"ninfer_reasoning_tokens_total {self.reasoning_tokens}"])
            family("ninfer_prefix_cache_hit_tokens_total", "counter", "Prompt tokens served from the prefix cache.",
                   [f"ninfer_prefix_cache_hit_tokens_total {self.cache_hit_tokens}"])
            family("ninfer_time_to_first_token_seconds", "histogram", "Time from submission to the first token.",
                   self.ttft.lines("ninfer_time_to_first_token_seconds"))
            family("ninfer_inter_token_latency_seconds", "histogram", "Time between consecutive tokens.",
                   self.itl.lines("ninfer_inter_token_latency_seconds"))
            family("ninfer_request_duration_seconds", "histogram", "Time from submission to the end of generation.",
                   self.duration.lines("ninfer_request_duration_seconds"))
        for name, (help_text, value) in gauges.items():
            family(name, "gauge", help_text, [f"{name} {_num(value)}"])
        for key, value in sorted(engine_metrics.items()):
            name = "ninfer_engine_" + _metric_name(key)
            if isinstance(value, bool | int | float):
                family(name, "gauge", f"Engine metric {key}.", [f"{name} {_num(value)}"])
            elif isinstance(value, Mapping) and value and all(isinstance(v, int | float) for v in value.values()):
                family(name, "gauge", f"Engine metric {key} by key.",
                       [f'{name}{{key="{_label(str(k))}"}} {_num(v)}' for k, v in sorted(value.items(), key=str)])
        return "\n".join(lines) + "\n"
