"""Durations."""

from humanfmt.words import join_words, pluralize

_UNITS = (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1))


def naturaldelta(seconds: int, parts: int = 2) -> str:
    """``3725`` -> ``"1 hour and 2 minutes"``: the ``parts`` largest non-zero units, rounded down."""
    if seconds < 0:
        raise ValueError("seconds must not be negative")
    if seconds == 0:
        return pluralize(0, "second")
    chunks = []
    remaining = int(seconds)
    for name, length in _UNITS:
        amount, remaining = divmod(remaining, length)
        if amount:
            chunks.append(pluralize(amount, name))
    return join_words(chunks[:parts])
