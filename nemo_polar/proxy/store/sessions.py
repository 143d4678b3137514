"""Sessions: per-rollout API keys, configuration, call history and the replay map.

The replay map lets the proxy recognise its own output when a harness echoes it back, however the harness
re-serialised it (compact JSON arguments, parsed ``input`` objects, reasoning blobs): every id the proxy
emitted for a call (tool-call ids, response item ids, reasoning signatures) points at that call, and the
echoed assistant turn is replaced by the exact output recorded for it.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, field_validator

from nemo_polar.proxy.conversation import (
    CallIdForm,
    Conversation,
    Message,
    RunningFingerprints,
    script_call_id,
)
from nemo_polar.proxy.render.prefix import same_objects
from nemo_polar.proxy.render.renderer import TokenCache
from nemo_polar.proxy.sampling import SamplingParams
from nemo_polar.proxy.store.memos import BodyMemo, ParseMemos
from nemo_polar.proxy.store.records import CallRecord, History, Mode, RecordWriter, read_records

# The keys the engine's forced-tokens logits processor reads (engine/vllm_plugins/polar_forced_tokens.py).
FORCED_IDS, THEN_STOP = "polar_forced_ids", "polar_then_stop"


class ScriptCall(BaseModel):
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class ScriptTurn(BaseModel):
    """A scripted assistant turn: text and tool calls, which the model's own chat template writes in its format."""

    content: str = ""
    tool_calls: list[ScriptCall] = Field(default_factory=list)
    reasoning: str | None = Field(default=None, description="written where the template writes reasoning")

    def message(self, call_ids: CallIdForm = "as_sent") -> dict[str, Any]:
        """The turn as a chat message, its calls' ids of a form the template (``call_ids``) takes."""
        calls = [
            {
                "id": script_call_id(call_ids, c.name, i),
                "type": "function",
                "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
            }
            for i, c in enumerate(self.tool_calls)
        ]
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if calls:
            message["tool_calls"] = calls
        if self.reasoning is not None:
            message["reasoning"] = self.reasoning  # the field vLLM passes to templates
        return message


class SessionConfig(BaseModel):
    mode: Mode = "continuation"
    history: History = Field(
        default="sampled",
        description="continuation mode: 'sampled' continues each call from the exact ids sampled before (the model "
        "conditions on what it produced); 'template' renders the whole history with the model's template on every "
        "call, as the model is served at deployment, so a template that rewrites earlier turns starts a new trace "
        "segment there",
    )
    sampling_overrides: SamplingParams = Field(
        default_factory=SamplingParams,
        description="pinned sampling parameters; max_tokens is a cap on what the harness asks for "
        "(SamplingParams.resolve)",
    )
    model_aliases: list[str] = Field(default_factory=list, description="model names accepted besides the engine's")
    policy_version: int | None = None
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    extra_body: dict[str, Any] = Field(default_factory=dict, description="merged into every engine request")
    script: list[str | ScriptTurn] = Field(
        default_factory=list,
        description="scripted policy: the n-th call is held to script[n], n counting completed calls and those whose "
        "tool calls were already streamed (Session.answered_calls); later calls sample freely. A ScriptTurn is an "
        "assistant turn as the model's chat template writes it, held to exactly those token ids; a string is a "
        "completion text matched by vLLM structured outputs (the engine picks its tokenisation). Either way the "
        "engine samples the ids and their logprobs.",
    )
    metadata: dict[str, Any] = Field(default_factory=dict)

    # Only a pin is checked here: a harness's own max_tokens goes to the engine as asked, and the engine answers it.
    @field_validator("sampling_overrides")
    @classmethod
    def _positive_cap(cls, pinned: SamplingParams) -> SamplingParams:
        if pinned.max_tokens is not None and pinned.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {pinned.max_tokens}")
        return pinned

    def engine_extra(self, position: int, forced: dict[str, Any] | None = None) -> dict[str, Any]:
        """What is merged into the engine request of the session's next call; ``forced``: a ScriptTurn's ids for the
        forced-tokens processor (:func:`nemo_polar.proxy.generate.scripted.engine_extra` renders them)."""
        if position >= len(self.script):
            return self.extra_body
        step = self.script[position]
        if isinstance(step, str):
            return {**self.extra_body, "structured_outputs": {"regex": re.escape(step)}}
        if forced is None:
            raise ValueError(f"script entry {position} is a turn: its token ids are needed")
        return {**self.extra_body, "vllm_xargs": {**self.extra_body.get("vllm_xargs", {}), **forced}}


class SessionCreated(BaseModel):
    session_id: str
    api_key: str


@dataclass
class CallState:
    """What continuation needs about a finished call."""

    record: CallRecord
    history_fingerprint: str  # of the normalised request messages + tools
    output: Message


@dataclass
class PromptMemo:
    """A session's last planned prompt (continuation mode): the list itself, its JSON as sent, how many of a token
    (the end of turn) it holds. The next call's prompt extends it: only what that adds is written and counted."""

    ids: list[int]
    json: bytes
    token: int | None
    count: int
    length: int  # of ids when planned (a prompt's list may be extended since: CallRecord.share_prompt)


@dataclass
class RestoredHistory:
    """A request's messages as parsed and as restored, with the running fingerprints of the restored ones: what the
    next request of the session reuses where its messages start with the same parsed ones (``Session.restore``)."""

    parsed: list[Message]
    restored: list[Message]
    fingerprints: RunningFingerprints
    templates: list[dict[str, Any]]  # each restored message's Message.to_template
    remaps: int  # the session's Session.remaps when restored (its remapped keys up to then)
    open_from: int  # the first assistant turn no call was found for (len(parsed): none); a later one may find one


@dataclass
class Session:
    id: str
    api_key: str
    config: SessionConfig
    writer: RecordWriter
    created_at: float = field(default_factory=time.time)
    closed: bool = False
    records: list[CallRecord] = field(default_factory=list)
    calls: dict[str, CallState] = field(default_factory=dict)
    echo_index: dict[str, str] = field(default_factory=dict)  # emitted id -> call_id (the last that emitted it)
    shared_echo_ids: set[str] = field(default_factory=set)  # emitted by more than one call (content-derived)
    text_index: dict[str, str] = field(default_factory=dict)  # text-only reply -> call_id
    # In-flight calls whose tool calls the harness already has: it may act on them (Codex starts its reviewer on a
    # finished tool-call item) before the call completes and commits.
    delivering: set[str] = field(default_factory=set)
    token_cache: TokenCache = field(default_factory=TokenCache)  # the last render, for tokenizing only what is new
    planning: asyncio.Lock = field(default_factory=asyncio.Lock)  # held from a render to the prompt cut from it
    forced: dict[int, dict[str, Any]] = field(default_factory=dict)  # script position -> its turn's ids (scripted)
    last_prompt: PromptMemo | None = None
    bodies: dict[str, BodyMemo] = field(default_factory=dict)  # by history field: recent bodies, for the next to reuse
    memos: ParseMemos = field(default_factory=ParseMemos)  # what recent requests parsed into, for the next to reuse
    # call id -> its output as echoed turns are restored to (one copy, shared: messages are not changed once parsed)
    restored: dict[str, Message] = field(default_factory=dict)
    history: RestoredHistory | None = None  # the last request's, for the next to restore only what it adds
    # Each emitted id or reply text a commit pointed at another call, in order: turns that echo one of those since the
    # last request may restore differently
    remapped: list[str] = field(default_factory=list)

    @property
    def remaps(self) -> int:
        return len(self.remapped)

    def answered_calls(self) -> int:
        """Calls the harness has an answer from: completed, or in flight with their tool calls already delivered. A
        request the harness sends in reaction to one of those comes after it: the next script entry, and not the
        session's first call."""
        return len(self.calls) + len(self.delivering)

    def body_memo(self, history_field: str) -> BodyMemo:
        """The memo of this session's request bodies whose history is ``history_field``."""
        if (memo := self.bodies.get(history_field)) is None:
            memo = self.bodies[history_field] = BodyMemo(history_field)
        return memo

    def restore(self, conv: Conversation) -> None:
        """Replace echoed assistant turns the proxy produced by the exact recorded output, and note the history's
        running fingerprints on ``conv`` (``Conversation.fingerprint``). A harness resends its whole history: where
        ``conv`` starts with the same parsed messages as the last request (``PrefixMemo`` hands back the same
        objects), those are restored as they were then, up to the first that found no call then or that echoes an id
        or a text a commit since pointed at another call (``remapped``); only the messages from there are looked up
        and digested."""
        last, parsed = self.history, list(conv.messages)
        shared = 0
        if last is not None:
            shared = same_objects(parsed, last.parsed, last.open_from)
            if last.remaps != self.remaps:  # restored again from the first turn that echoes a key pointed elsewhere
                shared = _first_echoing(parsed, shared, set(self.remapped[last.remaps :]))
            conv.messages[:shared] = last.restored[:shared]
        open_from = len(parsed)
        for i in range(shared, len(parsed)):
            if parsed[i].role != "assistant":
                continue
            if (restored := self._restored(parsed[i])) is not None:
                conv.messages[i] = restored
            else:
                open_from = min(open_from, i)
        fingerprints = RunningFingerprints(conv.messages, last.fingerprints if shared else None, shared)
        templates = [*last.templates[:shared], *conv.templates(shared)] if last is not None else conv.templates()
        conv.set_fingerprints(fingerprints, templates)
        self.history = RestoredHistory(parsed, list(conv.messages), fingerprints, templates, self.remaps, open_from)

    def _restored(self, msg: Message) -> Message | None:
        """The recorded output an echoed assistant turn is restored to (one copy per call), or None."""
        call_id = self._echoed_call(msg)
        if call_id is None and not msg.tool_calls and msg.content:
            call_id = self.text_index.get(msg.content)
        state = self.calls.get(call_id) if call_id else None
        if state is None or call_id is None:
            return None
        if (restored := self.restored.get(call_id)) is None:
            restored = self.restored[call_id] = state.output.model_copy(deep=True)
            restored.source_call_id = call_id
        return restored

    def _echoed_call(self, msg: Message) -> str | None:
        """The call whose output this echoed turn is. A tool call's id names one call; an id derived from content (a
        reasoning signature: the same reasoning gives the same one) may have been emitted by several calls, so such
        an id is taken only for a text turn whose text is that of the last call that emitted it."""
        calls = {c.id for c in msg.tool_calls}
        for ident in sorted(msg.echo_ids, key=lambda e: e not in calls):  # tool-call ids first
            call_id = self.echo_index.get(ident)
            if call_id is None:
                continue
            if ident in calls or ident not in self.shared_echo_ids:
                return call_id
            state = self.calls.get(call_id)
            if state is not None and not msg.tool_calls and state.output.content == msg.content:
                return call_id
        return None

    def find_parent(self, conv: Conversation) -> tuple[CallState | None, str]:
        """The call this request extends, or ``None`` and why the prompt must be rendered afresh."""
        messages = conv.messages  # the last assistant turn, looked for from the end (it is near it)
        last = next((i for i in range(len(messages) - 1, -1, -1) if messages[i].role == "assistant"), None)
        if last is None:
            return None, "first_call" if not self.answered_calls() else "new_conversation"
        source = conv.messages[last].source_call_id
        if source is None:
            return None, "assistant_turn_not_from_proxy"
        parent = self.calls[source]
        if not parent.record.complete or not parent.record.prompt_view()[1]:
            return None, "parent_incomplete"
        if last == len(conv.messages) - 1:
            return None, "no_new_messages"
        if conv.fingerprint(last) != parent.history_fingerprint:
            return None, "history_diverged"
        return parent, "continuation"

    def commit(
        self, record: CallRecord, conv: Conversation | None, output: Message | None, echo_ids: list[str]
    ) -> None:
        self.records.append(record)
        self.delivering.discard(record.call_id)
        if not record.complete or conv is None or output is None:
            return
        if self.writer.path is not None:  # written: its records are read from the file, and its prompt's list is shared
            record.share_prompt()
        self.calls[record.call_id] = CallState(record, conv.fingerprint(), output)
        for ident in [*echo_ids, *(c.id for c in output.tool_calls)]:
            if self.echo_index.setdefault(ident, record.call_id) != record.call_id:
                self.shared_echo_ids.add(ident)
                self.echo_index[ident] = record.call_id
                self.remapped.append(ident)
        text = output.content if not output.tool_calls else ""
        if text and self.text_index.setdefault(text, record.call_id) != record.call_id:
            self.text_index[text] = record.call_id
            self.remapped.append(text)


def _first_echoing(messages: list[Message], upto: int, keys: set[str]) -> int:
    """The first of ``messages[:upto]`` whose restoring reads one of ``keys`` (an emitted id or a reply text: what
    ``Session._restored`` looks up), else ``upto``."""
    for i in range(upto):
        msg = messages[i]
        if msg.role == "assistant" and (
            msg.content in keys or any(e in keys for e in msg.echo_ids) or any(c.id in keys for c in msg.tool_calls)
        ):
            return i
    return upto


@dataclass
class ClosedSession:
    """What is left of a closed session once it has left memory: its id and its call records."""

    id: str
    records: list[CallRecord]


SESSION_ID = re.compile(r"^sess-[0-9a-f]{32}$")


def worker_of(session_id: str) -> int | None:
    """The index of the pool worker that made ``session_id`` (its first byte), or ``None`` for no session id."""
    return int(session_id[5:7], 16) if SESSION_ID.match(session_id) else None


class SessionStore:
    """Live sessions by id and key. A closed session leaves memory (its replay map, key and records): with a
    ``record_dir`` its records are read back from ``<session_id>.jsonl``, which close makes sure exists (empty for a
    session that made no call). Without one there is no disk, so only the ``keep_closed`` most recently closed
    sessions' records are kept, in memory; older ones are dropped, and their ids are unknown again.

    ``worker`` (a proxy worker process's index in a pool, 0-255) is written as the first byte of every session id
    this store makes, so any holder of a session id knows which worker holds the session (:func:`worker_of`)."""

    def __init__(
        self, record_dir: Path | None, *, keep_closed: int = 32, worker: int | None = None, lines_in_thread: bool = True
    ) -> None:
        if worker is not None and not 0 <= worker < 256:
            raise ValueError(f"a worker index is 0-255, got {worker}")
        self.record_dir = record_dir
        self.keep_closed = keep_closed
        self.worker = worker
        self.lines_in_thread = lines_in_thread  # RecordWriter.line_in_thread of every session's writer
        self.created = 0  # sessions ever created here (/health and the polar_sessions gauge)
        self._by_id: dict[str, Session] = {}
        self._by_key: dict[str, Session] = {}
        self._closed: OrderedDict[str, list[CallRecord]] = OrderedDict()  # no record_dir only

    def create(self, config: SessionConfig, *, api_key: str | None = None) -> Session:
        session_id = f"sess-{uuid.uuid4().hex}"
        if self.worker is not None:  # still 120 random bits after the worker's byte
            session_id = f"sess-{self.worker:02x}{session_id[7:]}"
        key = api_key or f"polar-{secrets.token_urlsafe(24)}"
        if key in self._by_key:
            raise ValueError("api_key already belongs to a session")
        session = Session(session_id, key, config, RecordWriter(self._path(session_id), self.lines_in_thread))
        self._by_id[session_id] = session
        self._by_key[key] = session
        self.created += 1
        return session

    def get(self, session_id: str) -> Session | None:
        """A live session; ``None`` once it is closed."""
        return self._by_id.get(session_id)

    def by_key(self, api_key: str) -> Session | None:
        session = self._by_key.get(api_key)
        return session if session is not None and not session.closed else None

    def records(self, session_id: str) -> list[CallRecord] | None:
        """A session's call records, live or closed, or ``None`` for an unknown id. Reads the disk where there is a
        ``record_dir``: call it off the event loop."""
        session = self._by_id.get(session_id)
        if session is not None and session.writer.path is None:
            return list(session.records)
        if session is not None:  # its file: what it has written, whole (its records in memory share their prompts)
            return read_records(session.writer.path, written=True) if session.writer.path.exists() else []
        if session_id in self._closed:
            return list(self._closed[session_id])
        path = self._path(session_id) if SESSION_ID.match(session_id) else None
        return read_records(path) if path is not None and path.exists() else None

    def close(self, session_id: str) -> Session | ClosedSession | None:
        """Close a session: its key stops working and it leaves memory. Closing a closed session answers what is
        left of it; ``None`` for an unknown id."""
        session = self._by_id.pop(session_id, None)
        if session is None:
            records = self.records(session_id)
            return ClosedSession(session_id, records) if records is not None else None
        session.closed = True
        self._by_key.pop(session.api_key, None)
        if session.writer.path is not None:
            session.writer.path.touch()  # a session without calls is on disk too, so it stays known once closed
        elif self.keep_closed > 0:
            # The list itself, so a call still in flight when the session closed lands in it.
            self._closed[session_id] = session.records
            while len(self._closed) > self.keep_closed:
                self._closed.popitem(last=False)
        return session

    @property
    def live(self) -> int:
        """Sessions created and not yet closed."""
        return len(self._by_id)

    def _path(self, session_id: str) -> Path | None:
        return self.record_dir / f"{session_id}.jsonl" if self.record_dir else None

    def __len__(self) -> int:
        """Sessions created on this proxy, closed ones included (what /health reports)."""
        return self.created
