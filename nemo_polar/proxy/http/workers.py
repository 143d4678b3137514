"""Proxy worker processes: :class:`ProxyWorkers` starts N, each a whole proxy (:class:`ProxyServer`) in a process of
its own, and hands back the :class:`ProxyPool` that addresses them; ``python -m nemo_polar.proxy.http.workers`` is
one worker.

A worker reads its spec as one JSON line on stdin (the admin token never appears in argv, which every local user can
read), answers its addresses as one JSON line on stdout once both listeners serve, and stops when its stdin closes:
whichever way the process that started it ends, no worker outlives it.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from typing import IO

from pydantic import BaseModel, ValidationError

from nemo_polar.proxy.http.client import ProxyClient
from nemo_polar.proxy.http.config import ProxyConfig
from nemo_polar.proxy.http.pool import ProxyPool


class WorkerSpec(BaseModel):
    config: ProxyConfig
    host: str = "127.0.0.1"
    port: int | None = None
    admin_port: int | None = None
    api_key: str | None = None
    log_level: str = "warning"


class WorkerReady(BaseModel):
    url: str
    admin_url: str
    pid: int


def worker_ports(count: int, port: int | None, admin_port: int | None) -> list[tuple[int | None, int | None]]:
    """(model, admin) ports of each worker: worker 0 on ``port`` and ``admin_port`` (default ``port + 1``), worker
    i on ``port + 2i`` and ``port + 2i + 1``; all free ones when ``port`` is None or 0."""
    if not port:
        return [(None, None)] * count
    return [(port, admin_port or port + 1), *((port + 2 * i, port + 2 * i + 1) for i in range(1, count))]


def pool_port(count: int, port: int | None) -> int | None:
    """The pool's own admin API's port: the one after the last worker's (``worker_ports``); a free one when ``port``
    is None or 0."""
    return port + 2 * count if port else None


class ProxyWorkers:
    """``count`` proxy worker processes over one config and record directory; a context manager that returns once
    every worker serves (:attr:`pool` addresses them) and stops them all on exit."""

    def __init__(
        self,
        config: ProxyConfig,
        count: int | None = None,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        admin_port: int | None = None,
        api_key: str | None = None,
        log_level: str = "warning",
        start_timeout_s: float = 180.0,
    ) -> None:
        self.count = count or config.worker_count()
        self.specs = [
            WorkerSpec(
                config=config.model_copy(update={"worker": i, "workers": self.count}),
                host=host,
                port=model_port,
                admin_port=admin,
                api_key=api_key if i == 0 else None,  # a pre-made session lives on worker 0
                log_level=log_level,
            )
            for i, (model_port, admin) in enumerate(worker_ports(self.count, port, admin_port))
        ]
        self.admin_token = config.admin_token
        self.start_timeout_s = start_timeout_s
        self.processes: list[subprocess.Popen[bytes]] = []
        self.ready: list[WorkerReady] = []
        self._pool: ProxyPool | None = None

    @property
    def pool(self) -> ProxyPool:
        """The pool addressing the started workers (one object: it keeps the turn of sessions opened in turn)."""
        if self._pool is None:
            if not self.ready:
                raise RuntimeError("the workers are not started")
            workers = [ProxyClient(url=r.url, admin_url=r.admin_url, admin_token=self.admin_token) for r in self.ready]
            self._pool = ProxyPool(workers=workers, record_dir=self.specs[0].config.record_dir)
        return self._pool

    def exited(self) -> dict[int, int]:
        """The workers whose process has ended, by index, with its exit status (negative: the signal)."""
        return {i: code for i, proc in enumerate(self.processes) if (code := proc.poll()) is not None}

    def start(self) -> None:
        cmd = [sys.executable, "-m", "nemo_polar.proxy.http.workers"]
        try:
            for spec in self.specs:  # all start at once: each loads its tokenizer and template on its own core
                proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
                self.processes.append(proc)
                assert proc.stdin is not None
                proc.stdin.write(spec.model_dump_json().encode() + b"\n")
                proc.stdin.flush()
            deadline = time.monotonic() + self.start_timeout_s
            self.ready = [_await_ready(i, proc, deadline) for i, proc in enumerate(self.processes)]
        except BaseException:
            self.stop()
            raise

    def stop(self, timeout_s: float = 15.0) -> None:
        for proc in self.processes:
            if proc.stdin is not None and not proc.stdin.closed:
                proc.stdin.close()  # the worker's signal to stop
        deadline = time.monotonic() + timeout_s
        for proc in self.processes:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()

    def __enter__(self) -> ProxyWorkers:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _await_ready(index: int, proc: subprocess.Popen[bytes], deadline: float) -> WorkerReady:
    """The worker's ready line, or an error naming the worker (it exited, or did not answer in time)."""
    assert proc.stdout is not None
    line = _read_line(proc.stdout, deadline)
    if not line:
        code = proc.poll()
        why = f"exited with status {code}" if code is not None else "did not start in time"
        raise RuntimeError(f"proxy worker {index} {why} (its own error is on stderr above)")
    try:
        return WorkerReady.model_validate_json(line)
    except ValidationError:
        raise RuntimeError(f"proxy worker {index} answered {line[:200]!r}, not its addresses") from None


def _read_line(stream: IO[bytes], deadline: float) -> bytes:
    with selectors.DefaultSelector() as sel:
        sel.register(stream, selectors.EVENT_READ)
        if not sel.select(max(0.0, deadline - time.monotonic())):
            return b""
    return stream.readline()


def main() -> int:
    from nemo_polar.proxy.http.serve import ProxyServer  # here: the parent never serves

    spec = WorkerSpec.model_validate_json(sys.stdin.readline())
    try:
        server = ProxyServer(
            spec.config, spec.host, spec.port, spec.admin_port, log_level=spec.log_level, api_key=spec.api_key
        )
    except (OSError, ValueError) as exc:  # a port taken: said in one line, the parent names the worker
        print(f"proxy worker {spec.config.worker}: {exc}", file=sys.stderr, flush=True)
        return 1
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    with server:
        ready = WorkerReady(url=server.url, admin_url=server.admin_url, pid=os.getpid())
        print(ready.model_dump_json(), flush=True)
        os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # nothing else may fill a pipe no one reads any more
        stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
