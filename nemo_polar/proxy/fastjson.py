"""JSON for what the proxy writes per call whose size is the session's whole context (the engine's prompt ids, the
history a harness resends): orjson, several times faster than the standard library at 64k-token contexts. What orjson
refuses and the standard library writes (a lone surrogate a harness escaped into its JSON, an integer past 64 bits)
is written by the standard library instead (as ASCII escapes), so no request fails here that parsed."""

from __future__ import annotations

import json
import secrets
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


def dumps_with(obj: dict[str, Any], raw: dict[str, bytes]) -> bytes:
    """``obj`` as JSON with each field of ``raw`` given as JSON already written (a prompt's ids, serialised once and
    then also what the engine's echo is compared with); ``raw`` wins over a field of the same name in ``obj``."""
    head = dumps({k: v for k, v in obj.items() if k not in raw})
    if not raw:
        return head
    parts = [memoryview(head)[:-1]]  # one copy of each part, however long (a prompt's ids: ~450 KB at 64k tokens)
    for k, v in raw.items():
        parts += [b"," if len(parts) > 1 or len(head) > 2 else b"", dumps(k), b":", v]
    return b"".join([*parts, b"}"])


# What loads_echo puts where a field's value was the bytes expected: a string no engine writes there (a nonce per
# process), so reading it back proves that this field, and no other, held exactly those bytes.
AS_SENT = f"polar:as-sent:{secrets.token_hex(8)}"
_AS_SENT_JSON = orjson.dumps(AS_SENT)


def loads_echo(data: bytes, key: str, sent: bytes) -> Any:
    """Parsed JSON in which each ``key`` field whose value is, byte for byte, ``sent`` (itself a JSON value) reads
    :data:`AS_SENT` instead, unparsed: an engine echoing the prompt's ids as the proxy wrote them (vLLM writes compact
    JSON, as orjson does) costs a memory search, not a parse of every id and a comparison. Anything else (another
    spacing, other ids) is parsed as it stands, for the caller to compare."""
    needle = dumps(key) + b":"
    spliced, start, at = [], 0, 0
    while (at := data.find(needle, at)) >= 0:  # the key found (a short search), its value compared in place
        at += len(needle)
        if data.startswith(sent, at):
            spliced += [data[start:at], _AS_SENT_JSON]
            start = at = at + len(sent)
    return loads(b"".join([*spliced, data[start:]]) if spliced else data)
