"""Word frequencies and averages."""

from collections import Counter

from textstats.tokenize import words


def word_counts(text: str) -> Counter[str]:
    """How many times each word occurs in ``text``."""
    return Counter(words(text))


def top_words(text: str, n: int = 10) -> list[tuple[str, int]]:
    """The ``n`` most frequent words with their counts.

    The most frequent word comes first; words with the same count are listed alphabetically, so the result does
    not depend on where the words appear in the text.
    """
    if n < 0:
        raise ValueError("n must not be negative")
    counts = word_counts(text)
    ranked = sorted(counts.items(), key=lambda item: (item[1], item[0]), reverse=True)
    return ranked[:n]


def lexical_diversity(text: str) -> float:
    """Share of distinct words among all words (1.0 when no word repeats); 0.0 for text without words."""
    tokens = words(text)
    if not tokens:
        return 0.0
    return len(set(tokens)) / len(tokens)


def mean_word_length(text: str) -> float:
    """Average number of characters per word; 0.0 for text without words."""
    tokens = words(text)
    if not tokens:
        return 0.0
    return sum(len(token) for token in tokens) / len(tokens)
