"""The token bucket."""

from __future__ import annotations

import time
from collections.abc import Callable


class TokenBucket:
    """Allows ``rate`` events per ``per`` seconds on average, in bursts of up to ``capacity`` events.

    The bucket starts full; tokens flow back in continuously, ``rate / per`` tokens per second.
    """

    def __init__(
        self,
        rate: int,
        per: float = 1.0,
        capacity: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if rate <= 0 or per <= 0:
            raise ValueError("rate and per must be positive")
        self.capacity = capacity if capacity is not None else rate
        self._fill_rate = rate // per
        self._clock = clock
        self._tokens = float(self.capacity)
        self._updated = clock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.capacity, self._tokens + (now - self._updated) * self._fill_rate)
        self._updated = now

    def try_acquire(self, tokens: int = 1) -> bool:
        """Take ``tokens`` if they are available now; never blocks."""
        self._refill()
        if tokens <= self._tokens:
            self._tokens -= tokens
            return True
        return False

    def wait_time(self, tokens: int = 1) -> float:
        """Seconds until ``tokens`` can be acquired (0.0 if they can be now)."""
        if tokens > self.capacity:
            raise ValueError("cannot wait for more tokens than the bucket holds")
        self._refill()
        missing = tokens - self._tokens
        return max(0.0, missing / self._fill_rate)
