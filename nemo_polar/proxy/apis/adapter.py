"""The interface a provider API implements: one :class:`ApiAdapter` per API, defined at the end of its module
(``chat.py``, ``responses.py``, ``anthropic.py``) and listed in :data:`nemo_polar.proxy.apis.ADAPTERS`.

A new provider API is one module that ends with its ``ADAPTER``, one line in that registry, its name in the ``Api``
literal (``proxy/store/records.py``) and its route in ``proxy/http/app.py``; the proxy and the offline export reach
every API only through the registry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nemo_polar.proxy.conversation import Conversation
from nemo_polar.proxy.parse.output import Output, StreamEmitter
from nemo_polar.proxy.store.memos import ParseMemos
from nemo_polar.proxy.store.records import Api


@dataclass(frozen=True)
class ApiAdapter:
    name: Api
    parse: Callable[[Any], Conversation]
    """The request body (parsed JSON) as a normalised conversation; a :class:`ProxyError` 400 if it is malformed."""
    build_response: Callable[[Conversation, Output, Any], tuple[dict[str, Any], list[str]]]
    """Non-streaming: ``(conversation, output, request body) -> (response payload, echo ids)``; the echo ids are the
    ids the response carries that a harness sends back to name this turn (beyond its tool-call ids)."""
    stream: Callable[[Conversation, Any], StreamEmitter]
    """Streaming: ``(conversation, request body) -> the emitter`` of this API's SSE frames for one response."""
    new_tool_call_id: Callable[[], str]
    """A fresh id, in this API's format, for a tool call the model made."""
    parse_reusing: Callable[[Any, ParseMemos], Conversation] | None = None
    """``parse``, reusing what a session's earlier requests parsed into (its ``ParseMemos``): the same conversation,
    parsing only the items a harness added to its history."""
    parse_count: Callable[[Any], Conversation] | None = None
    """The body of this API's token-count request (``/v1/messages/count_tokens``, ``:countTokens``), if it has one."""
    count_response: Callable[[int], dict[str, Any]] = lambda n: {"input_tokens": n}
    """The token-count response for ``n`` prompt tokens."""
    history_field: str | None = None
    """The request body's field holding the history a harness resends on every call (read as what it adds:
    ``BodyMemo``)."""
    model_field: Callable[[str], str] | None = None
    """For an API that names the model in the URL path (Google's): the body's ``model`` field for that name."""
