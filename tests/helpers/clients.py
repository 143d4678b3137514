"""One client per dialect, as each harness's own SDK talks to the proxy's model API: OpenAI (Chat Completions and
Responses), Anthropic Messages, Google's GenAI. No retries: a test sees the proxy's first answer."""

from __future__ import annotations

from typing import Any, Protocol

import anthropic
import openai


class Served(Protocol):
    url: str  # the proxy's model API


def openai_client(proxy: Served, api_key: str, **kw: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=api_key, max_retries=0, **kw)


def anthropic_client(proxy: Served, api_key: str, **kw: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.url, api_key=api_key, max_retries=0, **kw)


def gemini_client(proxy: Served, api_key: str) -> Any:
    from google import genai
    from google.genai import types

    return genai.Client(api_key=api_key, http_options=types.HttpOptions(base_url=proxy.url))
