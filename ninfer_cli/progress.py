"""Progress display for long CLI work, on stderr so stdout stays clean for results."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn


@contextmanager
def byte_progress(label: str, total: int, *, enabled: bool = True) -> Iterator[Callable[[int], None]]:
    """Yields `advance(nbytes)`; shows a bar only on an interactive stderr."""
    if not enabled or not sys.stderr.isatty():
        yield lambda n: None
        return
    columns = (TextColumn(label), BarColumn(), DownloadColumn(), TimeRemainingColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(label, total=total)
        yield lambda n: bar.advance(task, n)
