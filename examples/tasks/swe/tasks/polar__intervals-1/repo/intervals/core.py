"""The interval type."""

from __future__ import annotations

from typing import NamedTuple


class Interval(NamedTuple):
    """A closed interval ``[start, end]``; ``end`` must not be smaller than ``start``."""

    start: float
    end: float

    @classmethod
    def of(cls, start: float, end: float) -> Interval:
        if end < start:
            raise ValueError(f"interval end {end} is before its start {start}")
        return cls(start, end)

    @property
    def length(self) -> float:
        return self.end - self.start

    def overlaps(self, other: Interval) -> bool:
        """True when the intervals share at least one point (touching intervals overlap)."""
        return self.start <= other.end and other.start <= self.end
