import pytest

from textstats import mean_word_length, top_words, word_counts


def test_word_counts():
    assert word_counts("a b a") == {"a": 2, "b": 1}


def test_top_words_most_frequent_first():
    text = "red red red blue blue green"
    assert top_words(text, 2) == [("red", 3), ("blue", 2)]


def test_top_words_rejects_negative_n():
    with pytest.raises(ValueError):
        top_words("a", -1)


def test_mean_word_length():
    assert mean_word_length("ab abcd") == 3.0
    assert mean_word_length("...") == 0.0
