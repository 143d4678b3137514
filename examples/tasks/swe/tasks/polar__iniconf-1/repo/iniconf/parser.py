"""Parse INI text into nested dictionaries."""

from __future__ import annotations

COMMENT_PREFIXES = ("#", ";")


class ParseError(ValueError):
    def __init__(self, lineno: int, message: str) -> None:
        super().__init__(f"line {lineno}: {message}")
        self.lineno = lineno


def parse(text: str) -> dict[str, dict[str, str]]:
    """Section name to ``{key: value}``; keys are lower-cased, values stripped, comment lines skipped."""
    config: dict[str, dict[str, str]] = {}
    section: dict[str, str] | None = None
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith(COMMENT_PREFIXES):
            continue
        if line.startswith("["):
            if not line.endswith("]"):
                raise ParseError(lineno, f"unterminated section header {line!r}")
            section = config.setdefault(line[1:-1].strip(), {})
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ParseError(lineno, f"expected 'key = value', got {line!r}")
        if section is None:
            raise ParseError(lineno, "key outside of any section")
        section[key.strip().lower()] = value.strip()
    return config
