"""Async client for the vLLM OpenAI-compatible server the proxy sits in front of."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx

from nemo_polar.proxy.errors import ProxyError


@dataclass
class EngineInfo:
    model: str
    max_model_len: int | None
    eot_id: int | None


class EngineClient:
    def __init__(self, base_url: str, *, eot_token: str = "<|im_end|>", max_connections: int = 512) -> None:
        self.base_url = base_url.rstrip("/")
        self.eot_token = eot_token
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        # No read timeout: a long generation or a long prefill is normal; connect failures are fast.
        self.http = httpx.AsyncClient(base_url=self.base_url, limits=limits, timeout=httpx.Timeout(None, connect=5.0))
        self._info: EngineInfo | None = None
        self._info_lock = asyncio.Lock()

    async def aclose(self) -> None:
        await self.http.aclose()

    async def _post_json(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            resp = await self.http.post(path, json=body)
        except httpx.HTTPError as exc:
            raise ProxyError(502, f"engine unreachable at {self.base_url}: {exc!r}", code="engine_unreachable") from exc
        if resp.status_code != 200:
            raise engine_error(resp.status_code, resp.text)
        return resp.json()

    async def info(self) -> EngineInfo:
        async with self._info_lock:
            if self._info is None:
                try:
                    resp = await self.http.get("/v1/models")
                    resp.raise_for_status()
                except httpx.HTTPError as exc:
                    raise ProxyError(
                        502, f"engine unreachable at {self.base_url}: {exc!r}", code="engine_unreachable"
                    ) from exc
                card = resp.json()["data"][0]
                ids = (
                    await self._post_json(
                        "/tokenize", {"model": card["id"], "prompt": self.eot_token, "add_special_tokens": False}
                    )
                )["tokens"]
                self._info = EngineInfo(card["id"], card.get("max_model_len"), ids[0] if len(ids) == 1 else None)
            return self._info

    async def tokenize_chat(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, template_kwargs: dict[str, Any]
    ) -> list[int]:
        info = await self.info()
        body: dict[str, Any] = {"model": info.model, "messages": messages, "add_generation_prompt": True}
        if tools:
            body["tools"] = tools
        if template_kwargs:
            body["chat_template_kwargs"] = template_kwargs
        return (await self._post_json("/tokenize", body))["tokens"]

    async def open_stream(self, path: str, body: dict[str, Any]) -> httpx.Response:
        """POST a streaming request; returns the open response once the engine accepted it."""
        req = self.http.build_request("POST", path, json=body)
        try:
            resp = await self.http.send(req, stream=True)
        except httpx.HTTPError as exc:
            raise ProxyError(502, f"engine unreachable at {self.base_url}: {exc!r}", code="engine_unreachable") from exc
        if resp.status_code != 200:
            text = (await resp.aread()).decode(errors="replace")
            await resp.aclose()
            raise engine_error(resp.status_code, text)
        return resp


def engine_error(status: int, text: str) -> ProxyError:
    """Map an engine error to what the harness sees: client errors stay 4xx, engine faults become 502."""
    try:
        message = json.loads(text).get("error", {}).get("message") or text
    except (json.JSONDecodeError, AttributeError):
        message = text
    if 400 <= status < 500:
        code = "context_length_exceeded" if "context length" in message or "maximum context" in message else None
        return ProxyError(400 if status != 404 else 404, f"engine rejected the request: {message}", code=code)
    return ProxyError(502, f"engine error {status}: {message[:500]}", code="engine_error")


async def sse_data(resp: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """Yield the JSON ``data:`` payloads of an SSE response until ``[DONE]``."""
    async for line in resp.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        payload = json.loads(data)
        if isinstance(payload, dict) and "error" in payload and "choices" not in payload:
            err = payload["error"]
            raise ProxyError(
                502,
                f"engine error mid-stream: {err.get('message') if isinstance(err, dict) else err}",
                code="engine_error",
            )
        yield payload
    raise ProxyError(502, "engine stream ended without [DONE]", code="engine_stream_truncated")
