import pytest

from semverlite import Version, parse


def test_parse_full_version():
    assert parse("v1.2.3-rc.1+build.5") == Version(1, 2, 3, ("rc", "1"), ("build", "5"))
    assert str(parse("1.2.3-rc.1+build.5")) == "1.2.3-rc.1+build.5"


def test_parse_rejects_leading_zero():
    with pytest.raises(ValueError):
        parse("1.02.3")
