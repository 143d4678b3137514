"""Read small CSV files into dictionaries, with optional type coercion."""

from csvlite.convert import coerce, typed
from csvlite.reader import parse_line, read_records

__all__ = ["coerce", "parse_line", "read_records", "typed"]
