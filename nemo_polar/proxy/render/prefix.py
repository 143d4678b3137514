"""How much two sequences (token lists, texts) share at their start or end, found by halving: each probe compares
slices in C, so a 100k-long match costs a few dozen memory compares instead of a Python loop."""

from __future__ import annotations

from collections.abc import Sequence


def common_prefix(a: Sequence, b: Sequence) -> int:
    """Length of the longest common prefix of ``a`` and ``b``."""
    hi = min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    lo = 0  # a[:lo] == b[:lo] holds; a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def common_suffix(a: Sequence, b: Sequence, limit: int) -> int:
    """Length of the longest common suffix of ``a`` and ``b``, at most ``limit``."""
    hi = min(len(a), len(b), limit)
    if hi == 0 or a[len(a) - hi :] == b[len(b) - hi :]:
        return hi
    lo = 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[len(a) - mid :] == b[len(b) - mid :]:
            lo = mid
        else:
            hi = mid
    return lo
