"""`ninfer serve` startup: flags, and failures that exit 1 before serving."""

from __future__ import annotations

import socket
import subprocess
import sys

from click.testing import CliRunner

from ninfer_cli.main import cli

from .conftest import free_port


def serve(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ninfer_cli.main", "serve", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_help_lists_the_server_flags():
    result = CliRunner().invoke(cli, ["serve", "--help"])
    assert result.exit_code == 0
    for flag in ("--config", "--host", "--port", "--api-key", "--cors-origin", "--request-log", "--max-queue",
                 "--max-body-bytes", "--max-active", "--thinking", "--request-log-text"):
        assert flag in result.output, flag
    assert "serve" in CliRunner().invoke(cli, ["--help"]).output


def test_port_in_use_fails_before_loading(tiny_package):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = serve(str(tiny_package), "--port", str(port))
    assert result.returncode == 1
    assert f"failed to bind 127.0.0.1:{port}" in result.stderr and "loading model" not in result.stderr


def test_bad_package_and_bad_log_directory(tmp_path, tiny_package):
    result = serve(str(tmp_path / "missing"), "--port", str(free_port()))
    assert result.returncode == 1 and "not a ninfer package" in result.stderr
    result = serve(str(tiny_package), "--request-log", str(tmp_path / "no" / "log.jsonl"))
    assert result.returncode == 1 and "does not exist" in result.stderr
    result = serve()
    assert result.returncode == 1 and "no model" in result.stderr
