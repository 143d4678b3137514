"""Async client for the vLLM OpenAI-compatible server the proxy sits in front of.

aiohttp (as NeMo Gym's servers use) rather than httpx: with hundreds of concurrent engine connections,
httpcore's pool bookkeeping costs milliseconds of CPU per request, which is the proxy's whole budget. The engine's
JSON (a continuation prompt is every id of the context, and vLLM echoes it back) is the fast kind: at a 64k-token
context the standard library spends ~9 ms writing and ~7 ms reading those lists per call, ``fastjson`` ~1 and ~2.5 ms.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from nemo_polar.engine.families import CHATML, THINK_CLOSE, THINK_OPEN, read_family_file, served_trait
from nemo_polar.proxy import fastjson
from nemo_polar.proxy.errors import ProxyError

# Errors raised when a pooled keep-alive connection was closed by the server just before reuse.
_STALE = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)


PROBE_HEADER = "X-Polar-Probe"


@dataclass
class EngineInfo:
    model: str
    max_model_len: int | None
    eot_id: int | None
    root: str | None = None  # the model directory the engine loaded
    think_ids: tuple[int, int] | None = None  # <think> and </think>, where each is one token of the vocabulary
    eot_text: str = CHATML.end_of_turn or ""  # the end-of-turn token's text (eot_id is its id, where it is one token)
    family: dict[str, Any] = field(default_factory=dict)  # the model directory's polar-family.json, if it is local


class EngineClient:
    def __init__(
        self,
        base_url: str,
        *,
        eot_token: str | None = None,
        max_connections: int = 1024,
        served_model: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.eot_token = eot_token
        self.served_model = served_model
        self.max_connections = max_connections
        self._http: aiohttp.ClientSession | None = None
        self._info: EngineInfo | None = None
        self._info_lock = asyncio.Lock()
        self.forcing_verified = False  # the engine holds requests to given ids (proxy.scripted.check_forcing)

    @property
    def http(self) -> aiohttp.ClientSession:
        if self._http is None:  # created lazily: an aiohttp session belongs to the running event loop
            # Idle connections are dropped before vLLM's server closes them (uvicorn: after 5 s). No read
            # timeout: long prefills and generations are normal; connection failures surface fast.
            connector = aiohttp.TCPConnector(limit=self.max_connections, keepalive_timeout=3.0)
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=5.0)
            self._http = aiohttp.ClientSession(connector=connector, timeout=timeout)
        return self._http

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    def _unreachable(self, exc: Exception) -> ProxyError:
        return ProxyError(502, f"engine unreachable at {self.base_url}: {exc!r}", code="engine_unreachable")

    async def _post(
        self, path: str, body: dict[str, Any], probe: str | None = None, raw: dict[str, bytes] | None = None
    ) -> aiohttp.ClientResponse:
        """POST, once more if a pooled connection turned out closed before any response arrived. ``probe`` marks a
        request the proxy makes for itself, not for a harness (``X-Polar-Probe``), so an engine-side observer can
        tell it from model calls. ``raw``: fields of the body already written as JSON (``fastjson.dumps_with``)."""
        data = fastjson.dumps_with(body, raw) if raw else fastjson.dumps(body)
        headers = {"Content-Type": "application/json", **({PROBE_HEADER: probe} if probe else {})}
        for attempt in range(2):
            try:
                return await self.http.post(self.base_url + path, data=data, headers=headers)
            except _STALE as exc:
                if attempt == 1:
                    raise self._unreachable(exc) from exc
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise self._unreachable(exc) from exc
        raise AssertionError("unreachable")

    async def post_json(
        self,
        path: str,
        body: dict[str, Any],
        probe: str | None = None,
        *,
        raw: dict[str, bytes] | None = None,
        echo: tuple[str, bytes] | None = None,
    ) -> dict[str, Any]:
        """The engine's JSON answer; ``echo`` (a field and the JSON sent for it) reads that field as
        ``fastjson.AS_SENT`` where the engine echoed it byte for byte (``fastjson.loads_echo``)."""
        resp = await self._post(path, body, probe, raw)
        try:
            data = await resp.read()
        except aiohttp.ClientError as exc:
            raise ProxyError(502, f"engine connection lost: {exc!r}", code="engine_error") from exc
        finally:
            resp.release()
        if resp.status != 200:
            raise engine_error(resp.status, data.decode("utf-8", errors="replace"))
        try:
            return fastjson.loads_echo(data, *echo) if echo else fastjson.loads(data)
        except ValueError:
            raise ProxyError(502, f"engine answered {path} with invalid JSON", code="engine_error") from None

    async def open_stream(
        self, path: str, body: dict[str, Any], raw: dict[str, bytes] | None = None
    ) -> aiohttp.ClientResponse:
        """POST a streaming request; returns the open response once the engine accepted it."""
        resp = await self._post(path, body, raw=raw)
        if resp.status != 200:
            try:
                text = await resp.text()
            finally:
                resp.release()
            raise engine_error(resp.status, text)
        return resp

    async def info(self) -> EngineInfo:
        async with self._info_lock:
            if self._info is None:
                try:
                    async with self.http.get(self.base_url + "/v1/models") as resp:
                        if resp.status == 404:  # NeMo-RL's vLLM HTTP server serves no model list
                            card = self._served_card()
                        else:
                            resp.raise_for_status()
                            card = (await resp.json())["data"][0]
                except (aiohttp.ClientError, TimeoutError) as exc:
                    raise self._unreachable(exc) from exc
                root = card.get("root")
                family = read_family_file(Path(root)) if root and Path(root).is_dir() else {}
                # Given, else the family's (None: it has no such token), else ChatML's.
                eot_text = self.eot_token or served_trait(family, "end_of_turn")
                eot_id = await self._single_token(card["id"], eot_text) if eot_text else None
                think = [await self._single_token(card["id"], tag) for tag in (THINK_OPEN, THINK_CLOSE)]
                think_ids = (think[0], think[1]) if None not in think else None
                self._info = EngineInfo(
                    card["id"], card.get("max_model_len"), eot_id, root, think_ids, eot_text or "", family
                )
            return self._info

    async def detokenize(self, ids: list[int]) -> str:
        info = await self.info()
        return str((await self.post_json("/detokenize", {"model": info.model, "tokens": ids}))["prompt"])

    async def _single_token(self, model: str, text: str) -> int | None:
        ids = await self.post_json("/tokenize", {"model": model, "prompt": text, "add_special_tokens": False})
        return ids["tokens"][0] if len(ids["tokens"]) == 1 else None

    def _served_card(self) -> dict[str, Any]:
        if self.served_model is None:
            raise ProxyError(
                502,
                f"the engine at {self.base_url} has no /v1/models; set the proxy's served_model to the name it serves",
                code="engine_unreachable",
            )
        return {"id": self.served_model}

    async def model_root(self) -> str | None:
        return (await self.info()).root

    async def tokenize_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        template_kwargs: dict[str, Any],
        *,
        generation_prompt: bool = True,
    ) -> list[int]:
        info = await self.info()
        body: dict[str, Any] = {"model": info.model, "messages": messages, "add_generation_prompt": generation_prompt}
        if tools:
            body["tools"] = tools
        if template_kwargs:
            body["chat_template_kwargs"] = template_kwargs
        return (await self.post_json("/tokenize", body))["tokens"]


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


async def sse_data(
    resp: aiohttp.ClientResponse, echo: tuple[str, bytes] | None = None
) -> AsyncIterator[dict[str, Any]]:
    """Yield the JSON ``data:`` payloads of an SSE response until ``[DONE]`` (``echo``: as in ``post_json``)."""
    try:
        async for raw in resp.content:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                return
            payload = fastjson.loads_echo(data, *echo) if echo else fastjson.loads(data)
            if isinstance(payload, dict) and "error" in payload and "choices" not in payload:
                err = payload["error"]
                detail = err.get("message") if isinstance(err, dict) else err
                raise ProxyError(502, f"engine error mid-stream: {detail}", code="engine_error")
            yield payload
    except aiohttp.ClientError as exc:
        raise ProxyError(502, f"engine connection lost mid-stream: {exc!r}", code="engine_error") from exc
    raise ProxyError(502, "engine stream ended without [DONE]", code="engine_stream_truncated")
