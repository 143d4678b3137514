"""How much two sequences (token lists, texts) share at their start or end, found by halving: each probe compares, in
C, only the slices between what is known to match and what is known not to, so a 100k-long match costs about one
pass over it instead of a Python loop (or a copy of the whole prefix per probe). Bytes are compared in place, a text
copying only one side's slice. Texts are first compared whole,
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


def _equal(a: Sequence[Any], b: Sequence[Any], start: int, end: int) -> bool:
    """``a[start:end] == b[start:end]``: for bytes compared in place, for a text copying only ``b``'s part."""
    if isinstance(a, bytes) and isinstance(b, bytes):
        return a.startswith(memoryview(b)[start:end], start)
    if isinstance(a, str) and isinstance(b, str):
        return a.startswith(b[start:end], start)
    return a[start:end] == b[start:end]


def common_prefix(a: Sequence[Any], b: Sequence[Any], known: int = 0) -> int:
    """Length of the longest common prefix of ``a`` and ``b``, of which the first ``known`` items are known to agree
    (only the items after them are compared)."""
    hi = min(len(a), len(b))
    if _head_equal(a, b, hi) if not known else _equal(a, b, min(known, hi), hi):
        return hi
    lo = min(known, hi)  # a[:lo] == b[:lo] holds; a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _equal(a, b, lo, mid):
            lo = mid
        else:
            hi = mid
    return lo


def common_suffix(a: Sequence[Any], b: Sequence[Any], limit: int) -> int:
    """Length of the longest common suffix of ``a`` and ``b``, at most ``limit``."""
    hi = min(len(a), len(b), limit)
    if hi == 0 or _tail_equal(a, b, 0, hi):
        return hi
    lo = 0  # the last lo items match; the last hi do not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _tail_equal(a, b, lo, mid):
            lo = mid
        else:
            hi = mid
    return lo


def _tail_equal(a: Sequence[Any], b: Sequence[Any], lo: int, hi: int) -> bool:
    """The items ``lo`` to ``hi`` from the end agree (``a[len(a) - hi : len(a) - lo]``, ``b``'s likewise)."""
    if isinstance(a, (str, bytes)) and type(a) is type(b):
        part = memoryview(b)[len(b) - hi : len(b) - lo] if isinstance(b, bytes) else b[len(b) - hi : len(b) - lo]
        return a.startswith(part, len(a) - hi)  # type: ignore[arg-type]
    return a[len(a) - hi : len(a) - lo] == b[len(b) - hi : len(b) - lo]
