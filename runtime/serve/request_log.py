"""The structured request log (`server.request_log`): one JSON object per line, append mode.

One `request` record per generation request (accepted or rejected) with timings, token counts,
the finish reason, prefix-cache hits and the error; plus one `server_start` record. Prompt and
output text are left out unless `server.request_log_text` asks for them, and the API key never
appears. A failing write disables the log with one warning instead of failing requests.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import IO, Any

ARTIFACT_TYPE = "ninfer_serve_request_log"
SCHEMA_VERSION = 1

log = logging.getLogger("ninfer.serve")


class RequestLogError(Exception):
    """The log file cannot be opened (startup fails)."""


class RequestLog:
    def __init__(self, path: Path | None, *, include_text: bool = False) -> None:
        self.path = path
        self.include_text = include_text
        self.instance_id = f"serve-{os.getpid()}-{int(time.time() * 1e6)}"
        self._file: IO[str] | None = None
        if path is not None:
            if not path.parent.is_dir():
                raise RequestLogError(f"request log {path}: directory {path.parent} does not exist")
            try:
                self._file = path.open("a", encoding="utf-8")
            except OSError as exc:
                raise RequestLogError(f"request log {path}: {exc.strerror or exc}") from None

    @property
    def enabled(self) -> bool:
        return self._file is not None

    def write(self, event: str, record: dict[str, Any]) -> None:
        if self._file is None:
            return
        line = {"artifact_type": ARTIFACT_TYPE, "schema_version": SCHEMA_VERSION, "event": event,
                "timestamp_unix_ms": int(time.time() * 1000), "server_instance_id": self.instance_id, **record}
        try:
            self._file.write(json.dumps(line, ensure_ascii=False, default=str) + "\n")
            self._file.flush()
        except (OSError, ValueError) as exc:
            log.warning("request log %s: write failed (%s); logging disabled", self.path, exc)
            self.close()

    def close(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass
            self._file = None
