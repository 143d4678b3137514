"""One client per dialect, as each harness's own SDK talks to the proxy's model API: OpenAI (Chat Completions and
Responses), Anthropic Messages, Google's GenAI. No retries: a test sees the proxy's first answer.

Every new httpx client (httpx's top-level ``get``/``post`` make one per call, and so does each SDK client) loads the CA
bundle into an SSL context: ~50 ms of CPU, thousands of times a run. The tests' clients share one context, and
``loopback`` stands in for httpx's top-level functions (a connection of its own per call, as they open)."""

from __future__ import annotations

from typing import Any, Protocol

import anthropic
import httpx
import openai

TLS = httpx.create_ssl_context()
# httpx's default 5 s read timeout is a wall-clock race on a loaded 2-core machine (a proxied call that prefills a
# prompt took longer in make test-full); a call that must be quick says so with its own timeout.
loopback = httpx.Client(verify=TLS, limits=httpx.Limits(max_keepalive_connections=0), timeout=120)


class Served(Protocol):
    url: str  # the proxy's model API


def openai_client(proxy: Served, api_key: str, **kw: Any) -> openai.OpenAI:
    kw.setdefault("http_client", openai.DefaultHttpxClient(verify=TLS))
    return openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=api_key, max_retries=0, **kw)


def anthropic_client(proxy: Served, api_key: str, **kw: Any) -> anthropic.Anthropic:
    kw.setdefault("http_client", anthropic.DefaultHttpxClient(verify=TLS))
    return anthropic.Anthropic(base_url=proxy.url, api_key=api_key, max_retries=0, **kw)


def gemini_client(proxy: Served, api_key: str) -> Any:
    from google import genai
    from google.genai import types

    return genai.Client(api_key=api_key, http_options=types.HttpOptions(base_url=proxy.url))
