"""The provider APIs the proxy serves, by :data:`~nemo_polar.proxy.store.records.Api` name: the one registry through
which the proxy (``proxy/http/app.py``) and the offline export (``reconstruct/export.py``) parse requests and build
responses. Each API's module ends with its :class:`~nemo_polar.proxy.apis.adapter.ApiAdapter`; a new API is one line
here."""

from __future__ import annotations

from nemo_polar.proxy.apis import anthropic, chat, gemini, responses
from nemo_polar.proxy.apis.adapter import ApiAdapter
from nemo_polar.proxy.store.records import Api

ADAPTERS: dict[Api, ApiAdapter] = {
    adapter.name: adapter
    for adapter in (
        chat.ADAPTER,
        responses.ADAPTER,
        anthropic.ADAPTER,
        gemini.ADAPTER,
    )
}


# The ``api`` names of captured harness requests (one JSON object per request: harness, api, path, headers, body), as
# tests/fixtures/harness_requests and bench.families replay them.
CAPTURED_APIS: dict[str, Api] = {
    "chat-completions": "chat",
    "responses": "responses",
    "anthropic-messages": "anthropic",
    "gemini-generate-content": "gemini",
}


def get_adapter(api: Api) -> ApiAdapter:
    """The adapter of ``api``; a ``KeyError`` naming the known APIs for any other name."""
    if api not in ADAPTERS:
        raise KeyError(f"unknown API {api!r}; expected one of {', '.join(ADAPTERS)}")
    return ADAPTERS[api]


__all__ = ["ADAPTERS", "CAPTURED_APIS", "ApiAdapter", "get_adapter"]
