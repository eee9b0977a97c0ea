"""Process lifecycle of `ninfer serve` (product spec 3.1).

Order: open the request log, bind the listening socket (a taken port fails before minutes of
model loading), load the package and start the engine, log what was loaded and the capacity it
leaves, then serve in this process (one engine, so no Sanic worker processes) until SIGINT /
SIGTERM, and stop the engine.
"""

from __future__ import annotations

import logging
import socket
import sys
import time
from collections.abc import Sequence
from typing import Any

from ..config import Config
from .request_log import RequestLog, RequestLogError
from .service import Service, StartupError

log = logging.getLogger("ninfer.serve")
_LEVELS = {"trace": logging.DEBUG, "debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "error": logging.ERROR, "critical": logging.CRITICAL, "off": logging.CRITICAL + 10}


def setup_logging(level: str) -> None:
    """Timestamped operational records on stderr: `YYYY-MM-DD HH:MM:SS.mmm  LEVEL  message`."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s.%(msecs)03d  %(levelname)s  %(message)s",
                                           datefmt="%Y-%m-%d %H:%M:%S"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(_LEVELS.get(level, logging.INFO))
    for noisy in ("sanic.access", "sanic.root", "sanic.server"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def bind(host: str, port: int) -> socket.socket:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(1024)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def redacted_argv(argv: Sequence[str]) -> list[str]:
    out, hide = [], False
    for arg in argv:
        if hide:
            out.append("<redacted>")
            hide = False
        elif arg == "--api-key":
            out.append(arg)
            hide = True
        elif arg.startswith("--api-key="):
            out.append("--api-key=<redacted>")
        else:
            out.append(arg)
    return out


def run(config: Config, argv: Sequence[str] = ()) -> int:
    """Start the server and block until it stops; returns the exit status."""
    setup_logging(config.logging.level)
    server = config.server
    try:
        Service.check(config)
    except StartupError as exc:
        log.error("%s", exc)
        return 1
    try:
        request_log = RequestLog(server.request_log, include_text=server.request_log_text)
    except RequestLogError as exc:
        log.error("%s", exc)
        return 1
    try:
        sock = bind(server.host, server.port)
    except OSError as exc:
        log.error("failed to bind %s:%d (%s)", server.host, server.port, exc.strerror or exc)
        return 1
    log.info("loading model %s", config.model.path)
    try:
        service = Service.load(config, request_log)
    except StartupError as exc:
        log.error("%s", exc)
        sock.close()
        return 1
    s = service.startup_summary()
    log.info("model loaded in %.2f s: %s (%s) for target %s (%s)", s["load_seconds"], s["model"], s["architecture"],
             s["target"], s["device"])
    for group, label, value in service.startup_report():
        log.info("%-8s %-24s %s", group, label, value)
    log.info("estimated capacity: %d concurrent requests at full context (%d tokens)",
             min(s["state_slots"], s["token_capacity"] // max(s["max_context"], 1)), s["token_capacity"])
    request_log.write("server_start", {
        "server": {"host": server.host, "port": server.port, "public_model_id": service.model_id,
                   "api_key_configured": server.api_key is not None, "cors_origins": list(server.cors_origins),
                   "max_request_bytes": server.max_body_bytes, "default_output_tokens": config.sampling.max_tokens,
                   "default_thinking": config.sampling.thinking},
        "engine": s, "sampling_defaults": dict(service.defaults.values, seed=service.defaults.seed,
                                               greedy=service.defaults.greedy),
        "argv": redacted_argv(argv)})
    return _serve(service, sock)


def _serve(service: Service, sock: socket.socket) -> int:
    from .app import create_app

    app = create_app(service)
    server = service.config.server
    host, port = sock.getsockname()[:2]
    started = time.perf_counter()

    @app.after_server_start
    async def ready(app: Any) -> None:
        log.info("listening on http://%s:%d (model id: %s, auth: %s)", host, port, service.model_id,
                 "bearer" if server.api_key else "disabled")

    @app.after_server_stop
    async def stopped(app: Any) -> None:
        log.info("shutting down after %.0f s", time.perf_counter() - started)
        service.close()

    app.run(sock=sock, single_process=True, access_log=False, motd=False, backlog=1024)
    return 0
