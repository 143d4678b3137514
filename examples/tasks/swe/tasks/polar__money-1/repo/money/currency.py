"""Per-currency rules."""

# Currencies whose minor unit is not the usual hundredth (ISO 4217).
MINOR_DIGITS = {
    "BHD": 3,
    "JPY": 0,
    "KRW": 0,
    "KWD": 3,
    "VND": 0,
}


def decimals(code: str) -> int:
    """Number of digits after the decimal point in the currency ``code`` (e.g. 2 for USD, 0 for JPY)."""
    if len(code) != 3 or not code.isalpha():
        raise ValueError(f"not a currency code: {code!r}")
    return MINOR_DIGITS.get(code.upper(), 0)
