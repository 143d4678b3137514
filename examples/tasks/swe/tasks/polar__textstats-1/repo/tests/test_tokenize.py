from textstats import sentences, words


def test_words_lowercases_and_drops_punctuation():
    assert words("Hello, World! Don't panic.") == ["hello", "world", "don't", "panic"]


def test_sentences_split_after_terminators():
    assert sentences("One. Two!  Three? Four") == ["One.", "Two!", "Three?", "Four"]
