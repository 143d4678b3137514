"""Memoizing functions with an LRU cache."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from lrucache.cache import LRUCache

_MISSING = object()


def memoize(capacity: int = 128) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Cache a function's results by its positional and keyword arguments (which must be hashable)."""

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        cache = LRUCache(capacity)

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            key = (args, tuple(sorted(kwargs.items())))
            value = cache.get(key, _MISSING)
            if value is _MISSING:
                value = func(*args, **kwargs)
                cache.put(key, value)
            return value

        wrapper.cache = cache  # type: ignore[attr-defined]
        return wrapper

    return decorate
