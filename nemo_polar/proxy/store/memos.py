"""What a session's recent requests parsed into, for the next to reuse: their bodies' JSON (``BodyMemo``) and their
history items' meaning (``PrefixMemo``).

A harness resends its whole history on every call: at a 64k-token context the body is ~360 KB, and parsing it whole
costs the proxy ~1 ms a call, growing with the context. But a body shares its first bytes with the last one
(the same fields, then the same history items up to where the new ones start), and JSON is read without looking
ahead: bytes that are the same from the start parse into the same values. So where a kept body's history list
(``messages``, ``input``, ``contents``) had its first items inside the bytes the new body starts with, those items
are the kept ones, and only the rest of the body is parsed: the new body with those items cut out of its list.

The cut is where the kept body's items ended, found once per item by a scan of the JSON's structure (its strings
skipped by a regular expression, in C). The cut body's list starts with a marker (a string with a nonce per process,
as :data:`nemo_polar.proxy.fastjson.AS_SENT`); finding it first in the parsed list proves that this list, and no
other (a duplicate key, another list of the same name), is the one cut. Anything else parses whole.

The reused items are the same objects as the kept body's: a session's records share them rather than hold a copy of
the history per call, and what reads the history next (``PrefixMemo``, the record's request text) knows them by
identity. Nothing changes a parsed body in place.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from nemo_polar.proxy import fastjson
from nemo_polar.proxy.render.prefix import common_prefix, same_objects

# A JSON string (escapes included), or one of the characters that open, close or separate values.
_TOKENS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{},]', re.DOTALL)
_QUOTE, _COMMA, _OPEN_OBJECT = ord('"'), ord(","), ord("{")
_OPENS, _CLOSES = frozenset(b"[{"), frozenset(b"]}")
_WHITESPACE = b" \t\r\n"
_SPACE = re.compile(rb"[ \t\r\n]*")
_MARK = fastjson.AS_SENT
_MARK_JSON = fastjson.dumps(_MARK)


@dataclass
class _Kept:
    data: bytes  # the body as it came
    start: int  # where its history list's "[" stands
    ends: list[int]  # for each item of the list, where the "," after it (the last one: the list's "]") stands
    items: list[Any]  # the list as parsed


def _ends(data: bytes, start: int) -> list[int] | None:
    """For the list whose "[" is at ``start``, or the rest of it after the "," at ``start``: where each item's "," or
    the list's "]" stands (nothing for an empty list), or None where the bytes end first."""
    ends, depth = [], 0
    for m in _TOKENS.finditer(data, start + 1):
        at = m.start()
        c = data[at]
        if c == _QUOTE:
            continue
        if c in _OPENS:
            depth += 1
        elif c in _CLOSES:
            if depth == 0:  # the list's "]"
                if ends or data[start + 1 : at].strip(_WHITESPACE):
                    ends.append(at)
                return ends
            depth -= 1
        elif depth == 0:
            ends.append(at)
    return None


def _list_start(data: bytes, key: str) -> int | None:
    """Where the "[" of the body's first top-level ``key`` stands, if that key's value is a list."""
    depth, key_next = 0, False
    for m in _TOKENS.finditer(data):
        at = m.start()
        c = data[at]
        if c == _QUOTE:
            if key_next and depth == 1:
                key_next = False
                if fastjson.loads(m.group()) == key:  # a key's escapes decoded, as a parser reads it
                    colon = data.index(b":", m.end())
                    value = len(data) - len(data[colon + 1 :].lstrip(_WHITESPACE))
                    return value if data[value : value + 1] == b"[" else None
            continue
        if c in _OPENS:
            depth += 1
            key_next = c == _OPEN_OBJECT and depth == 1
        elif c in _CLOSES:
            depth -= 1
        elif depth == 1:  # a "," between the top-level object's fields
            key_next = True
    return None


class BodyMemo:
    """The last few bodies of a session's calls to one API (``key``: its history list's field) and what they parsed
    into. A few: a harness's side calls (a title, a summary) carry histories of their own between its main calls."""

    def __init__(self, key: str, size: int = 4) -> None:
        self.key = key
        self.size = size
        self._kept: list[_Kept] = []  # latest last
        self.reused = 0  # items taken from a kept body rather than parsed, over the memo's life

    def loads(self, data: bytes) -> Any:
        """``data`` parsed (:func:`nemo_polar.proxy.fastjson.loads`: its errors, its values), reusing the items of a
        kept body whose bytes ``data`` starts with."""
        best, shared = None, 0
        for kept in self._kept:
            n = bisect.bisect_right(kept.ends, common_prefix(kept.data, data))  # items that end in the shared bytes
            if n > shared:
                best, shared = kept, n
        if best is not None and (body := self._cut(data, best, shared)) is not None:
            return body
        body = fastjson.loads(data)
        items = body.get(self.key) if isinstance(body, dict) else None
        start = _list_start(data, self.key) if isinstance(items, list) and items else None
        if start is not None:
            self._keep(None, _Kept(data, start, _ends(data, start) or [], items))  # type: ignore[arg-type]
        return body

    def _cut(self, data: bytes, kept: _Kept, shared: int) -> Any:
        """``data`` parsed with ``kept``'s first ``shared`` items cut out of its list and reused, or None where the
        cut body does not read as that (the whole body is then parsed). The last shared item's bytes end where the
        kept body's "," or "]" stood; what follows it here may differ (the kept body's last item is followed by "]",
        this one's by ","), and a number that goes on there does not parse after the marker."""
        cut = kept.ends[shared - 1]
        try:
            body = fastjson.loads(data[: kept.start + 1] + _MARK_JSON + data[cut:])
        except ValueError:
            return None
        rest = body.get(self.key) if isinstance(body, dict) else None
        if not isinstance(rest, list) or not rest or rest[0] != _MARK:
            return None
        items = body[self.key] = kept.items[:shared] + rest[1:]
        self.reused += shared
        sep = _SPACE.match(data, cut).end()  # type: ignore[union-attr]  # the "," or "]" after the last shared item
        more = _ends(data, sep) if data[sep] == _COMMA else []
        if more is not None:
            self._keep(kept, _Kept(data, kept.start, [*kept.ends[: shared - 1], sep, *more], items))
        return body

    def _keep(self, replaced: _Kept | None, new: _Kept) -> None:
        if len(new.ends) != len(new.items):  # the scan and the parser disagree: never cut this body
            return
        self._kept = _latest([k for k in self._kept if k is not replaced], new, self.size)


T = TypeVar("T")
K = TypeVar("K")


def _latest(others: list[K], new: K, size: int) -> list[K]:
    """The ``size - 1`` latest of ``others``, then ``new``."""
    return [*others[max(0, len(others) - size + 1) :], new]


@dataclass
class _Parsed(Generic[T]):
    items: list[Any]  # the item list as parsed from JSON
    results: list[T | None]  # one per item
    data: bytes | None = None  # the items' JSON, written when first compared


class PrefixMemo(Generic[T]):
    """What a session's recent requests' item lists (messages, tools) parsed into. A harness resends its whole
    history on every call: a list that starts with the items of one parsed before parses only the items after those,
    reusing the results before them. The same items are the same objects where ``BodyMemo`` reused them (compared by
    identity, in C), else the same JSON (the lists written and compared as bytes: exact, and no walk over the items
    in Python). A few lists are kept: a harness's side calls (a title, a summary) carry histories of their own
    between its main calls."""

    def __init__(self, size: int = 4) -> None:
        self.size = size
        self._kept: list[_Parsed[T]] = []  # latest last

    def parse(self, items: list[Any], one: Callable[[Any, int], T | None]) -> list[T]:
        """``one(item, index)`` for each item (None: the item gives nothing), reusing the results of a list seen
        before whose items this list starts with; what ``one`` raises is raised, and nothing is kept."""
        best, shared = None, 0
        for kept in self._kept:
            if (n := same_objects(items, kept.items)) > shared:
                best, shared = kept, n
        if best is None and self._kept:
            data = fastjson.dumps(items)
            for kept in self._kept:
                if kept.data is None:
                    kept.data = fastjson.dumps(kept.items)
                if len(kept.items) > shared and json_list_extends(data, kept.data):
                    best, shared = kept, len(kept.items)
        reused = best.results[:shared] if best is not None else []
        results = [*reused, *(one(item, i) for i, item in enumerate(items[shared:], shared))]
        self._kept = _latest([k for k in self._kept if k is not best], _Parsed(items, results), self.size)
        return [r for r in results if r is not None]


class ParseMemos(dict[str, PrefixMemo[Any]]):
    """A session's ``PrefixMemo`` by what they hold (an API's messages, its tools), each made on first use."""

    def __missing__(self, key: str) -> PrefixMemo[Any]:
        memo = self[key] = PrefixMemo()
        return memo


def json_list_extends(data: bytes, seen: bytes) -> bool:
    """The JSON list ``data`` starts with the items of the JSON list ``seen``: JSON is read without looking ahead,
    so the same bytes up to a comma or the end are the same items."""
    if len(seen) <= 2:  # "[]": nothing to reuse
        return False
    return data == seen or (data.startswith(memoryview(seen)[:-1]) and data[len(seen) - 1 : len(seen)] == b",")
