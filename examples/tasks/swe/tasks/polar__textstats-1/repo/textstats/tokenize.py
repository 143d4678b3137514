"""Splitting text into words and sentences."""

import re

_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def words(text: str) -> list[str]:
    """Lower-cased words of ``text``; punctuation is dropped, inner apostrophes are kept ("don't")."""
    return _WORD.findall(text.lower())


def sentences(text: str) -> list[str]:
    """Sentences of ``text``, split after ``.``, ``!`` or ``?`` followed by whitespace."""
    parts = _SENTENCE_END.split(text.strip())
    return [part for part in parts if part]
