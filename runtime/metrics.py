"""Engine counters and latency distributions, safe to read while the engine runs.

Latencies keep cumulative histograms (what a Prometheus endpoint exports) and a window of recent
samples (what a benchmark or a test inspects).
"""

from __future__ import annotations

import bisect
import threading
from collections import Counter, deque

# Upper bounds in seconds; the last bucket is +Inf.
LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class LatencyHistogram:
    def __init__(self, buckets: tuple[float, ...] = LATENCY_BUCKETS_S, window: int = 1024) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0
        self.count = 0
        self.recent: deque[float] = deque(maxlen=window)

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, seconds)] += 1
        self.sum += seconds
        self.count += 1
        self.recent.append(seconds)

    def as_dict(self) -> dict:
        cumulative, running = [], 0
        for bound, n in zip((*self.buckets, float("inf")), self.counts, strict=True):
            running += n
            cumulative.append((bound, running))
        return {"count": self.count, "sum": self.sum, "buckets": cumulative, "samples": list(self.recent)}


class EngineMetrics:
    """Totals since startup; every method takes the lock, so any thread may call `snapshot`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.submitted = 0
        self.rejected = 0
        self.prompt_tokens = 0
        self.generated_tokens = 0
        self.prefill_tokens = 0  # prompt tokens computed, recomputation included
        self.recomputed_tokens = 0
        self.preemptions = 0
        self.finished: Counter[str] = Counter()
        self.ttft = LatencyHistogram()
        self.itl = LatencyHistogram()

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, n in counts.items():
                setattr(self, name, getattr(self, name) + n)

    def finish(self, reason: str) -> None:
        with self._lock:
            self.finished[reason] += 1

    def observe_ttft(self, seconds: float) -> None:
        with self._lock:
            self.ttft.observe(seconds)

    def observe_itl(self, seconds: float) -> None:
        with self._lock:
            self.itl.observe(seconds)

    def snapshot(self) -> dict:
        with self._lock:
            return {
                "requests_submitted": self.submitted,
                "requests_rejected": self.rejected,
                "requests_finished": dict(self.finished),
                "prompt_tokens": self.prompt_tokens,
                "generated_tokens": self.generated_tokens,
                "prefill_tokens": self.prefill_tokens,
                "recomputed_tokens": self.recomputed_tokens,
                "preemptions": self.preemptions,
                "ttft_s": self.ttft.as_dict(),
                "itl_s": self.itl.as_dict(),
            }
