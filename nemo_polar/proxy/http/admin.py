"""The admin API, on a listener of its own behind the admin bearer token: sessions and their records, weight sync
(pause and resume), metrics and the full health state."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from nemo_polar.proxy.errors import ProxyError
from nemo_polar.proxy.http.admission import AdmissionState
from nemo_polar.proxy.http.pool import PoolError, PoolState, ProxyPool
from nemo_polar.proxy.http.proxy import Proxy, handle_proxy_errors, settle_heap
from nemo_polar.proxy.parse.family_parser import (
    release_parser_worker,
)
from nemo_polar.proxy.store.sessions import SessionConfig, SessionCreated


async def _json_body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    try:
        data = json.loads(raw) if raw.strip() else {}
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ProxyError(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ProxyError(400, f"request body must be a JSON object, not {type(data).__name__}")
    return data


def admin_token_check(token: str) -> Callable[[Request], None]:
    """The dependency every admin route has: the request carries ``token`` as its Bearer."""

    def admin(request: Request) -> None:
        if not secrets.compare_digest(request.headers.get("authorization", ""), f"Bearer {token}"):
            raise ProxyError(401, "the admin API requires the admin token (Authorization: Bearer <token>)")

    return admin


def pool_admin_app(pool: ProxyPool, token: str) -> FastAPI:
    """A pool's own admin listener (``polar proxy --workers``), behind the admin token: ``/metrics``, every worker's
    metrics as one scrape (:meth:`ProxyPool.metrics`), and ``/health``, the workers' admission states
    (:meth:`ProxyPool.health`; 503 naming a worker that does not answer)."""
    check = Depends(admin_token_check(token))
    app = FastAPI(title="nemo_polar proxy: pool API", dependencies=[check], openapi_url=None)
    handle_proxy_errors(app)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(await asyncio.to_thread(pool.metrics), media_type=CONTENT_TYPE_LATEST)

    @app.get("/health")
    async def health() -> PoolState:
        try:
            return await asyncio.to_thread(pool.health)
        except PoolError as exc:
            raise ProxyError(503, str(exc)) from None

    return app


def admin_app(proxy: Proxy) -> FastAPI:
    config = proxy.config

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if config.freeze_heap:
            settle_heap()
        async with proxy.periodic():
            yield
        await proxy.engine.aclose()
        await asyncio.to_thread(release_parser_worker, proxy.parser_worker)

    app = FastAPI(
        title="nemo_polar proxy: admin API",
        lifespan=lifespan,
        dependencies=[Depends(admin_token_check(config.admin_token))],
        openapi_url=None,
    )
    app.state.proxy = proxy
    handle_proxy_errors(app)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        state = proxy.admission.state().model_dump()
        return {"status": "ok", "sessions": len(proxy.sessions), "worker": config.worker, "pid": os.getpid(), **state}

    @app.get("/metrics")
    async def metrics() -> Response:
        """Prometheus text format (scrapers send the admin token as a Bearer)."""
        return Response(generate_latest(proxy.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/polar/pause")
    async def pause(request: Request) -> AdmissionState:
        """Stop admitting generations and wait up to ``timeout_s`` for in-flight ones (weight sync); with ``keep``
        (an engine that pauses and resumes them itself) wait for none: a resume that changes the version records
        the change in each call still in flight."""
        body = await _json_body(request)
        timeout, keep = body.get("timeout_s", 60.0), body.get("keep", False)
        if not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout < 0:
            raise ProxyError(400, "timeout_s must be a non-negative number")
        if not isinstance(keep, bool):
            raise ProxyError(400, "keep must be true or false")
        return await proxy.admission.pause(float(timeout), keep=keep)

    @app.post("/polar/resume")
    async def resume(request: Request) -> AdmissionState:
        """Admit generations again; ``policy_version`` (optional) is stamped on every record from now on."""
        version = (await _json_body(request)).get("policy_version")
        if version is not None and (not isinstance(version, int) or isinstance(version, bool)):
            raise ProxyError(400, "policy_version must be an integer")
        return proxy.admission.resume(version)

    @app.post("/polar/sessions")
    async def create_session(request: Request) -> SessionCreated:
        data = await _json_body(request)
        data.setdefault("mode", config.default_mode)
        try:
            cfg = SessionConfig.model_validate(data)
        except ValueError as exc:
            raise ProxyError(400, f"invalid session config: {exc}") from None
        session = proxy.sessions.create(cfg)
        return SessionCreated(session_id=session.id, api_key=session.api_key)

    @app.get("/polar/sessions/{session_id}/records")
    async def session_records(session_id: str) -> JSONResponse:
        records = await asyncio.to_thread(proxy.sessions.records, session_id)
        if records is None:
            raise ProxyError(404, f"no session {session_id!r}")
        return JSONResponse([r.model_dump(mode="json") for r in records])

    @app.delete("/polar/sessions/{session_id}")
    async def close_session(session_id: str) -> dict[str, Any]:
        session = await asyncio.to_thread(proxy.sessions.close, session_id)  # may read a closed one back from disk
        if session is None:
            raise ProxyError(404, f"no session {session_id!r}")
        return {"session_id": session_id, "closed": True, "records": len(session.records)}

    return app
