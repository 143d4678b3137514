"""Reading and writing values by dotted path (``"server.tls.port"``)."""

from __future__ import annotations

import copy
from typing import Any

_MISSING = object()


def get_path(config: dict[str, Any], path: str, default: Any = _MISSING) -> Any:
    """The value at ``path``, or ``default``; without a default a missing path raises ``KeyError``."""
    node: Any = config
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            if default is _MISSING:
                raise KeyError(path)
            return default
        node = node[part]
    return node


def with_value(config: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of ``config`` with ``path`` set to ``value``; missing levels are created, ``config`` is unchanged."""
    result = copy.copy(config)
    node = result
    *parents, leaf = path.split(".")
    for part in parents:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[leaf] = value
    return result


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; empty dictionaries are kept as values."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = value
    return flat
