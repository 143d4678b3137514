"""The two lanes of the suite (docs/testing.md). ``make test`` proves each claim once, on representative cells of a
matrix; ``make test-full`` runs the matrix's further cells, marked ``full``: every fixture sampled on every family,
every CLI behind every front-end and runtime."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

import pytest

FULL = pytest.mark.full

# One harness per dialect the proxy speaks: what a front-end depends on is the dialect its CLI speaks, not the CLI.
DIALECT_HARNESSES = {
    "chat-completions": "pi",
    "responses": "codex",
    "anthropic-messages": "claude_code",
    "gemini-generate-content": "gemini_cli",
}


def lane(values: Iterable[Any], keep: Collection[Any], *, ids: Any = None) -> list[Any]:
    """``values`` as pytest parameters: those in ``keep`` run in ``make test``, the rest only in ``make test-full``.
    A tuple value is several arguments; ``ids`` names each (a function of the value, or one id per value)."""
    values = list(values)
    names = [ids(v) for v in values] if callable(ids) else list(ids) if ids is not None else [None] * len(values)
    unknown = [k for k in keep if k not in values]
    assert not unknown, f"representative cells not in the matrix: {unknown}"
    out = []
    for value, name in zip(values, names, strict=True):
        args = value if isinstance(value, tuple) else (value,)
        out.append(pytest.param(*args, id=name, marks=() if value in keep else FULL))
    return out
