"""Turning field strings into Python values."""

from __future__ import annotations

Value = int | float | bool | str | None

_BOOLEANS = {"true": True, "false": False}


def coerce(value: str) -> Value:
    """``""`` -> None, ``"42"`` -> 42, ``"2.5"`` -> 2.5, ``"true"``/``"false"`` -> bool, anything else unchanged."""
    text = value.strip()
    if not text:
        return None
    if text.lower() in _BOOLEANS:
        return _BOOLEANS[text.lower()]
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return value


def typed(records: list[dict[str, str]]) -> list[dict[str, Value]]:
    """Every field of every record passed through :func:`coerce`."""
    return [{key: coerce(value) for key, value in record.items()} for record in records]
