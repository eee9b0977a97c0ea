"""Timing helpers for the cupy-based GPU checks: per-launch time inside a CUDA graph, and the device's
read / copy bandwidth ceilings measured with our own kernels (`check_qgemv.BW_SOURCE`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np


def run_log(path: Path) -> Callable[[str], None]:
    """`say(msg)`: print msg and append it to `path`, flushed per line (a run cut short keeps its log)."""
    log = open(path, "w")  # noqa: SIM115 (the whole run)

    def say(msg: str) -> None:
        print(msg, flush=True)
        log.write(msg + "\n")
        log.flush()

    return say


def graph_us(fn, n_calls: int, reps: int, stream=None, count: int = 1) -> float:  # noqa: ANN001
    """Median over `reps` of (one CUDA graph of `n_calls` calls of fn(i)) / n_calls / count, in us
    (`count`: launches per call); on `stream` if given (a cupy Stream), else a new one."""
    import cupy as cp

    start, stop = cp.cuda.Event(), cp.cuda.Event()
    stream = stream or cp.cuda.Stream(non_blocking=True)
    with stream:
        fn(0)
        stream.synchronize()
        stream.begin_capture()
        for i in range(n_calls):
            fn(i)
        graph = stream.end_capture()
        graph.launch(stream)
        stream.synchronize()
        times = []
        for _ in range(reps):
            start.record(stream)
            graph.launch(stream)
            stop.record(stream)
            stop.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, stop) * 1e3 / n_calls / count)
    return float(np.median(times))


def ceilings(bw_module) -> tuple[float, float]:  # noqa: ANN001 (a cupy RawModule of BW_SOURCE)
    """(copy GB/s counting read + write, read-only GB/s) over 1 GiB."""
    import cupy as cp

    src = cp.ones(1 << 30, dtype=cp.uint8)
    dst = cp.empty_like(src)
    sink = cp.zeros(1, dtype=cp.uint32)
    nvec = np.uint32((1 << 30) // 16)
    copy_fn, read_fn = bw_module.get_function("bw_copy"), bw_module.get_function("bw_read")
    copy_us = graph_us(lambda i: copy_fn((132 * 8,), (256,), (src, dst, nvec)), 5, 5)
    read_us = graph_us(lambda i: read_fn((132 * 8,), (256,), (src, nvec, sink)), 5, 5)
    return 2 * (1 << 30) / (copy_us * 1e-6) / 1e9, (1 << 30) / (read_us * 1e-6) / 1e9
