"""JSON for what the proxy writes per call whose size is the session's whole context (the engine's prompt ids, the
history a harness resends): orjson, several times faster than the standard library at 64k-token contexts. What orjson
refuses and the standard library writes (a lone surrogate a harness escaped into its JSON, an integer past 64 bits)
is written by the standard library instead (as ASCII escapes), so no request fails here that parsed."""

from __future__ import annotations

import json
from typing import Any

import orjson


def dumps(obj: Any, *, sort_keys: bool = False) -> bytes:
    """UTF-8 JSON bytes. Compact from orjson; the fallback's spacing differs, which no reader of these bytes sees."""
    try:
        return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS if sort_keys else 0)
    except TypeError:  # orjson.JSONEncodeError
        return json.dumps(obj, sort_keys=sort_keys).encode("ascii")  # escaped: the bytes stay valid UTF-8


def loads(data: bytes | str) -> Any:
    """Parsed JSON; invalid input raises ValueError. What orjson refuses (a lone surrogate escape) is read by the
    standard library, which decides whether it is JSON."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)
