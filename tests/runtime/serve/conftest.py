"""A real `ninfer serve` subprocess on the tiny cpu package, on a free loopback port.

One server per session (API key on, CORS on, small body limit, request log) serves most tests;
`start_server` starts others with different settings. Every request goes to 127.0.0.1 only.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

API_KEY = "test-key"
BODY_LIMIT = 256 * 1024


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A running server process and a loopback HTTP client for it."""

    def __init__(self, proc: subprocess.Popen, port: int, stderr: Path, request_log: Path | None,
                 api_key: str | None) -> None:
        self.proc = proc
        self.port = port
        self.stderr = stderr
        self.request_log = request_log
        self.api_key = api_key
        self.base_url = f"http://127.0.0.1:{port}"
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(base_url=self.base_url, headers=headers, timeout=60)
        self.model_id = ""

    def wait_ready(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ninfer serve exited with {self.proc.returncode}:\n{self.stderr.read_text()}")
            try:
                if httpx.get(self.base_url + "/health", timeout=2).status_code == 200:
                    self.model_id = self.http.get("/v1/models").json()["data"][0]["id"]
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"ninfer serve did not become ready:\n{self.stderr.read_text()}")

    def metrics(self) -> dict[str, float]:
        """Samples of /metrics by `name{labels}`."""
        text = self.http.get("/metrics").text
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, value = line.rsplit(" ", 1)
                out[key] = float(value)
        return out

    def wait_idle(self, timeout: float = 30.0) -> dict[str, float]:
        """Metrics once no request is active or queued and the pool is whole again."""
        deadline = time.monotonic() + timeout
        while True:
            m = self.metrics()
            idle = (m["ninfer_engine_active"] == 0 and m["ninfer_engine_queued"] == 0
                    and m["ninfer_kv_pages_free"] == m["ninfer_kv_pages_total"]
                    and m["ninfer_state_slots_free"] == m["ninfer_state_slots_total"])
            if idle or time.monotonic() > deadline:
                return m
            time.sleep(0.1)

    def log_records(self, event: str = "request") -> list[dict]:
        import json

        assert self.request_log is not None
        lines = self.request_log.read_text().splitlines()
        return [r for r in map(json.loads, lines) if r["event"] == event]

    def stop(self) -> None:
        self.http.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def start_server(package: Path, workdir: Path, *args: str, api_key: str | None = None,
                 request_log: bool = True) -> Server:
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = workdir / "requests.jsonl" if request_log else None
    cmd = [sys.executable, "-m", "ninfer_cli.main", "serve", str(package), "--host", "127.0.0.1", "--port", str(port),
           "--log-level", "info", *args]
    if log is not None:
        cmd += ["--request-log", str(log)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("NINFER_")}
    if api_key:
        env["NINFER_API_KEY"] = api_key
    stderr = workdir / "stderr.log"
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=stderr.open("w"), env=env, cwd=workdir)
    server = Server(proc, port, stderr, log, api_key)
    try:
        server.wait_ready()
    except BaseException:
        server.stop()
        raise
    return server


@pytest.fixture(scope="session")
def server(tiny_package, tmp_path_factory) -> Iterator[Server]:
    s = start_server(tiny_package, tmp_path_factory.mktemp("serve"), "--max-active", "8", "--max-queue", "4",
                     "--cors-origin", "*", "--max-body-bytes", str(BODY_LIMIT), api_key=API_KEY)
    yield s
    s.stop()


@pytest.fixture(scope="session")
def openai_client(server):
    import openai

    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="session")
def anthropic_client(server):
    import anthropic

    return anthropic.Anthropic(base_url=server.base_url, api_key=API_KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="session")
def served_tokenizer(tiny_package):
    from ninfer_runtime.package import load_tokenizer

    return load_tokenizer(tiny_package)
