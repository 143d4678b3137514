"""Fault injection around the real engine and proxy: a forwarding HTTP point that fails chosen model calls.

Only what the real parts cannot be made to do on demand is faked: an engine answering 500 for one call, an engine
slow to end a stream (its finishing event held until the test releases it), a client connection dropping after
part of a stream, and an engine that ignores ``vllm_xargs`` (as vLLM does for a key no loaded logits processor
reads: what an engine started without nemo_polar's processor does, without starting a second engine). Everything
else is forwarded byte for byte.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import AsyncIterator, Iterable
from typing import Literal

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from nemo_polar.proxy.http.serve import BackgroundServer

ENGINE_CALLS = ("/v1/completions", "/v1/chat/completions")
# Google's API names the model and the method in the path: /v1beta/models/{model}:streamGenerateContent
CLIENT_CALLS = ("/v1/chat/completions", "/v1/responses", "/v1/messages", ":streamGenerateContent", ":generateContent")
HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "accept-encoding"}


class DroppedConnection(Exception):
    """Raised inside a streamed body: uvicorn closes the connection without ending the response."""


FaultKind = Literal["http_500", "hold_finish", "disconnect", "drop_xargs"]
FINISHED = re.compile(rb'"finish_reason":\s*"')


async def sse_events(resp: httpx.Response) -> AsyncIterator[bytes]:
    """The raw server-sent events of a stream, each with its blank-line terminator."""
    buffer = b""
    async for chunk in resp.aiter_raw():
        buffer += chunk
        while b"\n\n" in buffer:
            event, buffer = buffer.split(b"\n\n", 1)
            yield event + b"\n\n"
    if buffer:
        yield buffer


def fault_app(upstream: str, kind: FaultKind, calls: Iterable[int], paths: tuple[str, ...]):
    """Forward every request to ``upstream``; the model calls (POSTs to paths that end in one of ``paths``) numbered
    in ``calls`` fail."""
    app = FastAPI()
    client = httpx.AsyncClient(base_url=upstream, timeout=None)
    failing = set(calls)
    seen = {"calls": 0}
    lock = threading.Lock()
    app.state.faulted = []  # the call numbers that were failed, for the test to check
    app.state.release = threading.Event()  # hold_finish: set to let the held events through

    @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "DELETE", "HEAD"])
    async def forward(path: str, request: Request) -> Response:
        body = await request.body()
        url = "/" + path + (f"?{request.url.query}" if request.url.query else "")
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        index = None
        # The proxy's own probes (X-Polar-Probe: is the forced-tokens processor loaded?) are not model calls.
        if request.method == "POST" and ("/" + path).endswith(paths) and "x-polar-probe" not in request.headers:
            with lock:
                index, seen["calls"] = seen["calls"], seen["calls"] + 1
        if kind == "drop_xargs" and b"vllm_xargs" in body:  # every request, probes included: as such an engine does
            app.state.faulted.append(index)
            body = json.dumps({k: v for k, v in json.loads(body).items() if k != "vllm_xargs"}).encode()
            index = None  # forwarded as it now is
        if index in failing and kind == "http_500":
            app.state.faulted.append(index)
            return JSONResponse({"error": {"message": "injected engine fault", "type": "InternalServerError"}}, 500)
        upstream_req = client.build_request(request.method, url, content=body, headers=headers)
        resp = await client.send(upstream_req, stream=True)
        out_headers = {k: v for k, v in resp.headers.items() if k.lower() not in HOP_HEADERS}
        if index in failing and kind == "hold_finish":  # everything up to the first event that finishes the choice

            async def held() -> AsyncIterator[bytes]:
                try:
                    async for event in sse_events(resp):
                        if FINISHED.search(event) and index not in app.state.faulted:
                            app.state.faulted.append(index)
                            while not app.state.release.is_set():
                                await asyncio.sleep(0.01)
                        yield event
                finally:
                    await resp.aclose()

            return StreamingResponse(held(), status_code=resp.status_code, headers=out_headers)
        if index in failing:  # disconnect: the whole answer is consumed upstream, half of it reaches the client
            data = await resp.aread()
            await resp.aclose()
            app.state.faulted.append(index)

            async def cut() -> AsyncIterator[bytes]:
                yield data[: len(data) // 2]
                raise DroppedConnection(f"injected disconnect on call {index}")

            return StreamingResponse(cut(), status_code=resp.status_code, headers=out_headers)

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for chunk in resp.aiter_raw():
                    yield chunk
            finally:
                await resp.aclose()

        return StreamingResponse(relay(), status_code=resp.status_code, headers=out_headers)

    return app


class FaultPoint(BackgroundServer):
    """A fault point served on loopback: ``url`` replaces the upstream's URL for whoever should see the faults."""

    def __init__(self, upstream: str, kind: FaultKind, calls: Iterable[int]) -> None:
        self.app = fault_app(upstream, kind, calls, CLIENT_CALLS if kind == "disconnect" else ENGINE_CALLS)
        super().__init__(self.app)

    @property
    def faulted(self) -> list[int]:
        return list(self.app.state.faulted)

    def release(self) -> None:
        """hold_finish: let the held streams finish."""
        self.app.state.release.set()
