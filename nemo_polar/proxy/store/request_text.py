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

import hashlib
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
    same: int = 0  # how many of the text's first characters are the earlier field's, known from what was reused

    def json(self) -> bytes:
        if self.data is None:
            self.data = fastjson.dumps(self.value)
        return self.data


@dataclass
class WrittenText:
    """A request's text, and its top-level fields (what the next request's text is written from). ``same``: how many
    of the text's first characters are the earlier request's, known from the fields it reused (nothing compared);
    ``item_ends``: where each list field's items end in the text, where its digest's running hash is kept for the
    next request's (a harness's history list, extended, is hashed on from there)."""

    text: str
    fields: dict[str, _Field] = field(default_factory=dict)
    same: int = 0
    item_ends: list[int] = field(default_factory=list)
    _marks: list[tuple[int, Any]] = field(default_factory=list)  # (n, sha256 of text[:n]) at some of item_ends

    def digest(self, before: WrittenText | None) -> str:
        """The sha256 of the text's UTF-8 bytes (hex), hashed on from ``before``'s running hash at the last of its
        marks within the part of the text that is ``before``'s: the work is what was added."""
        kept = [mark for mark in before._marks if mark[0] <= self.same] if before is not None else []
        at, head = kept[-1] if kept else (0, hashlib.sha256())
        head = head.copy()  # a kept state is never updated: the next request may go on from it too
        self._marks = kept
        for end in self.item_ends:
            if end > at:
                head.update(self.text[at:end].encode())
                self._marks.append((end, head.copy()))
                at = end
        head.update(self.text[at:].encode())
        return head.hexdigest()


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
    return _Field(value, "".join(parts) + "]", ends, same=len(head) if seen is not None else 0)


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
            return _Field(value, seen.text, seen.ends, data or seen.data, len(seen.text))
        return _list_text(value, seen, shared)
    if isinstance(value, list):
        return _list_text(value)
    data = fastjson.dumps(value)
    if seen is not None and data == seen.json():
        return _Field(value, seen.text, data=data, same=len(seen.text))
    return _Field(value, request_text(value), data=data)


def written_text(request: Any, before: WrittenText | None = None) -> WrittenText:
    """``request``'s ``request_text``, reusing ``before`` (an earlier request's) where their fields agree."""
    if not isinstance(request, dict) or not all(isinstance(k, str) for k in request):
        return WrittenText(request_text(request))
    fields = {key: _field_text(value, before.fields.get(key) if before else None) for key, value in request.items()}
    parts, item_ends = [], []  # each field's "key:value" text; where each list field's items end
    at, same, agreeing = 1, 0, before is not None  # after the "{"
    prior = iter(before.fields if before is not None else ())
    for key, f in fields.items():
        head = request_text(key) + ":"
        start = at + len(head)
        if agreeing and next(prior, None) == key:  # the same key in the same place: its value's same part too
            same = start + f.same
            agreeing = f.same == len(f.text) == len(before.fields[key].text)  # type: ignore[union-attr]
        else:
            agreeing = False
        if f.ends:
            item_ends.append(start + f.ends[-1])
        parts.append(head + f.text)
        at += len(head) + len(f.text) + 1  # the "," after it
    return WrittenText("{" + ",".join(parts) + "}", fields, same, item_ends)
