"""The proxy's two ASGI apps over one engine client and session store: the model API that harnesses (and so
sandboxed agents) reach, and the admin API for sessions, records, weight sync and metrics on a listener of its own."""

from __future__ import annotations

import asyncio
import functools
import gc
import gzip
import json
import logging
import secrets
import time
import zlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import anyio
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, Field, field_validator
from starlette.exceptions import HTTPException as StarletteHTTPException

from nemo_polar.proxy.admission import AdmissionState, Ticket
from nemo_polar.proxy.apis import ApiAdapter, get_adapter
from nemo_polar.proxy.conversation import Conversation, TemplateTraits, ToolCall
from nemo_polar.proxy.engine_client import EngineClient
from nemo_polar.proxy.errors import ProxyError, error_response, tools_unsupported
from nemo_polar.proxy.family_parser import FamilyStream, acquire_parser_worker, family_format, release_parser_worker
from nemo_polar.proxy.generation import KEEPALIVE, Generation, plan
from nemo_polar.proxy.metrics import MeteredAdmission, ProxyMetrics
from nemo_polar.proxy.output import StreamEmitter, new_id
from nemo_polar.proxy.parser import ParseEvent
from nemo_polar.proxy.records import Api, CallRecord, Mode
from nemo_polar.proxy.renderer import (
    EngineRenderer,
    Renderer,
    preload_tokenizers,
    probe_template,
    verified_local_renderer,
)
from nemo_polar.proxy.sessions import Session, SessionConfig, SessionCreated, SessionStore


def new_admin_token() -> str:
    """A random admin token. Prefixed, so it never starts with "-" (a bare token_urlsafe does, one time in 64, and
    `--proxy-admin-token <token>` then reads as an unknown option)."""
    return f"polar-admin-{secrets.token_urlsafe(24)}"


class ProxyConfig(BaseModel):
    engine_url: str
    default_mode: Mode = "continuation"
    record_dir: Path | None = None
    max_body_bytes: int = Field(default=32 * 1024 * 1024, ge=1024)
    keepalive_s: float = Field(default=5.0, gt=0, description="SSE keep-alive interval while the engine is silent")
    model_aliases: list[str] = Field(default_factory=list)
    eot_token: str | None = Field(
        default=None,
        description="the token that ends a turn; None: the one the model directory's polar-family.json names, "
        "else <|im_end|>",
    )
    admin_token: str = Field(
        default_factory=new_admin_token,
        min_length=8,
        description="bearer token of the admin API; random unless given (ProxyServer.admin_token, printed by the CLI)",
    )

    @field_validator("admin_token", mode="before")
    @classmethod
    def _random_unless_given(cls, value: Any) -> Any:
        return new_admin_token() if value is None else value

    tool_call_parser: str | None = Field(
        default=None,
        description="vLLM's name for the model's tool-call format; None: the one the model directory's "
        "polar-family.json names, else hermes/qwen3_coder (read in process)",
    )
    reasoning_parser: str | None = Field(default=None, description="likewise for reasoning")
    policy_version: int | None = Field(default=None, description="stamped on records until a resume changes it")
    render: Literal["auto", "engine"] = Field(
        default="auto", description="auto: render in-process when verified identical to the engine's /tokenize"
    )
    served_model: str | None = Field(
        default=None,
        description="the engine's model name when it serves no /v1/models (NeMo-RL's vLLM HTTP server); "
        "otherwise the engine's own model list is used",
    )
    freeze_heap: bool = Field(
        default=False,
        description="the proxy owns its process (`polar proxy`): freeze the start-up heap (settle_heap). Off where "
        "it runs inside another program, whose objects a freeze would keep from ever being collected",
    )


log = logging.getLogger(__name__)

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
GEMINI_VERSIONS = {"v1beta", "v1", "v1alpha"}
GEMINI_METHODS = {"generateContent", "streamGenerateContent", "countTokens"}


def _gemini_model(name: str, max_len: int | None) -> dict[str, Any]:
    """A Gemini API ``Model`` resource for a served name."""
    return {
        "name": f"models/{name}",  # as the Gemini adapter's model_field names it in records
        "baseModelId": name,
        "version": "1",
        "displayName": name,
        "inputTokenLimit": max_len or 0,
        "outputTokenLimit": max_len or 0,
        "supportedGenerationMethods": sorted(GEMINI_METHODS),
    }


class Proxy:
    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self.sessions = SessionStore(config.record_dir)
        self.engine = EngineClient(config.engine_url, eot_token=config.eot_token, served_model=config.served_model)
        self.renderer: Renderer = EngineRenderer(self.engine)
        self.admission = MeteredAdmission(config.policy_version)
        self.metrics = ProxyMetrics(self.admission, self.sessions)
        self._local_probe: asyncio.Task[None] | None = None
        self._traits: TemplateTraits | None = None
        # vLLM's own parsers, for formats not read in process: the process's worker, started on first use
        self.parser_worker = acquire_parser_worker()

    def current_renderer(self) -> Renderer:
        """The engine renders until an in-process renderer has been verified against it (in the background)."""
        if self.config.render == "auto" and self._local_probe is None:
            self._local_probe = asyncio.create_task(self._probe_local())
        return self.renderer

    async def template_traits(self) -> TemplateTraits:
        """Where the engine's chat template takes system messages: probed on the first call, then kept (the
        in-process renderer is adopted only when it renders exactly as the engine does)."""
        if self._traits is None:
            tool_parser = self.config.tool_call_parser or (await self.engine.info()).family.get("tool_call_parser")
            self._traits = await probe_template(self.current_renderer(), tool_parser)
        return self._traits

    async def family_stream(self, session: Session, conv: Conversation) -> Callable[[list[int]], FamilyStream] | None:
        """How a continuation's sample is parsed when vLLM's own parsers read the model's format (None: in process)."""
        if session.config.mode != "continuation":
            return None  # the engine's chat endpoint parses
        fmt = family_format(await self.engine.info(), self.config.tool_call_parser, self.config.reasoning_parser)
        if fmt is None:
            return None
        tools = conv.template_tools() if conv.tool_choice != "none" else None
        kwargs = session.config.chat_template_kwargs or None
        return functools.partial(self.parser_worker.stream, fmt, tools, chat_template_kwargs=kwargs)

    async def _probe_local(self) -> None:
        try:
            local = await verified_local_renderer(self.engine)
        except ProxyError:  # engine not reachable yet: try again on a later call
            self._local_probe = None
            return
        if local is not None:
            self.renderer = local
            if self.config.freeze_heap:
                settle_heap()  # the tokenizer's objects are long-lived too

    # -- auth and input -----------------------------------------------------------------------------
    def authenticate(self, request: Request) -> Session:
        auth = request.headers.get("authorization", "")
        key = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
        # Anthropic's header; Google's header, or its ``key`` query parameter
        key = key or request.headers.get("x-api-key") or request.headers.get("x-goog-api-key") or ""
        key = key or request.query_params.get("key", "")
        session = self.sessions.by_key(key) if key else None
        if session is None:
            raise ProxyError(
                401,
                "invalid API key: create a session with POST /polar/sessions and use its api_key",
                code="invalid_api_key",
            )
        return session

    async def read_body(self, request: Request) -> bytes:
        cap = self.config.max_body_bytes
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > cap:
            raise ProxyError(413, f"request body of {declared} bytes exceeds the proxy's limit of {cap} bytes")
        data = bytearray()
        async for chunk in request.stream():
            data += chunk
            if len(data) > cap:
                raise ProxyError(413, f"request body exceeds the proxy's limit of {cap} bytes")
        return bytes(data)

    def decode_body(self, raw: bytes, encoding: str) -> bytes:
        encoding = encoding.lower()
        if encoding in ("identity", ""):
            return raw
        if encoding not in ("gzip", "deflate"):
            raise ProxyError(
                415, f"unsupported Content-Encoding {encoding!r} (identity, gzip and deflate are accepted)"
            )
        try:
            data = gzip.decompress(raw) if encoding == "gzip" else zlib.decompress(raw)
        except (OSError, zlib.error) as exc:
            raise ProxyError(400, f"body is not valid {encoding}: {exc}") from None
        if len(data) > self.config.max_body_bytes:
            raise ProxyError(
                413, f"decompressed request body exceeds the proxy's limit of {self.config.max_body_bytes} bytes"
            )
        return data

    @staticmethod
    def parse_json(raw: bytes) -> Any:
        if not raw.strip():
            raise ProxyError(400, "request body is empty; expected a JSON object")
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ProxyError(400, f"request body is not valid JSON: {exc}") from None

    async def check_model(self, name: str, session: Session) -> None:
        info = await self.engine.info()
        allowed = {info.model, *self.config.model_aliases, *session.config.model_aliases}
        if name not in allowed:
            raise ProxyError(
                404,
                f"model {name!r} is not served here; use one of {sorted(allowed)}",
                code="model_not_found",
                param="model",
            )

    # -- model calls --------------------------------------------------------------------------------
    async def call(
        self, api: Api, request: Request, *, path_model: str | None = None, stream: bool | None = None
    ) -> Response:
        """One model call. Google's API names the model in the path (``path_model``: kept in the recorded body as
        its ``model`` field, and served whatever it names) and streams by its method (``stream``)."""
        adapter = get_adapter(api)
        try:
            session = self.authenticate(request)
        except ProxyError as err:
            self.metrics.rejected(api, err)
            return error_response(api, err)  # no session: nothing is created or recorded
        record = CallRecord(
            call_id=new_id("call-", 32),
            session_id=session.id,
            api=api,
            mode=session.config.mode,
            request=None,
            started_at=time.time(),
            policy_version=session.config.policy_version,
        )
        conv: Conversation | None = None
        ticket: Ticket | None = None
        try:
            raw = await self.read_body(request)
            record.request = raw.decode("utf-8", errors="replace")  # kept verbatim until it parses
            raw = self.decode_body(raw, request.headers.get("content-encoding", "identity"))
            record.request = raw.decode("utf-8", errors="replace")
            body = self.parse_json(raw)
            if path_model is not None and isinstance(body, dict) and adapter.model_field is not None:
                body = {**body, "model": adapter.model_field(path_model)}
            record.request = body
            conv = adapter.parse(body)
            if stream is not None:
                conv.stream = stream
            if path_model is None:  # a harness's side calls name the provider's own models: any is served
                await self.check_model(conv.model, session)
            session.restore(conv)
            record.reached("parsed")
            ticket = await self.admission.enter()  # waits while the trainer syncs weights
            record.reached("admitted")
            if session.config.policy_version is None:  # a session may pin it; otherwise the proxy's current one
                record.policy_version = ticket.version
            t0 = time.perf_counter()
            traits = await self.template_traits()
            if conv.tools and not traits.renders_tools:
                raise tools_unsupported(info=await self.engine.info())
            the_plan = await plan(self.engine, self.current_renderer(), session, conv, traits)
            record.render_s = time.perf_counter() - t0
            record.parent_call_id = the_plan.parent.record.call_id if the_plan.parent else None
            record.render_reason = the_plan.render_reason
            record.history = session.config.history if session.config.mode == "continuation" else None
            record.tokenize, record.template = the_plan.tokenize, the_plan.template
            record.system_messages = the_plan.system_messages
            record.sampling = the_plan.sampling
            record.prompt_token_ids = list(the_plan.prompt_token_ids)
            record.reached("rendered")
            family = await self.family_stream(session, conv)
            gen = Generation(self.engine, the_plan, conv, adapter.new_tool_call_id, family)
            if session.config.policy_version is None:  # the version it samples under: a resume may have come since
                record.policy_version = ticket.version
            ticket.sampled = lambda: len(gen.capture.sampled_token_ids)  # from here a weight update splits the call
            await gen.open()
            record.reached("engine_accepted")
        except Exception as exc:  # a ProxyError, or a bug: either way an API-shaped answer and a failed record
            err = exc if isinstance(exc, ProxyError) else _internal(exc)
            if ticket is not None:
                ticket.release()
            await self.fail(session, record, err)
            return error_response(api, err)
        if conv.stream:
            emitter = adapter.stream(conv, body)
            return StreamingResponse(
                self.stream(session, record, conv, gen, emitter, ticket),
                media_type="text/event-stream",
                headers=SSE_HEADERS,
            )
        return await self.collect(adapter, session, record, conv, gen, body, ticket)

    async def collect(
        self,
        adapter: ApiAdapter,
        session: Session,
        record: CallRecord,
        conv: Conversation,
        gen: Generation,
        body: Any,
        ticket: Ticket,
    ) -> Response:
        try:
            async for _ in gen.events():
                pass
            payload, echo = adapter.build_response(conv, gen.output, body)
            _complete(record, gen, ticket)
            await self.commit(session, record, conv, gen, echo)
            return JSONResponse(payload)
        except Exception as exc:
            err = exc if isinstance(exc, ProxyError) else _internal(exc)
            _capture(record, gen, ticket)
            await self.fail(session, record, err)
            return error_response(adapter.name, err)
        finally:
            await gen.close()
            ticket.release()

    async def stream(
        self,
        session: Session,
        record: CallRecord,
        conv: Conversation,
        gen: Generation,
        emitter: StreamEmitter,
        ticket: Ticket,
    ) -> AsyncIterator[str]:
        settled = False
        try:
            for frame in emitter.start():
                yield frame
            async for ev in gen.events(self.config.keepalive_s):
                if ev is KEEPALIVE:
                    if ping := emitter.keepalive():
                        yield ping
                    continue
                self.metrics.first_event(record)
                if isinstance(ev, ToolCall):
                    session.delivering.add(record.call_id)
                for frame in _emit(emitter, ev):
                    yield frame
            _complete(record, gen, ticket)
            await self.commit(session, record, conv, gen, emitter.echo_ids())  # durable before the final events
            settled = True
            for frame in emitter.finish(gen.output):
                yield frame
        except ProxyError as err:
            _capture(record, gen, ticket)
            await self.fail(session, record, err)
            settled = True
            for frame in emitter.error(err.message):
                yield frame
        except Exception as exc:  # a bug must still end the stream visibly and be recorded
            _capture(record, gen, ticket)
            err = _internal(exc)
            await self.fail(session, record, err)
            settled = True
            for frame in emitter.error(err.message):
                yield frame
        finally:
            if not settled:  # the harness went away mid-stream (cancellation): record synchronously
                _capture(record, gen, ticket)
                record.mark_failed("stream aborted before completion (client disconnected)", 499)
                session.commit(record, None, None, [])
                session.writer.append_sync(record)
                self.metrics.observe(record, "client_disconnected")
            with anyio.CancelScope(shield=True):
                await gen.close()
            ticket.release()

    async def commit(
        self, session: Session, record: CallRecord, conv: Conversation, gen: Generation, echo_ids: list[str]
    ) -> None:
        message = gen.output.as_message()
        record.output = message.recorded()
        await session.writer.append(record)
        session.commit(record, conv, message, echo_ids)
        self.metrics.observe(record)

    async def fail(self, session: Session, record: CallRecord, err: ProxyError) -> None:
        record.mark_failed(err.message, err.status, err.code)
        await session.writer.append(record)
        session.commit(record, None, None, [])
        self.metrics.observe(record, err.code)

    async def count_tokens(self, api: Api, request: Request, *, path_model: str | None = None) -> Response:
        adapter = get_adapter(api)
        assert adapter.parse_count is not None, f"{api} has no token-count request"
        try:
            session = self.authenticate(request)
            raw = self.decode_body(await self.read_body(request), request.headers.get("content-encoding", "identity"))
            body = self.parse_json(raw)
            if path_model is not None and isinstance(body, dict) and adapter.model_field is not None:
                body = {**body, "model": adapter.model_field(path_model)}
            conv = adapter.parse_count(body)
            kwargs = session.config.chat_template_kwargs  # counted as the session's calls are rendered
            messages = conv.template_messages(await self.template_traits())
            ids = await self.current_renderer().render(messages, conv.template_tools(), kwargs)
        except ProxyError as err:
            return error_response(api, err)
        return JSONResponse(adapter.count_response(len(ids)))


def _internal(exc: Exception) -> ProxyError:
    log.exception("proxy error", exc_info=exc)
    return ProxyError(500, f"proxy error: {exc!r}", code="proxy_error")


def settle_heap() -> None:
    """Move every object alive now (the imported modules, the tokenizer) out of the cyclic garbage collector's reach.
    A full collection traverses every tracked object and holds the GIL throughout: with transformers loaded that is
    ~100k objects and ~65 ms on an idle 2-core machine, a stall of the event loop and of every render. Frozen, the
    start-up heap is never traversed again; what calls allocate is collected as before. vLLM's API server freezes its
    start-up heap the same way (vllm 0.32, entrypoints/launchers/utils/server_utils.py: freeze_gc_heap). Process-wide,
    so only where the proxy owns its process (``ProxyConfig.freeze_heap``); the sessions alive when the local renderer
    is adopted (those of the first calls) are frozen with it, a bounded one-time cost."""
    gc.collect()
    gc.freeze()


async def _json_body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    try:
        data = json.loads(raw) if raw.strip() else {}
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ProxyError(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ProxyError(400, f"request body must be a JSON object, not {type(data).__name__}")
    return data


def _emit(emitter: StreamEmitter, ev: object) -> list[str]:
    if isinstance(ev, ToolCall):
        return emitter.tool_call(ev)
    assert isinstance(ev, ParseEvent)
    return emitter.reasoning(ev.text) if ev.kind == "reasoning" else emitter.text(ev.text)


def _capture(record: CallRecord, gen: Generation, ticket: Ticket) -> None:
    record.policy_version_changes = [c.model_dump() for c in ticket.changes]
    cap = gen.capture
    if cap.first_chunk_at is not None:
        record.reached("first_upstream", cap.first_chunk_at)
    record.prompt_token_ids = cap.prompt_token_ids or record.prompt_token_ids
    record.sampled_token_ids = list(cap.sampled_token_ids)
    record.sampled_logprobs = list(cap.sampled_logprobs)
    record.finish_reason = cap.finish_reason
    record.output_text = cap.text


def _complete(record: CallRecord, gen: Generation, ticket: Ticket) -> None:
    _capture(record, gen, ticket)
    record.finished_at = time.time()
    record.complete = True


@dataclass(frozen=True)
class ProxyApps:
    """The proxy's two ASGI apps over one :class:`Proxy`, served on separate listeners.

    ``model`` is the data plane: the provider APIs a harness calls with its session key, ``/v1/models`` and a bare
    ``/health``; it is the only listener a sandbox's relay ever forwards to, so nothing an agent sends can reach a
    control route. ``admin`` is the control plane: sessions and their records, weight sync (pause/resume), metrics
    and the full health state, every route behind the admin bearer token.
    """

    proxy: Proxy
    model: FastAPI
    admin: FastAPI


def create_apps(
    config: ProxyConfig, *, api_key: str | None = None, session_config: SessionConfig | None = None
) -> ProxyApps:
    """Build both apps; ``api_key`` pre-creates one session with that key (handy for running a CLI by hand)."""
    if config.render == "auto":
        preload_tokenizers()  # here, not lazily on the first call: see preload_tokenizers
    proxy = Proxy(config)
    if api_key:
        proxy.sessions.create(session_config or SessionConfig(mode=config.default_mode), api_key=api_key)
    return ProxyApps(proxy, _model_app(proxy), _admin_app(proxy))


def _handle_proxy_errors(app: FastAPI) -> None:
    @app.exception_handler(ProxyError)
    async def _proxy_error(_: Request, err: ProxyError) -> JSONResponse:
        return error_response("openai", err)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        # Unknown routes and wrong methods answer in the provider's error shape, like every other failure.
        return error_response("openai", ProxyError(exc.status_code, str(exc.detail)))


def _model_app(proxy: Proxy) -> FastAPI:
    config = proxy.config
    app = FastAPI(title="nemo_polar proxy: model API", openapi_url=None, docs_url=None, redoc_url=None)
    app.state.proxy = proxy
    _handle_proxy_errors(app)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok"}  # the sandbox's liveness probe; the state lives on the admin listener

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        info = await proxy.engine.info()
        names = [info.model, *config.model_aliases]
        if request.headers.get("anthropic-version"):
            data = [{"type": "model", "id": n, "display_name": n, "created_at": "1970-01-01T00:00:00Z"} for n in names]
            return {"data": data, "has_more": False, "first_id": names[0], "last_id": names[-1]}
        return {
            "object": "list",
            "data": [{"id": n, "object": "model", "created": 0, "owned_by": "nemo_polar"} for n in names],
        }

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await proxy.call("chat", request)

    @app.post("/v1/responses")
    async def create_response(request: Request) -> Response:
        return await proxy.call("responses", request)

    @app.get("/v1/responses")
    async def responses_websocket() -> Response:
        # Codex probes a WebSocket transport on GET; a 404 makes it fall back to HTTP POST.
        return error_response("openai", ProxyError(404, "WebSocket transport is not supported; use POST /v1/responses"))

    @app.post("/v1/messages")
    async def messages(request: Request) -> Response:
        return await proxy.call("anthropic", request)

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request) -> Response:
        return await proxy.count_tokens("anthropic", request)

    # Google's Gemini API: /{version}/models/{model}:{method}, the version as the SDK is configured (v1beta).
    @app.post("/{version}/models/{target}")
    async def gemini(version: str, target: str, request: Request) -> Response:
        model, _, method = target.partition(":")
        if version not in GEMINI_VERSIONS or method not in GEMINI_METHODS or not model:
            err = ProxyError(404, f"unknown method {target!r}; expected one of {sorted(GEMINI_METHODS)}")
            return error_response("gemini", err)
        if method == "countTokens":
            return await proxy.count_tokens("gemini", request, path_model=model)
        return await proxy.call("gemini", request, path_model=model, stream=method == "streamGenerateContent")

    @app.get("/{version}/models")
    async def gemini_models(version: str) -> Response:
        if version not in GEMINI_VERSIONS:
            return error_response("gemini", ProxyError(404, f"unknown API version {version!r}"))
        info = await proxy.engine.info()
        names = [info.model, *config.model_aliases]
        return JSONResponse({"models": [_gemini_model(n, info.max_model_len) for n in names]})

    @app.get("/{version}/models/{model}")
    async def gemini_model(version: str, model: str) -> Response:
        if version not in GEMINI_VERSIONS:
            return error_response("gemini", ProxyError(404, f"unknown API version {version!r}"))
        return JSONResponse(_gemini_model(model, (await proxy.engine.info()).max_model_len))

    return app


def _admin_app(proxy: Proxy) -> FastAPI:
    config = proxy.config

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if config.freeze_heap:
            settle_heap()
        watch = asyncio.create_task(proxy.metrics.watch_event_loop())  # the listeners share one loop
        yield
        watch.cancel()
        await proxy.engine.aclose()
        await asyncio.to_thread(release_parser_worker, proxy.parser_worker)

    def admin(request: Request) -> None:
        if not secrets.compare_digest(request.headers.get("authorization", ""), f"Bearer {config.admin_token}"):
            raise ProxyError(401, "the admin API requires the admin token (Authorization: Bearer <token>)")

    app = FastAPI(
        title="nemo_polar proxy: admin API", lifespan=lifespan, dependencies=[Depends(admin)], openapi_url=None
    )
    app.state.proxy = proxy
    _handle_proxy_errors(app)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "sessions": len(proxy.sessions), **proxy.admission.state().model_dump()}

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
