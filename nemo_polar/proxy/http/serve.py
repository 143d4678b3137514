"""Serve ASGI apps in-process: uvicorn in a background thread on loopback ports.

Each listener's socket is bound before uvicorn starts (port 0: the kernel picks one and it stays held), so two
listeners can never be handed the same port, as two separate free-port probes sometimes were.

:class:`ProxyServer` runs the proxy's model and admin apps as two listeners on one event loop (they share the
engine client, sessions and admission state, which are bound to it). :class:`BackgroundServer` runs any single app.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import uvicorn
from starlette.types import ASGIApp

from nemo_polar.proxy.http.app import ProxyApps, create_apps
from nemo_polar.proxy.http.client import ProxyClient
from nemo_polar.proxy.http.config import ProxyConfig

# How long an idle keep-alive connection stays open. uvicorn's default (5 s) equals httpx's keepalive_expiry and
# exceeds Node's (4 s): an agent that reuses its connection after ~5 s of tool time races the server's close and
# gets "server disconnected" on a POST it cannot safely retry. The server must outlast its clients' idle timeouts.
KEEP_ALIVE_S = 75


class _Servers:
    """uvicorn servers on one loop in a daemon thread; a context manager that waits until all are serving.

    ``apps`` are (app, host, port); port ``None`` binds a free one, read back from :attr:`ports`."""

    def __init__(self, apps: list[tuple[ASGIApp, str, int | None]], log_level: str = "warning") -> None:
        self.sockets: list[socket.socket] = []
        try:
            for _, host, port in apps:
                self.sockets.append(_listen(host, port))
        except OSError:
            for sock in self.sockets:
                sock.close()
            raise
        self.ports = [s.getsockname()[1] for s in self.sockets]
        self.servers = [
            uvicorn.Server(uvicorn.Config(app, log_level=log_level, timeout_keep_alive=KEEP_ALIVE_S))
            for app, _, _ in apps
        ]
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        # The loop uvicorn itself would serve on (uvloop where installed, as ``uvicorn.run`` and vLLM do): a proxy
        # call costs ~10% less CPU on it than on asyncio's own loop.
        with asyncio.Runner(loop_factory=self.servers[0].config.get_loop_factory()) as runner:
            runner.run(self._serve())

    async def _serve(self) -> None:
        await asyncio.gather(*(s.serve(sockets=[sock]) for s, sock in zip(self.servers, self.sockets, strict=True)))

    def start(self, timeout: float = 20.0) -> None:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not all(s.started for s in self.servers):
            if time.monotonic() > deadline or not self.thread.is_alive():
                self.stop()
                raise TimeoutError("the server did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        for s in self.servers:
            s.should_exit = True
        if self.thread.is_alive():
            self.thread.join(timeout=10)
        for sock in self.sockets:
            sock.close()


def _listen(host: str, port: int | None) -> socket.socket:
    # The protocol named: asyncio sets TCP_NODELAY only on sockets whose proto is IPPROTO_TCP, and an accepted socket
    # inherits the listener's (0 when left out). Without it every small answer written in two parts waited for the
    # peer's delayed ACK: ~40 ms a call.
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port or 0))
    except OSError as e:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {e.strerror}") from e
    sock.listen(2048)
    sock.set_inheritable(False)
    return sock


class BackgroundServer:
    """Run one ASGI app with uvicorn in a daemon thread."""

    def __init__(self, app: ASGIApp, host: str = "127.0.0.1", port: int | None = None) -> None:
        self.host = host
        self._servers = _Servers([(app, host, port)])
        self.port = self._servers.ports[0]

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> BackgroundServer:
        self._servers.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._servers.stop()


class ProxyServer:
    """The proxy served in-process: ``url`` is the model API, ``admin_url`` the admin API (``admin_token``)."""

    def __init__(
        self,
        config: ProxyConfig,
        host: str = "127.0.0.1",
        port: int | None = None,
        admin_port: int | None = None,
        *,
        log_level: str = "warning",
        api_key: str | None = None,
    ) -> None:
        """``api_key`` pre-creates one session with that key (see :func:`create_apps`)."""
        self.apps: ProxyApps = create_apps(config, api_key=api_key)
        if port is not None and port == admin_port:
            raise ValueError("the model and admin listeners need different ports")
        listeners = [(self.apps.model, host, port), (self.apps.admin, host, admin_port)]
        self.host = host
        self._servers = _Servers(listeners, log_level)
        self.port, self.admin_port = self._servers.ports

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def admin_url(self) -> str:
        return f"http://{self.host}:{self.admin_port}"

    @property
    def admin_token(self) -> str:
        return self.apps.proxy.config.admin_token

    def client(self) -> ProxyClient:
        return ProxyClient(url=self.url, admin_url=self.admin_url, admin_token=self.admin_token)

    def __enter__(self) -> ProxyServer:
        self._servers.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._servers.stop()
