"""A request's text as records store it (``request_text``: the standard library's compact ASCII JSON, which every
reader re-creates), written from the text of the request before it where the two share their fields' JSON.

A harness resends its whole history on every call. Writing the text afresh costs the standard library's encoder a
pass over the whole history (~2 ms at a 64k-token context); here each top-level field's value is written by orjson
too (~10x faster) only to be compared: a field whose JSON is the same bytes as the earlier request's takes its text
as it was, a list whose JSON extends the earlier one's (``json_list_extends``: the same items first) takes that text
and writes only the items added. The text is the standard library's, character for character: a JSON object's
compact text is its fields' texts joined, a list's its items'."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from nemo_polar.proxy import fastjson
from nemo_polar.proxy.conversation import json_list_extends


def request_text(request: Any) -> str:
    """One canonical JSON text of a request (ASCII: escapes survive any encoding)."""
    return json.dumps(request, separators=(",", ":"))


@dataclass
class WrittenText:
    """A request's text, and for each top-level field its value's JSON as ``fastjson`` writes it (what the next
    request's is compared with), its text and, for a list, its length."""

    text: str
    fields: dict[str, tuple[bytes, str, int]] = field(default_factory=dict)


def written_text(request: Any, before: WrittenText | None = None) -> WrittenText:
    """``request``'s ``request_text``, reusing ``before`` (an earlier request's) where their fields' JSON agrees."""
    if not isinstance(request, dict) or not all(isinstance(k, str) for k in request):
        return WrittenText(request_text(request))
    fields: dict[str, tuple[bytes, str, int]] = {}
    for key, value in request.items():
        data = fastjson.dumps(value)
        seen = before.fields.get(key) if before is not None else None
        if seen is not None and data == seen[0]:
            text = seen[1]
        elif seen is not None and isinstance(value, list) and seen[2] and json_list_extends(data, seen[0]):
            text = seen[1][:-1] + "".join("," + request_text(item) for item in value[seen[2] :]) + "]"
        else:
            text = request_text(value)
        fields[key] = (data, text, len(value) if isinstance(value, list) else 0)
    text = "{" + ",".join(request_text(key) + ":" + fields[key][1] for key in request) + "}"
    return WrittenText(text, fields)
