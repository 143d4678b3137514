"""Matching paths against patterns."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable

from globmatch.translate import translate


@functools.lru_cache(maxsize=256)
def _compile(pattern: str) -> re.Pattern[str]:
    return re.compile(translate(pattern))


def match(path: str, pattern: str) -> bool:
    """Whether ``path`` (with ``/`` separators) matches ``pattern``."""
    return _compile(pattern).match(path) is not None


def match_any(path: str, patterns: Iterable[str]) -> bool:
    return any(match(path, pattern) for pattern in patterns)


def filter_paths(paths: Iterable[str], pattern: str) -> list[str]:
    """The paths that match, in their original order."""
    return [path for path in paths if match(path, pattern)]
