"""One model call from request to record: the :class:`Proxy` authenticates the session, reads the provider's
request, plans and runs the generation (streamed or whole), and commits the record."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import functools
import gc
import gzip
import logging
import time
import zlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from nemo_polar.engine.families import served_trait
from nemo_polar.proxy import fastjson
from nemo_polar.proxy.apis import ApiAdapter, get_adapter
from nemo_polar.proxy.conversation import Conversation, TemplateTraits, ToolCall
from nemo_polar.proxy.engine_client import EngineClient
from nemo_polar.proxy.errors import ProxyError, error_response, tools_unsupported
from nemo_polar.proxy.generate.generation import KEEPALIVE, Generation, plan
from nemo_polar.proxy.http.admission import Ticket
from nemo_polar.proxy.http.config import ProxyConfig
from nemo_polar.proxy.http.metrics import MeteredAdmission, ProxyMetrics
from nemo_polar.proxy.parse.family_parser import (
    FamilyStream,
    acquire_parser_worker,
    family_format,
)
from nemo_polar.proxy.parse.output import StreamEmitter, new_id
from nemo_polar.proxy.parse.parser import ParseEvent
from nemo_polar.proxy.render.renderer import (
    EngineRenderer,
    Renderer,
    probe_template,
    verified_local_renderer,
)
from nemo_polar.proxy.store.memos import BodyMemo
from nemo_polar.proxy.store.records import Api, CallRecord
from nemo_polar.proxy.store.sessions import Session, SessionStore

log = logging.getLogger(__name__)

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class Proxy:
    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self.sessions = SessionStore(
            config.record_dir, worker=config.worker, lines_in_thread=config.uses_helper_threads()
        )
        self.engine = EngineClient(config.engine_url, eot_token=config.eot_token, served_model=config.served_model)
        self.renderer: Renderer = EngineRenderer(self.engine)
        self.admission = MeteredAdmission(config.policy_version)
        self.metrics = ProxyMetrics(self.admission, self.sessions)
        self._local_probe: asyncio.Task[None] | None = None
        self._traits: TemplateTraits | None = None
        # vLLM's own parsers, for formats not read in process: the process's worker, started on first use
        self.parser_worker = acquire_parser_worker()

    @contextlib.asynccontextmanager
    async def periodic(self) -> AsyncIterator[None]:
        """The proxy's periodic work while it serves: the event loop's lag watched (the listeners share one loop),
        the allocator's free memory returned every ``trim_heap_s``."""
        tasks = [asyncio.create_task(self.metrics.watch_event_loop())]
        if self.config.trim_heap_s:
            tasks.append(asyncio.create_task(trim_heap(self.config.trim_heap_s)))
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()

    def current_renderer(self) -> Renderer:
        """The engine renders until an in-process renderer has been verified against it (in the background)."""
        if self.config.render == "auto" and self._local_probe is None:
            self._local_probe = asyncio.create_task(self._probe_local())
        return self.renderer

    async def template_traits(self) -> TemplateTraits:
        """Where the engine's chat template takes system messages: probed on the first call, then kept (the
        in-process renderer is adopted only when it renders exactly as the engine does)."""
        if self._traits is None:
            family = (await self.engine.info()).family
            tool_parser = self.config.tool_call_parser or served_trait(family, "tool_call_parser")
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
            local.appends_in_thread = self.config.uses_helper_threads()
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
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > cap:
                raise ProxyError(413, f"request body exceeds the proxy's limit of {cap} bytes")
            if chunk:  # the stream ends with an empty one
                chunks.append(chunk)
        return b"".join(chunks)  # one copy of a body that came in parts, none of one that came whole

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
    def parse_json(raw: bytes, memo: BodyMemo | None = None) -> Any:
        """The body parsed (by ``memo``, reusing what a session's recent bodies parsed into, where given)."""
        if not raw.strip():
            raise ProxyError(400, "request body is empty; expected a JSON object")
        try:
            return memo.loads(raw) if memo is not None else fastjson.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
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
        raw: bytes | None = None
        try:
            raw = await self.read_body(request)
            raw = self.decode_body(raw, request.headers.get("content-encoding", "identity"))
            memo = session.body_memo(adapter.history_field) if adapter.history_field else None
            body = self.parse_json(raw, memo)
            if path_model is not None and isinstance(body, dict) and adapter.model_field is not None:
                body = {**body, "model": adapter.model_field(path_model)}
            record.request = body
            conv = adapter.parse_reusing(body, session.memos) if adapter.parse_reusing else adapter.parse(body)
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
            record.prompt_token_ids = the_plan.prompt_token_ids  # as sent; unchanged until committed (share_prompt)
            if the_plan.extends and the_plan.parent is not None:
                record.prove_extends(the_plan.parent.record)
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
            await self.fail(session, record, err, raw)
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

    async def fail(self, session: Session, record: CallRecord, err: ProxyError, raw: bytes | None = None) -> None:
        """Record a failed call; ``raw``: its body, kept verbatim where it never parsed."""
        if record.request is None and raw is not None:
            record.request = raw.decode("utf-8", errors="replace")
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
    is adopted (those of the first calls) are frozen with it, a bounded one-time cost.

    Collections then come rarer (``YOUNG_COLLECTION_AFTER`` allocations, not 700): every collection traverses the
    ids lists alive (a session's records hold one per call, each of its whole context), and a call allocates
    thousands of short-lived containers but hardly any cycles. At a 64k-token session (bench.session_scale) 10,000
    took the proxy's time in the collector from 481 to 216 ms over 200 calls. With 256 sessions on one worker, what
    a young collection traverses (the calls in flight, ~200k references) is cold in the caches: ~22 ms a collection
    at 10,000, 6.1% of the worker's CPU; at 50,000, 2.7% (~73 ms a collection, a fifth as many; the longest pause,
    an older generation's, ~0.5 s either way)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_COLLECTION_AFTER, *gc.get_threshold()[1:])


YOUNG_COLLECTION_AFTER = 50_000


async def trim_heap(every_s: float) -> None:
    """Every ``every_s`` seconds, hand the memory the allocator holds free back to the system (glibc's ``malloc_trim``;
    nothing elsewhere). A call allocates and frees buffers the size of its context (the request body, the prompt's
    JSON, its texts) in several threads, each with an arena of its own, and glibc keeps what they free: a 64k-token
    session of 200 calls grew the proxy's RSS by ~220 MB while its live objects were 14 MB; a trim gave it all back
    (bench.session_scale)."""
    trim = _malloc_trim()
    while trim is not None:
        await asyncio.sleep(every_s)
        await asyncio.to_thread(trim, 0)


def _malloc_trim() -> Callable[[int], int] | None:
    path = ctypes.util.find_library("c")
    return getattr(ctypes.CDLL(path), "malloc_trim", None) if path else None


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


def handle_proxy_errors(app: FastAPI) -> None:
    """Every failure on either app answers in a provider's error shape."""

    @app.exception_handler(ProxyError)
    async def _proxy_error(_: Request, err: ProxyError) -> JSONResponse:
        return error_response("openai", err)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        # Unknown routes and wrong methods answer in the provider's error shape, like every other failure.
        return error_response("openai", ProxyError(exc.status_code, str(exc.detail)))
