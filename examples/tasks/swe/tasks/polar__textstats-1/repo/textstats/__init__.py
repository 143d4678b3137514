"""Small text statistics helpers."""

from textstats.stats import lexical_diversity, mean_word_length, top_words, word_counts
from textstats.tokenize import sentences, words

__all__ = ["lexical_diversity", "mean_word_length", "sentences", "top_words", "word_counts", "words"]

__version__ = "0.4.0"
