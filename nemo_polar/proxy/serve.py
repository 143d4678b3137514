"""Serve the proxy in-process: uvicorn in a background thread on a free loopback port."""

from __future__ import annotations

import threading
import time

import uvicorn
from fastapi import FastAPI

from nemo_polar.engine.launcher import free_port


class BackgroundServer:
    """Run an ASGI app with uvicorn in a daemon thread; a context manager that waits until it is serving."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int | None = None) -> None:
        self.host, self.port = host, port or free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> BackgroundServer:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise TimeoutError(f"the proxy did not start on {self.url}")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
