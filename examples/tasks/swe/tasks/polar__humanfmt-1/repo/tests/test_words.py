from humanfmt import join_words, ordinal, pluralize


def test_pluralize_single():
    assert pluralize(1, "file") == "1 file"


def test_ordinal():
    numbers = (1, 2, 3, 4, 11, 12, 13, 21, 102, 111)
    expected = ["1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "102nd", "111th"]
    assert [ordinal(n) for n in numbers] == expected


def test_join_words():
    assert join_words([]) == ""
    assert join_words(["tea"]) == "tea"
    assert join_words(["tea", "milk", "sugar"], "or") == "tea, milk or sugar"
