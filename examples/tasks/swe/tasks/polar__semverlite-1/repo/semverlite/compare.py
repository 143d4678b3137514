"""Precedence of versions, as defined by the semantic versioning specification."""

from __future__ import annotations

import functools
from collections.abc import Iterable

from semverlite.version import Version, parse


def _coerce(value: Version | str) -> Version:
    return value if isinstance(value, Version) else parse(value)


def _compare_identifiers(a: str, b: str) -> int:
    if a.isdigit() and b.isdigit():
        return (int(a) > int(b)) - (int(a) < int(b))
    if a.isdigit() or b.isdigit():
        # numeric identifiers have lower precedence than alphanumeric ones
        return -1 if a.isdigit() else 1
    return (a > b) - (a < b)


def _compare_prerelease(a: tuple[str, ...], b: tuple[str, ...]) -> int:
    for left, right in zip(a, b, strict=False):
        result = _compare_identifiers(left, right)
        if result:
            return result
    return (len(a) > len(b)) - (len(a) < len(b))


def compare(a: Version | str, b: Version | str) -> int:
    """-1, 0 or 1 as ``a`` has lower, equal or higher precedence than ``b``; build metadata is ignored."""
    a, b = _coerce(a), _coerce(b)
    core_a, core_b = (a.major, a.minor, a.patch), (b.major, b.minor, b.patch)
    if core_a != core_b:
        return -1 if core_a < core_b else 1
    if a.prerelease == b.prerelease:
        return 0
    if not a.prerelease:
        return -1
    if not b.prerelease:
        return 1
    return _compare_prerelease(a.prerelease, b.prerelease)


def sort_versions(versions: Iterable[Version | str]) -> list[Version]:
    """Versions from lowest to highest precedence."""
    return sorted((_coerce(v) for v in versions), key=functools.cmp_to_key(compare))
