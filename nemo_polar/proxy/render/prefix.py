"""How much two sequences (token lists, texts) share at their start or end, found by halving: each probe compares, in
C, only the slices between what is known to match and what is known not to, so a 100k-long match costs about one
pass over it instead of a Python loop (or a copy of the whole prefix per probe). Texts are first compared whole,
without a copy (``startswith``): a render usually extends the last one."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from itertools import islice
from typing import Any


def same_objects(a: Sequence[Any], b: Sequence[Any], limit: int | None = None) -> int:
    """How many items ``a`` and ``b`` start with that are the same objects (at most ``limit``), compared in C: a
    session's lists that reuse the last call's items (messages, their JSON) are cut where the new ones begin."""
    n = min(len(a), len(b)) if limit is None else min(len(a), len(b), limit)
    if all(map(operator.is_, islice(a, n), islice(b, n))):  # the usual case, with no list made
        return n
    return list(map(operator.is_, a[:n], b[:n])).index(False)


def _head_equal(a: Sequence[Any], b: Sequence[Any], n: int) -> bool:
    """``a[:n] == b[:n]``, where ``n`` is the length of one of them."""
    if isinstance(a, (str, bytes)) and isinstance(b, (str, bytes)):
        return a.startswith(b) if len(b) == n else b.startswith(a)  # type: ignore[arg-type]
    return a[:n] == b[:n]


def common_prefix(a: Sequence[Any], b: Sequence[Any]) -> int:
    """Length of the longest common prefix of ``a`` and ``b``."""
    hi = min(len(a), len(b))
    if _head_equal(a, b, hi):
        return hi
    lo = 0  # a[:lo] == b[:lo] holds; a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def common_suffix(a: Sequence[Any], b: Sequence[Any], limit: int) -> int:
    """Length of the longest common suffix of ``a`` and ``b``, at most ``limit``."""
    hi = min(len(a), len(b), limit)
    if hi == 0 or a[len(a) - hi :] == b[len(b) - hi :]:
        return hi
    lo = 0  # the last lo items match; the last hi do not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[len(a) - mid : len(a) - lo] == b[len(b) - mid : len(b) - lo]:
            lo = mid
        else:
            hi = mid
    return lo
