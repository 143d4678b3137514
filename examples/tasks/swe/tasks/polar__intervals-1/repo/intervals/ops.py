"""Operations on collections of intervals."""

from __future__ import annotations

from collections.abc import Iterable
from itertools import pairwise

from intervals.core import Interval


def merge(intervals: Iterable[tuple[float, float]]) -> list[Interval]:
    """Merge overlapping or touching intervals; the result is sorted and has no overlaps."""
    ordered = sorted(Interval.of(*item) for item in intervals)
    merged = [ordered[0]]
    for current in ordered[1:]:
        last = merged[-1]
        if last.overlaps(current):
            merged[-1] = Interval(last.start, max(last.end, current.end))
        else:
            merged.append(current)
    return merged


def total_length(intervals: Iterable[tuple[float, float]]) -> float:
    """Length of the union of the intervals (overlaps are counted once)."""
    return sum(item.length for item in merge(intervals))


def gaps(intervals: Iterable[tuple[float, float]]) -> list[Interval]:
    """The holes between the merged intervals, in order."""
    return [Interval(left.end, right.start) for left, right in pairwise(merge(intervals))]
