"""Closed numeric intervals: merging, total length and gaps."""

from intervals.core import Interval
from intervals.ops import gaps, merge, total_length

__all__ = ["Interval", "gaps", "merge", "total_length"]
