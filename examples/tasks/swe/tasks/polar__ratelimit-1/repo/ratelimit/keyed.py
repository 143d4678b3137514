"""One bucket per key (user, IP address, API token, ...)."""

from __future__ import annotations

from collections.abc import Callable, Hashable

from ratelimit.bucket import TokenBucket


class KeyedLimiter:
    """Creates a bucket with ``factory`` the first time a key is seen."""

    def __init__(self, factory: Callable[[], TokenBucket]) -> None:
        self._factory = factory
        self._buckets: dict[Hashable, TokenBucket] = {}

    def try_acquire(self, key: Hashable, tokens: int = 1) -> bool:
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = self._factory()
        return bucket.try_acquire(tokens)

    def __len__(self) -> int:
        return len(self._buckets)
