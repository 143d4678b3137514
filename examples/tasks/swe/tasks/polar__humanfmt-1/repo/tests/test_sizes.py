from humanfmt import naturalsize


def test_naturalsize_decimal():
    assert naturalsize(999) == "999 B"
    assert naturalsize(1500) == "1.5 kB"
    assert naturalsize(3_200_000_000) == "3.2 GB"


def test_naturalsize_binary():
    assert naturalsize(1536, binary=True) == "1.5 KiB"
