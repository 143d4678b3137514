from humanfmt import naturaldelta


def test_naturaldelta_single_units():
    assert naturaldelta(1) == "1 second"
    assert naturaldelta(3600 + 60) == "1 hour and 1 minute"
