"""`ninfer bench`: prefill and decode speed of a package, against the device's own limits.

Timing follows the project's rules: warm-up first, the device synchronised around every timed
call, medians of repeats, real (random, non-zero) token ids through the real weights. Decode is
measured per step at each concurrency (every sequence advances one token per step), so the
per-request rate is 1 / step time and the aggregate rate is concurrency / step time. The step time
is that of greedy generation as the engine runs it, where the package chooses tokens on the device:
step n + 1 queued (its tokens taken from step n on the device) before step n's tokens are read, so
the host's part of a step overlaps the GPU's; the table also gives the step with every call waited
for (`sync ms`: random tokens each step, the host's part on the critical path). The weight
bandwidth a step achieves (weight bytes / step time) is set against the copy bandwidth measured on
the same device in the same run: that ratio is the fraction of the decode roofline. Each row also
counts the sequences' own bytes a step moves (their KV pages read at the decode context, their
recurrent state read and written back): at long contexts or many requests these add to the
weights, and `all bytes` sets weights plus them against the copy bandwidth.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from .runner import ModelRunner
from .sampling import SamplingParams


@dataclass
class DecodeRow:
    concurrency: int
    step_ms: float  # greedy generation's step (queued steps where the package chooses on the device)
    per_request_tok_s: float
    aggregate_tok_s: float
    weight_gb_s: float
    roofline_fraction: float | None
    sync_step_ms: float = 0.0  # each step's call waited for
    cache_bytes: int = 0  # the sequences' KV pages read and recurrent state read + written per step
    all_bytes_fraction: float | None = None  # (weights + cache_bytes) / step / copy bandwidth
    # a synchronous step whose every row is drawn on the device (temperature 0.7, top-p 0.9;
    # packages with `sample`), its tokens read back: what a sampling request's step costs
    drawn_step_ms: float | None = None


@dataclass
class BenchReport:
    package: str
    target: str
    weight_bytes: int
    copy_gb_s: float
    prompt_len: int
    prefill_ms: float
    prefill_tok_s: float
    decode: list[DecodeRow] = field(default_factory=list)
    repeats: int = 0
    # what a decode step copies to the host: each row's greedy token ("tokens", chosen on the
    # device, as serving greedy requests does) or the whole logits row ("logits", older packages)
    decode_readback: str = "logits"
    # how `step_ms` was measured: "queued" (step n + 1 queued before step n is read) or "synchronous"
    decode_loop: str = "synchronous"
    decode_context: int = 0  # tokens each decode sequence held before its timed steps

    def as_json(self) -> dict:
        return asdict(self)

    def table(self) -> str:
        lines = [
            f"package {self.package}  target {self.target}  weights read per decode step {self.weight_bytes / 1e9:.3f} GB  "
            f"copy bandwidth {self.copy_gb_s:.1f} GB/s (measured)",
            f"prefill  {self.prompt_len} tokens: {self.prefill_ms:.2f} ms, {self.prefill_tok_s:.1f} tok/s"
            f"  (decode from {self.decode_context} cached tokens; steps read back: {self.decode_readback}; "
            f"step ms: {self.decode_loop} steps)",
            f"{'concurrency':>11} {'step ms':>9} {'tok/s/req':>10} {'tok/s total':>12} {'weights GB/s':>13} {'of roofline':>12}"
            f" {'sync ms':>9} {'cache GB':>9} {'all bytes':>10} {'drawn ms':>9}",
        ]

        def pct(x: float | None) -> str:
            return f"{100 * x:.1f}%" if x is not None else "n/a"

        for r in self.decode:
            lines.append(f"{r.concurrency:>11} {r.step_ms:>9.3f} {r.per_request_tok_s:>10.1f} {r.aggregate_tok_s:>12.1f} "
                         f"{r.weight_gb_s:>13.1f} {pct(r.roofline_fraction):>12} {r.sync_step_ms:>9.3f} "
                         f"{r.cache_bytes / 1e9:>9.3f} {pct(r.all_bytes_fraction):>10} "
                         f"{f'{r.drawn_step_ms:.3f}' if r.drawn_step_ms is not None else 'n/a':>9}")
        return "\n".join(lines)


def decode_weight_bytes(runner: ModelRunner) -> int:
    """Weight bytes one decode step reads: every parameter but the embedding table (one row each)."""
    itemsize = {"float32": 4, "int32": 4, "bfloat16": 2, "float16": 2, "uint8": 1}
    total = 0
    for p in runner.manifest.params:
        if p.binding == "text/token_embedding":
            continue
        total += int(np.prod(p.shape)) * itemsize[p.dtype]
    return total


def decode_cache_bytes(runner: ModelRunner, context: int, sequences: int) -> int:
    """Bytes of the sequences' own state one decode step moves besides the weights: each sequence's
    KV pages holding `context` tokens, read, and its recurrent (GDN, convolution) state, read and
    written back."""
    plan = runner.pool.plan
    pages = -(-context // plan.page_size) if plan.page_size else 0
    return sequences * (pages * plan.bytes_per_page + 2 * plan.bytes_per_slot)


def _sync(runner: ModelRunner) -> None:
    sync = getattr(runner.device, "sync", None)
    if sync is not None:
        sync()


def copy_bandwidth(runner: ModelRunner, nbytes: int = 1 << 30, repeats: int = 5) -> float:
    """Device copy bandwidth in GB/s (read + write bytes per second), on random data."""
    import tvm.runtime

    n = nbytes // 4
    host = np.random.default_rng(0).standard_normal(n, dtype=np.float32)
    src = tvm.runtime.tensor(host, runner.device)
    dst = tvm.runtime.empty((n,), "float32", runner.device)
    src.copyto(dst)
    _sync(runner)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        src.copyto(dst)
        _sync(runner)
        times.append(time.perf_counter() - start)
    return 2 * n * 4 / statistics.median(times) / 1e9


def run_bench(runner: ModelRunner, *, prompt_len: int, decode_tokens: int, concurrency: list[int], repeats: int = 3,
              warmup: int = 1, copy_bytes: int | None = None, seed: int = 0, decode_context: int = 64) -> BenchReport:
    rng = np.random.default_rng(seed)
    vocab = min(runner.manifest.raw["model"]["vocab_size"], 1 << 15)
    if prompt_len + 1 > runner.max_context:
        raise ValueError(f"--prompt-len {prompt_len} does not fit the package's max_context {runner.max_context}")
    queued = runner.device_greedy
    drawn = runner.device_sampling
    steps_per_sequence = warmup + decode_tokens * (1 + (repeats if queued else 0) + (1 if drawn else 0))
    context = decode_context
    if context < 1 or context + steps_per_sequence + 1 > runner.max_context:
        raise ValueError(f"--decode-context {decode_context} plus {steps_per_sequence} decode steps (--decode-tokens "
                         f"{decode_tokens}, {repeats} repeats) do not fit the package's max_context {runner.max_context}")
    weight_bytes = decode_weight_bytes(runner)
    # several times any cache: 1 GiB on a GPU, 256 MiB on a host CPU
    copy = copy_bandwidth(runner, copy_bytes or (1 << 30 if runner.manifest.target["device"] == "cuda" else 1 << 28))

    def prefill_once() -> float:
        seq = runner.pool.acquire()
        try:
            tokens = rng.integers(2, vocab, prompt_len)
            _sync(runner)
            start = time.perf_counter()
            runner.prefill(seq, tokens)
            _sync(runner)
            return time.perf_counter() - start
        finally:
            runner.pool.release(seq)

    for _ in range(warmup):
        prefill_once()
    prefill = statistics.median(prefill_once() for _ in range(repeats))
    report = BenchReport(str(runner.package), runner.manifest.target["name"], weight_bytes, copy, prompt_len,
                         prefill * 1e3, prompt_len / prefill, repeats=repeats,
                         decode_readback="tokens" if queued else "logits",
                         decode_loop="queued" if queued else "synchronous", decode_context=decode_context)
    step_fn = runner.decode_greedy if queued else runner.decode
    for c in concurrency:
        if c > runner.pool.plan.num_slots:
            raise ValueError(f"concurrency {c} exceeds the runner's {runner.pool.plan.num_slots} sequence slots")
        seqs = [runner.pool.acquire() for _ in range(c)]
        try:
            for s in seqs:
                runner.prefill(s, rng.integers(2, vocab, context))
            tokens = rng.integers(2, vocab, c)
            for _ in range(warmup):
                step_fn(seqs, tokens)
            steps = []
            for _ in range(decode_tokens):
                tokens = rng.integers(2, vocab, c)
                _sync(runner)
                start = time.perf_counter()
                step_fn(seqs, tokens)
                _sync(runner)
                steps.append(time.perf_counter() - start)
            sync_step = step = statistics.median(steps)
            if queued:
                step = statistics.median(queued_step_seconds(runner, seqs, rng.integers(2, vocab, c), decode_tokens)
                                         for _ in range(repeats))
            drawn_step = drawn_step_seconds(runner, seqs, rng, vocab, decode_tokens) if drawn else None
        finally:
            for s in seqs:
                runner.pool.release(s)
        gbps = weight_bytes / step / 1e9
        cache = decode_cache_bytes(runner, context, c)
        report.decode.append(DecodeRow(c, step * 1e3, 1 / step, c / step, gbps, gbps / copy if copy > 0 else None,
                                       sync_step * 1e3, cache,
                                       (weight_bytes + cache) / step / 1e9 / copy if copy > 0 else None,
                                       drawn_step * 1e3 if drawn_step is not None else None))
    return report


DRAW = SamplingParams(temperature=0.7, top_p=0.9, seed=0)  # the bench's sampling request


def drawn_step_seconds(runner: ModelRunner, seqs: list, rng: np.random.Generator, vocab: int, count: int) -> float:
    """Median seconds of `count` synchronous steps whose every row is drawn on the device."""
    times = []
    for i in range(count):
        tokens = rng.integers(2, vocab, len(seqs))
        draws = {r: DRAW.device_row(10_000 * r + i) for r in range(len(seqs))}
        _sync(runner)
        start = time.perf_counter()
        runner.decode_drawn(seqs, tokens, draws)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def queued_step_seconds(runner: ModelRunner, seqs: list, tokens: np.ndarray, count: int) -> float:
    """Seconds per step of `count` greedy steps as the engine queues them: each step queued before
    the one before it is read, its tokens taken from that step on the device."""
    rows = {i: i for i in range(len(seqs))}
    _sync(runner)
    start = time.perf_counter()
    pending = runner.decode_greedy_async(seqs, tokens)
    for _ in range(count - 1):
        after = runner.decode_greedy_async(seqs, tokens, feed=pending, feed_rows=rows)
        pending.result()
        pending = after
    pending.result()
    _sync(runner)
    return (time.perf_counter() - start) / count
