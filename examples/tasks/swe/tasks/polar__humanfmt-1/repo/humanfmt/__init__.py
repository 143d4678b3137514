"""Human-friendly formatting of counts, sizes and durations."""

from humanfmt.durations import naturaldelta
from humanfmt.sizes import naturalsize
from humanfmt.words import join_words, ordinal, pluralize

__all__ = ["join_words", "naturaldelta", "naturalsize", "ordinal", "pluralize"]
