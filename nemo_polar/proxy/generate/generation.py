"""Plan the engine request for a call (per upstream mode) and run it, capturing exact ids and logprobs.

``continuation`` (token-in/token-out): the prompt of a call that extends the session's previous call is
``parent prompt + parent sampled ids + the canonical rendering of only the new messages``; the new part is
cut from the engine's own render of the whole conversation (``/tokenize``), after as many end-of-turn
tokens as the parent's context closed. The model thus conditions on exactly the tokens it sampled.

``chat`` / ``chat_prefix``: the engine renders the conversation itself (``/v1/chat/completions``);
``chat_prefix`` also sends the parent's exact ids the way NeMo-RL's vLLM server accepts them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from nemo_polar.proxy import fastjson
from nemo_polar.proxy.conversation import Conversation, TemplateTraits, ToolCall, valid_template_id
from nemo_polar.proxy.engine_client import EngineClient, EngineInfo, sse_data
from nemo_polar.proxy.errors import ProxyError
from nemo_polar.proxy.generate import scripted
from nemo_polar.proxy.parse.family_parser import FamilyStream, ParserWorkerError, sampled_call_ids
from nemo_polar.proxy.parse.output import Output
from nemo_polar.proxy.parse.parser import ParseEvent, StreamParser
from nemo_polar.proxy.render.renderer import Renderer
from nemo_polar.proxy.sampling import SamplingParams
from nemo_polar.proxy.store.sessions import CallState, PromptMemo, Session

KEEPALIVE = object()


@dataclass
class Plan:
    path: str
    body: dict[str, Any]
    sampling: SamplingParams  # what is sent, and recorded
    parent: CallState | None = None
    render_reason: str = ""
    prompt_token_ids: list[int] = field(default_factory=list)  # known up front in continuation mode
    tokenize: str | None = None  # how the render was tokenized (continuation mode): tail:<chars> or full:<why>
    template: str | None = None  # how the chat template ran (continuation mode): messages:<n> or full:<why>
    system_messages: str | None = None  # how system messages were placed for the template (TemplateTraits)
    reasoning_open: bool = False  # the prompt ends inside a reasoning block its template opened
    prompt_json: bytes | None = None  # those ids as the JSON sent for the body's prompt (continuation mode)
    extends: bool = False  # the prompt is the parent's prompt + sampled ids + what is new (continuation)


def _reasoning_open(prompt: list[int], info: EngineInfo) -> bool:
    """Whether the prompt ends inside a reasoning block: its last turn (after the last end-of-turn token) opens
    ``<think>`` and does not close it. Read from token ids, so a "<think>" written in a message's text never counts.
    (In chat modes the engine's reasoning parser does this.)"""
    if info.think_ids is None or info.eot_id is None:
        return False
    think_open, think_close = info.think_ids
    last_turn = prompt[_last_index(prompt, info.eot_id) + 1 :]
    opened = _last_index(last_turn, think_open)
    return opened >= 0 and think_close not in last_turn[opened:]


def _last_index(ids: list[int], token: int) -> int:
    """Index of the last ``token`` in ``ids``, or -1: searched in C over ever longer ends (the last turn is near the
    end of a long prompt), never copying the whole list."""
    width = 256
    while True:
        start = max(0, len(ids) - width)
        end = ids[start:]
        if token in end:
            return len(ids) - 1 - end[::-1].index(token)
        if start == 0:
            return -1
        width *= 8


def _nth_after(ids: list[int], token: int, n: int) -> int | None:
    """Index just after the ``n``-th occurrence of ``token`` (n >= 1), or None."""
    at = -1
    try:
        for _ in range(n):  # list.index scans in C: one pass over a 64k-token prompt costs ~0.1 ms, not ~3 ms
            at = ids.index(token, at + 1)
    except ValueError:
        return None
    return at + 1


async def plan(
    engine: EngineClient,
    renderer: Renderer,
    session: Session,
    conv: Conversation,
    traits: TemplateTraits | None = None,
) -> Plan:
    info = await engine.info()
    messages, placed = conv.placed_messages(traits)
    call_ids = traits.call_ids if traits is not None else "as_sent"
    mode = session.config.mode
    sampling = SamplingParams.resolve(conv.sampling, session.config.sampling_overrides)
    tools = conv.template_tools() if conv.tool_choice != "none" else None
    kwargs = session.config.chat_template_kwargs
    parent, reason = session.find_parent(conv)
    # Upstream streams when the harness streams; a non-streaming call gets one engine response (cheaper for both).
    common: dict[str, Any] = {"model": info.model, "stream": conv.stream}
    if conv.stream:
        common["stream_options"] = {"include_usage": True}

    if mode == "continuation":
        async with session.planning:  # the render's ids may be the session's cache's list, changed by its next render
            full = await renderer.render(messages, tools, kwargs, session.token_cache)
            tokenize, template = session.token_cache.how, session.token_cache.template_how
            if parent is not None and session.config.history == "template":
                parent, reason = None, "template_history"
            ends = session.token_cache.token_ends(full, info.eot_id) if info.eot_id is not None else None
            memo, parent, reason = _prompt(session, parent, reason, full, info, ends)
        prompt = memo.ids
        _check_context(len(prompt), sampling.max_tokens, info.max_model_len)
        opened = _reasoning_open(prompt, info)
        body = {**common, "prompt": prompt, "logprobs": 0, "return_token_ids": True, **sampling.engine_fields()}
        return Plan(
            "/v1/completions",
            {**body, **await scripted.engine_extra(engine, session, call_ids)},
            sampling,
            parent,
            reason,
            prompt,
            tokenize,
            template,
            placed,
            opened,
            prompt_json=memo.json,
            extends=parent is not None,
        )

    body = {
        **common,
        "messages": messages,
        "logprobs": True,
        "top_logprobs": 0,
        "return_token_ids": True,
        **sampling.engine_fields(),
    }
    if tools:
        body["tools"] = tools
        body["tool_choice"] = _chat_tool_choice(conv.tool_choice)
    if kwargs:
        body["chat_template_kwargs"] = kwargs
    if mode == "chat_prefix" and parent is not None:
        # NeMo-RL's vLLM server splices these exact ids into its re-templated prompt; stock vLLM ignores them.
        before, n = parent.record.prompt_view()
        body["required_prefix_token_ids"] = before[:n] + parent.record.sampled_token_ids
        last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
        messages[last] = {  # a copy: the message's own dict is shared (Message.to_template)
            **messages[last],
            "prompt_token_ids": before[:n],
            "generation_token_ids": parent.record.sampled_token_ids,
        }
    render_reason = f"engine_render:{reason}"
    return Plan(
        "/v1/chat/completions",
        {**body, **await scripted.engine_extra(engine, session, call_ids)},
        sampling,
        parent,
        render_reason,
        system_messages=placed,
    )


def _chat_tool_choice(choice: str) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    return {"type": "function", "function": {"name": choice}}


def _prompt(
    session: Session,
    parent: CallState | None,
    reason: str,
    full: list[int],
    info: EngineInfo,
    eot_ends: list[int] | None = None,
) -> tuple[PromptMemo, CallState | None, str]:
    """The prompt (and its parent, and why) of a continuation-mode call: ``parent``'s continued where it can be, else
    the whole render ``full`` (``eot_ends``: where each end of turn in it ends, where known); kept as the session's
    ``last_prompt`` for its next call."""
    memo = None
    if parent is not None:
        memo, reason = _continue(parent, full, info.eot_id, info.eot_text, session.last_prompt, eot_ends)
        if memo is None:
            parent = None
    session.last_prompt = memo or PromptMemo(list(full), fastjson.dumps(full), info.eot_id, -1, len(full))
    return session.last_prompt, parent, reason


def _continue(
    parent: CallState,
    full: list[int],
    eot: int | None,
    eot_text: str,
    last: PromptMemo | None,
    eot_ends: list[int] | None = None,
) -> tuple[PromptMemo | None, str]:
    """The prompt continuing ``parent`` (its prompt + sampled ids + the new part of ``full``), or None and why not.
    Where ``last`` memoises the parent's prompt, only what is added is written as JSON and counted; where ``eot_ends``
    says where ``full``'s ends of turn are (the renderer's cache knows), the cut is looked up, not searched for."""
    if eot is None:
        return None, "no_single_end_of_turn_token"
    rec = parent.record
    before, n = rec.prompt_view()
    # The cut below counts end-of-turn tokens. An end-of-turn inside the sampled turn (sampled as the token, or
    # spelled out in text, which the canonical render turns into the token) shifts that count, and the new part
    # would start inside the parent's turn: render the whole history afresh instead.
    if eot in rec.sampled_token_ids[:-1] or eot_text in (rec.output_text or ""):
        return None, "end_of_turn_in_sampled"
    known = last if last is not None and last.ids is before and last.length == n and last.token == eot else None
    if known and known.count >= 0:
        closed = known.count + 1  # + its own turn
    else:
        closed = (before.count(eot) if len(before) == n else before[:n].count(eot)) + 1
    if eot_ends is not None:
        cut = eot_ends[closed - 1] if closed <= len(eot_ends) else None
    else:
        cut = _nth_after(full, eot, closed)
    if cut is None or cut >= len(full):
        return None, "delta_render_failed"
    added = list(rec.sampled_token_ids)
    if not added or added[-1] != eot:  # truncated or stopped on a stop string: close the turn as the template does
        added.append(eot)
    added += full[cut:]
    # The parent's shared prompt list extended in place where nothing has extended it yet (a chain of calls keeps
    # one list: no copy of the whole context a call), else a copy of the parent's prompt extended.
    prompt = rec.shared_prompt()
    if prompt is not None:
        prompt += added
    else:
        prompt = (before if len(before) == n else before[:n]) + added
    # The JSON of a list of ints is its items' joined by commas: the parent's, then the added ones'
    json = b"".join([memoryview(known.json)[:-1], b",", fastjson.dumps(added)[1:]]) if known else fastjson.dumps(prompt)
    # the sampled turn holds one end of turn (checked above, or appended)
    return PromptMemo(prompt, json, eot, closed + full[cut:].count(eot), len(prompt)), "continuation"


def _check_context(prompt_len: int, max_tokens: int | None, max_len: int | None) -> None:
    if max_len is None:
        return
    need = prompt_len + (max_tokens or 1)
    if need > max_len:
        raise ProxyError(
            400,
            f"This model's maximum context length is {max_len} tokens, but the request needs {need} "
            f"({prompt_len} prompt tokens + {max_tokens or 1} max_tokens). Shorten the history or lower max_tokens.",
            code="context_length_exceeded",
        )


@dataclass
class Capture:
    prompt_token_ids: list[int] = field(default_factory=list)
    sampled_token_ids: list[int] = field(default_factory=list)
    sampled_logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    text: str = ""
    prompt_tokens: int = 0
    first_chunk_at: float | None = None  # time.time() of the engine's first chunk


class Generation:
    """One streamed engine call: yields parse events (and keep-alive markers) while capturing ids."""

    def __init__(
        self,
        engine: EngineClient,
        the_plan: Plan,
        conv: Conversation,
        new_call_id: Callable[[], str],
        family_stream: Callable[[list[int]], FamilyStream] | None = None,
    ) -> None:
        self.engine = engine
        self.plan = the_plan
        self.conv = conv
        self.new_call_id = new_call_id
        self.capture = Capture(prompt_token_ids=the_plan.prompt_token_ids)  # read, never changed in place
        self.parser = StreamParser(param_types=conv.param_type, reasoning_open=the_plan.reasoning_open)
        self.output = Output()
        self._resp: aiohttp.ClientResponse | None = None
        self._whole: dict[str, Any] | None = None  # a non-streaming engine response
        self._chat_calls: dict[int, dict[str, str]] = {}
        # A family format read by vLLM's own parsers (from text and token ids) instead of the in-process parser.
        self._family_stream = family_stream
        self.family: FamilyStream | None = None
        self._family_done = False

    async def open(self) -> None:
        if self._family_stream is not None:  # the worker may start (seconds): off the event loop
            self.family = await asyncio.to_thread(self._family_stream, list(self.plan.prompt_token_ids))
            self.plan.body["skip_special_tokens"] = self.family.skip_special_tokens
        sent = self.plan.prompt_json
        raw = {"prompt": sent} if sent is not None else None
        try:
            if self.plan.body.get("stream"):
                self._resp = await self.engine.open_stream(self.plan.path, self.plan.body, raw)
            else:
                self._whole = await self.engine.post_json(self.plan.path, self.plan.body, raw=raw, echo=self._echo)
        except BaseException:  # refused by the engine: nothing will close this call later
            await self.close()
            raise

    @property
    def _echo(self) -> tuple[str, bytes] | None:
        """The engine's echo of the prompt, read as ``fastjson.AS_SENT`` where it is the JSON sent byte for byte."""
        return ("prompt_token_ids", self.plan.prompt_json) if self.plan.prompt_json is not None else None

    async def close(self) -> None:
        if self.family is not None:  # a call abandoned mid-sample (the harness went away) frees its parser too
            with contextlib.suppress(ParserWorkerError):
                self.family.close()
        if self._resp is not None:
            self._resp.close()  # closing (not releasing) aborts the engine request if it is still running
            self._resp = None

    async def events(self, keepalive_s: float | None = None) -> AsyncIterator[object]:
        if self._whole is not None:
            for ev in [*self._absorb(_as_chunk(self._whole)), *self._held_back()]:
                yield ev
            self._finalise()
            return
        assert self._resp is not None, "open() first"
        queue: asyncio.Queue[object] = asyncio.Queue()
        done = object()

        async def pump() -> None:
            assert self._resp is not None
            try:
                async for chunk in sse_data(self._resp, self._echo):
                    await queue.put(chunk)
                await queue.put(done)
            except Exception as exc:  # handed to the consumer, which raises it in its own context
                await queue.put(exc)

        task = asyncio.create_task(pump())
        try:
            while True:
                try:
                    item = await asyncio.wait_for(queue.get(), keepalive_s) if keepalive_s else await queue.get()
                except TimeoutError:
                    yield KEEPALIVE
                    continue
                if item is done:
                    break
                if isinstance(item, Exception):
                    raise item
                assert isinstance(item, dict)
                for ev in self._absorb(item):
                    yield ev
            for ev in self._held_back():
                yield ev
            self._finalise()
        finally:
            task.cancel()

    # -- chunk handling -----------------------------------------------------------------------------
    def _absorb(self, chunk: dict[str, Any]) -> list[object]:
        cap = self.capture
        if cap.first_chunk_at is None:
            cap.first_chunk_at = time.time()
        if chunk.get("prompt_token_ids"):  # chat: top level, first chunk
            cap.prompt_token_ids = list(chunk["prompt_token_ids"])
        usage = chunk.get("usage")
        if usage:
            cap.prompt_tokens = usage.get("prompt_tokens", cap.prompt_tokens)
        events: list[object] = []
        for choice in chunk.get("choices") or []:
            echoed = choice.get("prompt_token_ids")  # completions: on the first choice chunk
            if echoed == fastjson.AS_SENT:
                pass  # the ids sent, byte for byte (fastjson.loads_echo): the capture holds them already
            elif echoed:
                engine_prompt = list(echoed)
                if cap.prompt_token_ids and engine_prompt != cap.prompt_token_ids:
                    raise ProxyError(502, "engine reports a different prompt than the one sent", code="prompt_mismatch")
                cap.prompt_token_ids = engine_prompt
            cap.sampled_token_ids.extend(choice.get("token_ids") or [])
            cap.sampled_logprobs.extend(_logprobs(choice.get("logprobs")))
            if choice.get("finish_reason"):
                cap.finish_reason = choice["finish_reason"]
            if "text" in choice and self.family is not None:  # completions, read by vLLM's parsers
                text = choice.get("text") or ""
                ids, self._family_done = choice.get("token_ids") or [], bool(choice.get("finish_reason"))
                cap.text += text
                if self._whole is not None:  # not streamed: parsed whole, as vLLM's endpoint does
                    self._family_done = True
                    events.extend(self._parsed(self.family.whole(text, ids)))
                elif text or ids or self._family_done:
                    events.extend(self._parsed(self.family.feed(text, ids, self._family_done)))
                continue
            if "text" in choice:  # completions
                text = choice.get("text") or ""
            else:  # chat
                delta = choice.get("delta") or {}
                reasoning = delta.get("reasoning_content") or delta.get("reasoning")
                if reasoning:
                    events.append(ParseEvent("reasoning", reasoning))
                    self.output.reasoning += reasoning
                for tc in delta.get("tool_calls") or []:
                    slot = self._chat_calls.setdefault(int(tc.get("index", 0)), {"name": "", "arguments": ""})
                    fn = tc.get("function") or {}
                    slot["name"] += fn.get("name") or ""
                    slot["arguments"] += fn.get("arguments") or ""
                text = delta.get("content") or ""
            if text:
                cap.text += text
                events.extend(self._parsed(self.parser.feed(text)))
        return events

    def _parsed(self, evs: list[ParseEvent]) -> list[object]:
        out: list[object] = []
        for ev in evs:
            if ev.kind == "tool_call" and ev.call is not None:
                tool = self.conv.tool(ev.call.name)
                call = ToolCall(
                    id=self.new_call_id(),
                    name=ev.call.name,
                    arguments=ev.call.arguments,
                    kind=tool.kind if tool else "function",
                )
                self.output.tool_calls.append(call)
                out.append(call)
            elif ev.kind == "reasoning":
                self.output.reasoning += ev.text
                out.append(ev)
            else:
                self.output.content += ev.text
                out.append(ev)
        return out

    def _flush_chat_calls(self) -> list[object]:
        out: list[object] = []
        for _, slot in sorted(self._chat_calls.items()):
            tool = self.conv.tool(slot["name"])
            call = ToolCall(
                id=self.new_call_id(),
                name=slot["name"],
                arguments=slot["arguments"] or "{}",
                kind=tool.kind if tool else "function",
            )
            self.output.tool_calls.append(call)
            out.append(call)
        self._chat_calls.clear()
        return out

    def _held_back(self) -> list[object]:
        """What the parser and the chat tool-call assembler kept until the generation ended."""
        if self.family is not None and not self._family_done:
            self._family_done = True
            return self._parsed(self.family.feed("", [], finished=True))
        return [*self._parsed(self.parser.finish()), *self._flush_chat_calls()]

    def _finalise(self) -> None:
        cap = self.capture
        if cap.finish_reason is None:
            raise ProxyError(502, "engine stream ended without a finish reason", code="engine_stream_truncated")
        if len(cap.sampled_logprobs) != len(cap.sampled_token_ids):
            raise ProxyError(
                502,
                f"engine returned {len(cap.sampled_token_ids)} ids but {len(cap.sampled_logprobs)} logprobs",
                code="logprobs_misaligned",
            )
        out = self.output
        out.finish_reason = "tool_calls" if out.tool_calls and cap.finish_reason == "stop" else cap.finish_reason
        if out.finish_reason not in ("stop", "length", "tool_calls"):
            out.finish_reason = "stop"
        if self.family is not None:
            for call, ident in zip(out.tool_calls, sampled_call_ids(self.family.tool_parser, cap.text), strict=False):
                call.template_id = ident if valid_template_id(ident) else None
        out.prompt_tokens = len(cap.prompt_token_ids) or cap.prompt_tokens
        out.completion_tokens = len(cap.sampled_token_ids)


def _as_chunk(response: dict[str, Any]) -> dict[str, Any]:
    """A non-streaming engine response in the shape of one stream chunk (chat ``message`` becomes ``delta``)."""
    for choice in response.get("choices") or []:
        if "message" in choice:
            delta = dict(choice.pop("message") or {})
            delta["tool_calls"] = [{**tc, "index": i} for i, tc in enumerate(delta.get("tool_calls") or [])]
            choice["delta"] = delta
    return response


def _logprobs(lp: Any) -> list[float]:
    if not lp:
        return []
    if "token_logprobs" in lp:  # completions
        return [float(x) if x is not None else float("nan") for x in lp["token_logprobs"]]
    return [float(entry["logprob"]) for entry in lp.get("content") or []]  # chat
