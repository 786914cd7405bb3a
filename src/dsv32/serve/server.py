"""Running the application: in the foreground (``dsv32 serve``) or on a background thread (tests,
benchmarks), with uvicorn.

:class:`ServerThread` starts uvicorn on a thread of this process, waits until it accepts
connections, and stops it (and its scheduler) on exit::

    with ServerThread(create_app(served), port=0) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="none")
"""

from __future__ import annotations

import ipaddress
import socket
import subprocess
import threading
import time
import urllib.request

import uvicorn
from fastapi import FastAPI

from dsv32.errors import DSV32Error


class ServerError(DSV32Error, RuntimeError):
    """The server did not start (port in use, startup failure)."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_until_up(url: str, proc: subprocess.Popen, timeout: float, poll: float = 0.2) -> None:
    """Wait until the server that ``proc`` runs answers ``GET {url}/health``; :class:`ServerError` if
    ``proc`` exits first or nothing answers within ``timeout`` seconds (``proc`` is left running)."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise ServerError(f"the server at {url} exited with status {proc.returncode} before it answered")
        try:
            with urllib.request.urlopen(url + "/health", timeout=5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise ServerError(f"the server at {url} did not answer within {timeout:g} s") from None
            time.sleep(poll)


def check_listen(host: str, port: int) -> None:
    """Raise :class:`ServerError` unless ``host:port`` can be listened on (checked before a model
    loads, so a taken port fails in a second)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as err:
        raise ServerError(f"--host {host!r}: {err.strerror}") from err
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as err:
            raise ServerError(f"cannot listen on {host}:{port}: {err.strerror}") from err


def is_loopback(host: str) -> bool:
    """Whether every address ``host`` names is a loopback one (``127.0.0.1``, ``::1``, ``localhost``);
    a name that does not resolve counts as not loopback."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


def exposure_warning(host: str, api_key: str | None, rl_routes: bool) -> str | None:
    """What ``dsv32 serve`` warns of at start: listening beyond this machine without ``--api-key``
    (anyone who reaches the port may generate, and with ``rl_routes`` pause the server and have it
    load any weight file it can read); None when there is nothing to warn of."""
    if api_key or is_loopback(host):
        return None
    reach = (
        "pause it and have it load any weight file on this machine (--enable-rl-routes)"
        if rl_routes
        else "generate with the model"
    )
    return (
        f"warning: listening on {host}, beyond this machine, without --api-key: anyone who can reach the "
        f"port can {reach}; pass --api-key KEY (and put TLS in front)"
    )


class _Server(uvicorn.Server):
    """uvicorn's server that, on SIGINT/SIGTERM, first closes the app's scheduler: the requests in
    flight end at once with a 503 (``shutting_down``) instead of decoding on through the graceful
    shutdown, so the process exits in about a second."""

    def handle_exit(self, sig, frame) -> None:
        scheduler = getattr(self.config.app.state, "scheduler", None)
        if scheduler is not None:
            scheduler.close()
        super().handle_exit(sig, frame)


def serve_forever(app: FastAPI, host: str, port: int, log_level: str = "info") -> None:
    """Serve ``app`` until interrupted (SIGINT or SIGTERM: see :class:`_Server`)."""
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5)
    _Server(config).run()


class ServerThread:
    """uvicorn on a background thread; ``port=0`` picks a free port."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0, startup_timeout: float = 120.0):
        self.host = host
        self.port = port or free_port(host)
        config = uvicorn.Config(
            app, host=host, port=self.port, log_level="warning", timeout_graceful_shutdown=2
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="dsv32-serve-http", daemon=True)
        self.startup_timeout = startup_timeout

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + self.startup_timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self.server.should_exit = True
                raise ServerError(f"the server did not start on {self.host}:{self.port}")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        scheduler = getattr(self.server.config.app.state, "scheduler", None)
        if scheduler is not None:
            scheduler.close()  # requests still in flight end now, not after the graceful timeout
        self.server.should_exit = True
        self.thread.join(timeout=30)
