"""Exact money amounts in minor units (cents), with ISO 4217 currency rules."""

from money.amount import format_minor, split, to_decimal, to_minor
from money.currency import decimals

__all__ = ["decimals", "format_minor", "split", "to_decimal", "to_minor"]
