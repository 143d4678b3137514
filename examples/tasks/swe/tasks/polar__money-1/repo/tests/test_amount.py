from decimal import Decimal

import pytest

from money import format_minor, split, to_decimal, to_minor


def test_to_minor_zero_decimal_currency():
    assert to_minor("1500", "JPY") == 1500


def test_to_decimal_round_trip():
    assert to_decimal(1235, "BHD") == Decimal("1.235")
    assert to_minor(str(to_decimal(-7, "KWD")), "KWD") == -7


def test_format_three_decimal_currency():
    assert format_minor(-12345, "BHD") == "-12.345 BHD"


def test_split_distributes_remainder():
    assert split(100, 3) == [34, 33, 33]
    assert sum(split(1001, 7)) == 1001


def test_split_rejects_zero_parts():
    with pytest.raises(ValueError):
        split(100, 0)


def test_invalid_amount():
    with pytest.raises(ValueError):
        to_minor("12,50", "JPY")
