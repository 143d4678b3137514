"""A request's text as records store it (``request_text``: the standard library's compact ASCII JSON, which every
reader re-creates), written from the text of the request before it where the two share their fields' JSON.

A harness resends its whole history on every call. Writing the text afresh costs the standard library's encoder a
pass over the whole history (~2 ms at a 64k-token context). Here a list field that starts with the earlier request's
items, as the same objects (``BodyMemo`` reuses them), takes that text up to the end of the last of them and writes
only the items after; otherwise a field's value is written by orjson (~10x faster) only to be compared: one whose JSON
is the same bytes as the earlier request's takes its text as it was, a list whose JSON extends the earlier one's
(``json_list_extends``: the same items first) takes that text and writes only the items added. The text is the
standard library's, character for character: a JSON object's compact text is its fields' texts joined, a list's its
items'."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from nemo_polar.proxy import fastjson
from nemo_polar.proxy.render.prefix import same_objects
from nemo_polar.proxy.store.memos import json_list_extends


def request_text(request: Any) -> str:
    """One canonical JSON text of a request (ASCII: escapes survive any encoding)."""
    return json.dumps(request, separators=(",", ":"))


@dataclass
class _Field:
    """One top-level field of a written request: its value, the value's text and, for a list, where each item's text
    ends in it; its JSON as ``fastjson`` writes it once a later request's is compared with it."""

    value: Any
    text: str
    ends: list[int] | None = None
    data: bytes | None = None

    def json(self) -> bytes:
        if self.data is None:
            self.data = fastjson.dumps(self.value)
        return self.data


@dataclass
class WrittenText:
    """A request's text, and its top-level fields (what the next request's text is written from)."""

    text: str
    fields: dict[str, _Field] = field(default_factory=dict)


def _list_text(value: list[Any], seen: _Field | None = None, shared: int = 0) -> _Field:
    """A list's text: ``seen``'s (a list's field) up to the end of its first ``shared`` items, then the rest of
    ``value``'s items written."""
    ends = seen.ends[:shared] if seen is not None and seen.ends is not None else []
    head = seen.text[: ends[-1]] if ends and seen is not None else "["
    parts, at = [head], len(head)
    for item in value[len(ends) :]:
        part = ("," if ends else "") + request_text(item)
        parts.append(part)
        at += len(part)
        ends.append(at)
    return _Field(value, "".join(parts) + "]", ends)


def _field_text(value: Any, seen: _Field | None) -> _Field:
    """A field's text, from ``seen`` (the request before's field of that name) where they agree: a list that starts
    with the same item objects (``BodyMemo`` hands them back) or whose JSON extends that one's takes its text up to
    there, a value of the same JSON takes its text whole."""
    if seen is not None and isinstance(value, list) and isinstance(seen.value, list) and seen.ends is not None:
        shared = same_objects(value, seen.value)
        data = None
        if not shared and json_list_extends(data := fastjson.dumps(value), seen.json()):
            shared = len(seen.value)
        if shared == len(seen.value) == len(value):
            return _Field(value, seen.text, seen.ends, data or seen.data)
        return _list_text(value, seen, shared)
    if isinstance(value, list):
        return _list_text(value)
    data = fastjson.dumps(value)
    return _Field(value, seen.text if seen is not None and data == seen.json() else request_text(value), data=data)


def written_text(request: Any, before: WrittenText | None = None) -> WrittenText:
    """``request``'s ``request_text``, reusing ``before`` (an earlier request's) where their fields agree."""
    if not isinstance(request, dict) or not all(isinstance(k, str) for k in request):
        return WrittenText(request_text(request))
    fields = {key: _field_text(value, before.fields.get(key) if before else None) for key, value in request.items()}
    text = "{" + ",".join(request_text(key) + ":" + fields[key].text for key in request) + "}"
    return WrittenText(text, fields)
