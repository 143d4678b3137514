"""Work run ahead of the tests that read it, a few at a time: CLI sessions mostly wait on their CLI's start-up and
tools, so a few overlap on the one engine, and the scripted policy holds every sampled token whatever runs beside
it (no verdict depends on the overlap; make test-loaded holds it). Each test waits only for its own item, so no
test's time limit covers more than one session."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

CONCURRENT_SESSIONS = 3


class RunAhead(Generic[K, V]):
    """``run(key)`` for every wanted key, in the order given, ``width`` at a time, started on first use; calling it
    with a key returns that key's result (or raises what its run raised). A key not wanted is run when asked."""

    def __init__(self, run: Callable[[K], V], wanted: list[K], width: int = CONCURRENT_SESSIONS) -> None:
        self.run, self.wanted = run, list(dict.fromkeys(wanted))
        self.pool = ThreadPoolExecutor(max_workers=width)
        self.futures: dict[K, Future[V]] = {}

    def __call__(self, key: K) -> V:
        if not self.futures:
            self.futures = {k: self.pool.submit(self.run, k) for k in self.wanted}
        if key not in self.futures:
            self.futures[key] = self.pool.submit(self.run, key)
        return self.futures[key].result()

    def close(self) -> None:
        """Wait for what was started (a session's sandbox is cleaned up by its own run), start nothing more."""
        self.pool.shutdown(wait=True, cancel_futures=True)
