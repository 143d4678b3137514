"""Counts and lists in words."""

from __future__ import annotations

_SUFFIXES = {1: "st", 2: "nd", 3: "rd"}


def pluralize(count: int, singular: str, plural: str | None = None) -> str:
    """``pluralize(1, "file")`` -> ``"1 file"``, ``pluralize(3, "file")`` -> ``"3 files"``."""
    plural = plural or singular + "s"
    return f"{count} " + singular if count == 1 else plural


def ordinal(n: int) -> str:
    """``1`` -> ``"1st"``, ``12`` -> ``"12th"``, ``23`` -> ``"23rd"``."""
    suffix = "th" if 10 <= n % 100 <= 20 else _SUFFIXES.get(n % 10, "th")
    return f"{n}{suffix}"


def join_words(items: list[str], conjunction: str = "and") -> str:
    """``["a", "b", "c"]`` -> ``"a, b and c"``."""
    if len(items) < 2:
        return "".join(items)
    return f"{', '.join(items[:-1])} {conjunction} {items[-1]}"
