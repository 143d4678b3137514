"""A minimal CSV reader: quoted fields, doubled quotes, one record per line."""

from __future__ import annotations

from os import PathLike
from pathlib import Path


def parse_line(line: str, delimiter: str = ",") -> list[str]:
    """Fields of one line; a field in double quotes may contain the delimiter and ``""`` for a quote."""
    fields: list[str] = []
    current: list[str] = []
    quoted = False
    i = 0
    while i < len(line):
        char = line[i]
        if quoted and char == '"' and line[i + 1 : i + 2] == '"':
            current.append('"')
            i += 1
        elif char == '"':
            quoted = not quoted
        elif char == delimiter and not quoted:
            fields.append("".join(current))
            current = []
        else:
            current.append(char)
        i += 1
    if quoted:
        raise ValueError(f"unterminated quoted field in {line!r}")
    fields.append("".join(current))
    return fields


def read_records(path: str | PathLike[str], delimiter: str = ",") -> list[dict[str, str]]:
    """Records of a UTF-8 file whose first line is the header; blank lines are skipped."""
    text = Path(path).read_text(encoding="utf-8")
    header: list[str] | None = None
    records: list[dict[str, str]] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        values = parse_line(line, delimiter)
        if header is None:
            header = values
        elif len(values) != len(header):
            raise ValueError(f"line {lineno}: expected {len(header)} fields, got {len(values)}")
        else:
            records.append(dict(zip(header, values, strict=True)))
    return records
