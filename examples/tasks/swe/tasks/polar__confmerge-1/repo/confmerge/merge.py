"""Merging nested dictionaries."""

from __future__ import annotations

from functools import reduce
from typing import Any


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """A new dictionary: ``override`` on top of ``base``, merging nested dictionaries key by key."""
    result = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = deep_merge(result[key], value)
        else:
            result[key] = value
    return result


def layered(*layers: dict[str, Any]) -> dict[str, Any]:
    """Merge configuration layers from the lowest (defaults) to the highest priority."""
    return reduce(deep_merge, layers, {})
