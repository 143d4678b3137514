"""Converting, formatting and splitting amounts held as integers of minor units."""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

from money.currency import decimals


def to_minor(amount: str, code: str) -> int:
    """``"12.345"`` USD -> ``1235``: the amount in minor units of the currency, rounded half up."""
    try:
        value = Decimal(amount)
    except InvalidOperation:
        raise ValueError(f"not an amount: {amount!r}") from None
    scaled = value.scaleb(decimals(code))
    return int(scaled.quantize(Decimal(1), rounding=ROUND_HALF_UP))


def to_decimal(minor: int, code: str) -> Decimal:
    """``1235`` USD -> ``Decimal("12.35")``: the inverse of :func:`to_minor`."""
    return Decimal(minor).scaleb(-decimals(code))


def format_minor(minor: int, code: str) -> str:
    """``123456`` USD -> ``"1,234.56 USD"``."""
    places = decimals(code)
    sign = "-" if minor < 0 else ""
    whole, fraction = divmod(abs(minor), 10**places)
    text = f"{whole:,}"
    if places:
        text += f".{fraction:0{places}d}"
    return f"{sign}{text} {code.upper()}"


def split(minor: int, parts: int) -> list[int]:
    """Split an amount into ``parts`` shares that differ by at most one minor unit and add up exactly."""
    if parts <= 0:
        raise ValueError("parts must be positive")
    share, remainder = divmod(minor, parts)
    return [share + 1 if index < remainder else share for index in range(parts)]
