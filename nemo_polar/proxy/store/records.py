"""Call records: one per model call, appended durably to a per-session JSONL file.

A record is written (and fsync'd) before the harness sees the end of the response, so the next call of the
session, and every downstream consumer, can rely on it. A failed call is recorded with ``error`` set and is
never confused with a complete one: ``complete`` is true only for a call whose sampled ids and logprobs
came from a finished engine generation.

Every record carries ``schema_version`` (:data:`RECORD_SCHEMA_VERSION`). Records outlive the proxy that wrote them and
are read by other processes (the trainer, ``polar reconstruct``) that may be older: unknown fields are ignored on
load, so a reader must refuse a record newer than it understands rather than silently drop what changed (NeMo Gym's
``TokenEntry`` readers do the same). Records written before the field existed load as version 1.

Version 2 stores a prompt that extends an earlier record of the same file as what it adds (``prompt_from``: that
record's call id, how many of its prompt + sampled ids this prompt starts with, the new ids, and a SHA-256 of the
whole prompt), and the harness's request as the parent's request text with its middle replaced (``request_from``),
so a session's file grows with its new tokens rather than with its whole context at every call. Readers give back
full records (:class:`RecordReader`), checking each rebuilt prompt and request against its digest. Version 3 packs
what is added, zlib-compressed as base64: the new ids as int32 (``tail_z``) and the request's new text (``text_z``, when
that is shorter); version 2 files (a JSON list, plain text) still load.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, Field, PrivateAttr, model_validator

from nemo_polar.proxy.render.prefix import common_prefix, common_suffix
from nemo_polar.proxy.sampling import SamplingParams
from nemo_polar.proxy.store.packing import (
    RunningDigests,
    int32le,
    pack_ids,
    pack_text,
    prompt_digest,
    unpack_ids,
    unpack_text,
)
from nemo_polar.proxy.store.request_text import WrittenText, request_text, written_text

Api = Literal["chat", "responses", "anthropic", "gemini"]
Mode = Literal["continuation", "chat", "chat_prefix"]
# Continuation mode's history: the exact ids sampled earlier, or the model's template's render of the history (which
# may rewrite it: Qwen3 drops reasoning before the last user query, gpt-oss drops analysis).
History = Literal["sampled", "template"]

# Bump when a field's meaning changes or a field a reader must not ignore is added; readers refuse newer records.
# 2: prompts and requests may be stored as what they add to an earlier record; 3: those additions zlib-compressed.
RECORD_SCHEMA_VERSION = 3


def newer_schema_error(version: object) -> str | None:
    """Why a record of ``version`` cannot be read here, or ``None`` when it can (a missing version is 1)."""
    if isinstance(version, int) and not isinstance(version, bool) and version > RECORD_SCHEMA_VERSION:
        return (
            f"call record schema_version {version} is newer than this reader understands "
            f"(up to {RECORD_SCHEMA_VERSION}); upgrade nemo_polar to read it"
        )
    return None


# Where a call's time to first token goes, in order: its body read and parsed, admitted (past a weight-sync pause),
# its engine request built, the engine's response headers, the engine's first chunk, the first generated event handed
# to the harness's stream.
STAGES = ("parsed", "admitted", "rendered", "engine_accepted", "first_upstream", "first_downstream")


class CallRecord(BaseModel):
    schema_version: int = Field(default=RECORD_SCHEMA_VERSION, ge=1, description="the record format's version")
    call_id: str
    session_id: str
    api: Api
    mode: Mode
    request: Any = Field(description="the harness's original request body")
    prompt_token_ids: list[int] = Field(default_factory=list, description="exactly what the engine was given")
    sampled_token_ids: list[int] = Field(default_factory=list)
    sampled_logprobs: list[float] = Field(default_factory=list)
    finish_reason: str | None = None
    parent_call_id: str | None = None
    render_reason: str | None = None
    policy_version: int | None = None
    policy_version_changes: list[dict[str, int]] = Field(
        default_factory=list,
        description="weight updates during this generation (an engine that keeps in-flight requests across one): "
        "{at_token, policy_version}, tokens before at_token sampled under the versions before",
    )
    # Records written before top_k was recorded load with top_k None (every SamplingParams field is optional).
    sampling: SamplingParams | None = Field(default=None, description="what the engine was sent (session pins applied)")
    output_text: str | None = Field(default=None, description="the sampled text as the engine detokenised it")
    output: dict[str, Any] | None = Field(
        default=None,
        description="the assistant turn the harness was answered with, as the proxy read the sample in the model's "
        "format: content, reasoning, tool calls (their ids, names, JSON arguments); a conversation Message",
    )
    started_at: float
    render_s: float | None = Field(default=None, description="time spent building the engine request")
    tokenize: str | None = Field(
        default=None, description="continuation mode: tail:<chars> (only the appended text tokenized) or full:<why>"
    )
    template: str | None = Field(
        default=None,
        description="continuation mode: messages:<n> (the chat template ran over the last n messages only) or "
        "full:<why>",
    )
    history: History | None = Field(
        default=None, description="continuation mode: the session's history policy on this call (SessionConfig)"
    )
    system_messages: str | None = Field(
        default=None,
        description="where the model's template refuses system messages where the harness put them: merged:<n> "
        "(the n leading ones joined into one) and/or as_user:<i,...> (later ones rendered as user turns in place), "
        "users_joined:<n> (n user messages joined to the one before them, for a template that refuses two in a row); "
        "None when they were rendered as sent (TemplateTraits)",
    )
    stages: dict[str, float] = Field(
        default_factory=dict,
        description="seconds from the request's arrival to each stage the call reached (STAGES), to the millisecond",
    )
    finished_at: float | None = None
    status_code: int = 200
    error: str | None = None
    error_code: str | None = Field(
        default=None, description="a failed call's error code as the harness got it (context_length_exceeded, ...)"
    )
    complete: bool = False
    # Set for a prompt built or read as an earlier record's prompt + sampled ids + new ids: that record's call id, its
    # prompt's list and sampled ids, and this prompt's list. Holding while they are still the records' own lists, it
    # proves the prefix without comparing them.
    _extends: tuple[str, list[int], list[int], list[int]] | None = PrivateAttr(default=None)
    # A committed call of a session whose records are on disk keeps its prompt as the first ``_shared_len`` ids of a
    # list the calls that continue it extend in place (``share_prompt``): one list for a whole chain of calls.
    _shared: list[int] | None = PrivateAttr(default=None)
    _shared_len: int = PrivateAttr(default=0)

    @property
    def refused(self) -> bool:
        """The serving side refused the request before sampling (a 4xx the harness got: context too long, a
        conversation the template refuses, ...): no token was sampled, so nothing of the rollout was lost. A client
        that went away (499) or an engine fault is not a refusal."""
        return not self.complete and 400 <= self.status_code < 499 and not self.sampled_token_ids

    def extends(self, parent: CallRecord) -> bool | None:
        """True when this prompt is known to start with ``parent``'s prompt + sampled ids (as read, or as built),
        None when not known either way."""
        proof = self._extends
        if proof is None:
            return None
        of, before, sampled, prompt = proof
        if (
            of == parent.call_id
            and before is parent.prompt_view()[0]
            and sampled is parent.sampled_token_ids
            and prompt is self.prompt_token_ids
        ):
            return True
        return None

    def prove_extends(self, parent: CallRecord) -> None:
        """Note that this prompt was built as ``parent``'s prompt + sampled ids + more (continuation), so that its
        writer stores it as what it adds without comparing (``extends``; void once either list is replaced)."""
        self._extends = (parent.call_id, parent.prompt_view()[0], parent.sampled_token_ids, self.prompt_token_ids)

    def prompt_view(self) -> tuple[list[int], int]:
        """The prompt as a list and a length: the list's first ``length`` ids (the list may go on: ``share_prompt``).
        What reads a live session's committed records in the proxy reads their prompts here."""
        if self._shared is not None:
            return self._shared, self._shared_len
        return self.prompt_token_ids, len(self.prompt_token_ids)

    def share_prompt(self) -> None:
        """Once written: the prompt's list is handed to the calls that continue this one, which extend it in place
        (``shared_prompt``), and is read through ``prompt_view``; ``prompt_token_ids`` is emptied, so that nothing reads
        a list that has grown since. Readers of the session's records read them from its file."""
        if self._shared is None:
            self._shared, self._shared_len = self.prompt_token_ids, len(self.prompt_token_ids)
            self.prompt_token_ids = []

    def shared_prompt(self) -> list[int] | None:
        """The list a call continuing this one may extend in place to make its prompt: this call's shared prompt,
        where nothing has extended it yet; else None (a continuation copies the prompt)."""
        shared = self._shared
        return shared if shared is not None and len(shared) == self._shared_len else None

    @model_validator(mode="after")
    def _refuse_a_newer_record(self) -> CallRecord:
        if (why := newer_schema_error(self.schema_version)) is not None:
            raise ValueError(why)
        return self

    def reached(self, stage: str, at: float | None = None) -> None:
        """Note that the call reached ``stage`` (now, or at the ``time.time()`` value ``at``)."""
        self.stages[stage] = round((time.time() if at is None else at) - self.started_at, 3)
        self.stages = {name: self.stages[name] for name in STAGES if name in self.stages}  # in the calls' order

    def mark_failed(self, message: str, status_code: int, code: str | None = None) -> CallRecord:
        self.error = message
        self.status_code = status_code
        self.error_code = code
        self.complete = False
        self.finished_at = time.time()
        return self


class PromptDelta(BaseModel):
    """A prompt stored as what it adds to an earlier record of the same session file."""

    call: str = Field(description="the earlier record's call id")
    keep: int = Field(ge=0, description="how many of that record's prompt + sampled ids this prompt starts with")
    tail: list[int] | None = Field(default=None, description="the ids after those (schema 2)")
    tail_z: str | None = Field(default=None, description="the ids after those, pack_ids (schema 3)")
    sha256: str = Field(description="prompt_digest of the whole prompt")

    @model_validator(mode="after")
    def _one_tail(self) -> PromptDelta:
        if (self.tail is None) == (self.tail_z is None):
            raise ValueError("a prompt delta has exactly one of tail and tail_z")
        return self

    def ids(self) -> list[int]:
        return self.tail if self.tail is not None else unpack_ids(self.tail_z or "")


class RequestDelta(BaseModel):
    """A request stored as an earlier record's request text with its middle replaced (the harness resends the
    whole history every call: what changes is the end of the conversation, before the unchanged tools and options).
    Texts are :func:`request_text`."""

    call: str = Field(description="the earlier record's call id")
    prefix: int = Field(ge=0, description="characters kept from the start of that record's request text")
    suffix: int = Field(ge=0, description="characters kept from its end")
    text: str | None = Field(default=None, description="what stands between them")
    text_z: str | None = Field(default=None, description="the same, pack_text (when that is shorter)")
    sha256: str = Field(description="of the whole request text (ASCII)")

    @model_validator(mode="after")
    def _one_text(self) -> RequestDelta:
        if (self.text is None) == (self.text_z is None):
            raise ValueError("a request delta has exactly one of text and text_z")
        return self

    def middle(self) -> str:
        return self.text if self.text is not None else unpack_text(self.text_z or "")


T = TypeVar("T")
MIN_REQUEST_SHARED = 256  # characters a delta must save to be worth its indirection


def _starts_with(prompt: list[int], parent: CallRecord, keep: int) -> bool:
    """``prompt`` starts with the first ``keep`` of ``parent``'s prompt + sampled ids (compared in place)."""
    before, n = parent.prompt_view()
    if keep <= n:
        return prompt[:keep] == before[:keep]
    return prompt[:n] == before[:n] and prompt[n:keep] == parent.sampled_token_ids[: keep - n]


def _prompt_delta(record: CallRecord, parent: CallRecord, digests: RunningDigests) -> tuple[PromptDelta | None, Any]:
    """The prompt as what it adds to ``parent``'s prompt + sampled ids (or, failing that, to its prompt), and the
    running hash of the whole prompt. Continuation proves the first (``CallRecord.extends``) without comparing."""
    prompt = record.prompt_token_ids
    before = parent.prompt_view()[1]
    whole = before + len(parent.sampled_token_ids)
    for keep, sampled in ((whole, True), (before, False)):
        if not keep or keep > len(prompt):
            continue
        if (sampled and record.extends(parent)) or _starts_with(prompt, parent, keep):
            tail = prompt[keep:]
            running = digests.after(parent.call_id, sampled).copy()
            running.update(int32le(tail))
            delta = PromptDelta(call=parent.call_id, keep=keep, tail_z=pack_ids(tail), sha256=running.hexdigest())
            return delta, running
    return None, hashlib.sha256(int32le(prompt))


def _text_digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _request_delta(text: str, digest: str, before: str, parent: CallRecord, same: int = 0) -> RequestDelta | None:
    """``text`` (a request text, ``digest`` its ``_text_digest``) as a delta of ``before``, the request text written
    for ``parent``, whose first ``same`` characters are known to be ``text``'s."""
    prefix = common_prefix(before, text, same)
    suffix = common_suffix(before, text, min(len(before), len(text)) - prefix)
    if prefix + suffix < MIN_REQUEST_SHARED:
        return None
    middle = text[prefix : len(text) - suffix]
    packed = pack_text(middle)
    stored = {"text_z": packed} if len(packed) < len(middle) else {"text": middle}
    return RequestDelta(call=parent.call_id, prefix=prefix, suffix=suffix, sha256=digest, **stored)


class _RecentTexts(Generic[T]):
    """The request texts of the last few records written or read (a session's next call almost always extends the
    last one): the parent's text without serialising its request again. Few, since each is a whole history."""

    def __init__(self, size: int = 2) -> None:
        self.size = size
        self._texts: dict[str, T] = {}

    def get(self, call_id: str) -> T | None:
        return self._texts.get(call_id)

    def put(self, call_id: str, text: T) -> None:
        self._texts[call_id] = text
        while len(self._texts) > self.size:
            del self._texts[next(iter(self._texts))]


# Appends wait on fsync (tens of ms on a busy disk) in threads of their own, so they never take the event loop's default
# executor's few workers, which the renders of other sessions' requests run in.
_DISK = ThreadPoolExecutor(max_workers=32, thread_name_prefix="polar-records")


class RecordWriter:
    """Append-only JSONL writer for one session; every append is flushed and fsync'd."""

    def __init__(self, path: Path | None, line_in_thread: bool = True) -> None:
        self.path = path
        self.line_in_thread = line_in_thread  # the line built beside the loop (ProxyConfig.helper_threads)
        self._lock = asyncio.Lock()
        self._written: dict[str, CallRecord] = {}  # by call id: what a later prompt may be stored against
        self._request_digests: dict[str, str] = {}  # by call id: the digest of the request text written for it
        self._texts: _RecentTexts[WrittenText] = _RecentTexts()
        self._digests = RunningDigests()
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)

    def line(self, record: CallRecord) -> str:
        """The record's JSONL line: its prompt and its request stored as what they add to its parent's, where they
        extend them."""
        parent = self._written.get(record.parent_call_id or "")
        self._written[record.call_id] = record
        text, same = None, 0
        if record.request is not None:
            earlier = self._texts.get(record.parent_call_id or "")
            written = written_text(record.request, earlier)
            text, same = written.text, written.same
            self._request_digests[record.call_id] = digest = written.digest(earlier)
            self._texts.put(record.call_id, written)
        stored: dict[str, BaseModel] = {}
        prompt, running = _prompt_delta(record, parent, self._digests) if parent else (None, None)
        running = running or hashlib.sha256(int32le(record.prompt_token_ids))
        self._digests.keep(record.call_id, record.sampled_token_ids, running)
        if parent is not None:
            if prompt is not None:
                stored["prompt_from"] = prompt
            before = self._parent_text(parent)
            if (
                text is not None
                and before is not None
                and (request := _request_delta(text, digest, before, parent, same))
            ):
                stored["request_from"] = request
        if not stored:
            return record.model_dump_json() + "\n"
        exclude = {"prompt_token_ids"} if "prompt_from" in stored else set()
        exclude |= {"request"} if "request_from" in stored else set()
        body = record.model_dump_json(exclude=exclude)
        return body[:-1] + "".join(f',"{k}":{v.model_dump_json(exclude_none=True)}' for k, v in stored.items()) + "}\n"

    def _parent_text(self, parent: CallRecord) -> str | None:
        """The request text written for ``parent``, or None when there is none or its request has changed in memory
        since (a reader rebuilds from what was written)."""
        if (written := self._texts.get(parent.call_id)) is not None:
            return written.text
        digest = self._request_digests.get(parent.call_id)
        if parent.request is None or digest is None:
            return None
        text = request_text(parent.request)
        return text if _text_digest(text) == digest else None

    def _append_sync(self, line: str) -> None:
        assert self.path is not None
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())

    def append_sync(self, record: CallRecord) -> None:
        """For paths that cannot await (a cancelled stream); one small write."""
        if self.path is not None:
            self._append_sync(self.line(record))

    async def append(self, record: CallRecord) -> None:
        if self.path is None:
            return
        async with self._lock:  # the fsync runs off the event loop; the line too where a core is spare
            loop = asyncio.get_running_loop()
            if not self.line_in_thread:
                line = self.line(record)
                await loop.run_in_executor(_DISK, lambda: self._append_sync(line))
            else:
                await loop.run_in_executor(_DISK, lambda: self._append_sync(self.line(record)))


class RecordError(ValueError):
    """A line that is not a readable call record; the message says why."""


class RecordReader:
    """Decodes one session file's lines in order into full records (a ``prompt_from`` prompt rebuilt from the
    earlier record it names, and checked against its digest)."""

    def __init__(self, verify: bool = True) -> None:
        self.verify = verify
        self._seen: dict[str, CallRecord] = {}
        self._texts: _RecentTexts[str] = _RecentTexts()

    def decode(self, data: Any) -> CallRecord:
        """A parsed line; raises ValueError saying what is wrong with it."""
        if isinstance(data, dict) and (why := newer_schema_error(data.get("schema_version"))) is not None:
            raise RecordError(why)  # before validation, so the message is this one, not a pydantic error dump
        if isinstance(data, dict):
            data = {"schema_version": 1, **data}  # written before the field existed
        text = None
        if isinstance(data, dict) and "request_from" in data:
            text = self._request_text(RequestDelta.model_validate(data.pop("request_from")))
            data["request"] = json.loads(text)
        base = delta = None
        if isinstance(data, dict) and "prompt_from" in data:
            delta = PromptDelta.model_validate(data.pop("prompt_from"))
            base = self._seen.get(delta.call)
            if base is None:
                raise RecordError(f"its prompt extends call {delta.call}, which is not an earlier record of the file")
            ids = base.prompt_token_ids + base.sampled_token_ids
            if delta.keep > len(ids):
                raise RecordError(f"its prompt keeps {delta.keep} ids of call {delta.call}, which has {len(ids)}")
            try:
                tail = delta.ids()
            except ValueError as exc:
                raise RecordError(f"its prompt's packed ids do not unpack: {exc}") from None
            prompt = ids[: delta.keep] + tail
            if self.verify and prompt_digest(prompt) != delta.sha256:
                raise RecordError("its rebuilt prompt does not match the digest it was written with")
            data["prompt_token_ids"] = prompt
        try:
            record = CallRecord.model_validate(data)
        except ValueError as exc:
            raise RecordError(f"not a valid call record: {exc}") from None
        if (
            base is not None
            and delta is not None
            and delta.keep == len(base.prompt_token_ids) + len(base.sampled_token_ids)
        ):
            record._extends = (base.call_id, base.prompt_token_ids, base.sampled_token_ids, record.prompt_token_ids)
        self._seen[record.call_id] = record
        if text is not None:
            self._texts.put(record.call_id, text)
        return record

    def _request_text(self, delta: RequestDelta) -> str:
        base = self._seen.get(delta.call)
        if base is None:
            raise RecordError(f"its request extends call {delta.call}, which is not an earlier record of the file")
        before = self._texts.get(delta.call) or request_text(base.request)
        if delta.prefix + delta.suffix > len(before):
            raise RecordError(f"its request keeps {delta.prefix + delta.suffix} characters of call {delta.call}'s")
        try:
            middle = delta.middle()
        except ValueError as exc:
            raise RecordError(f"its request's packed text does not unpack: {exc}") from None
        text = before[: delta.prefix] + middle + before[len(before) - delta.suffix :]
        if self.verify and _text_digest(text) != delta.sha256:
            raise RecordError("its rebuilt request does not match the digest it was written with")
        return text


def iter_records(path: Path, *, written: bool = False) -> Iterator[tuple[int, CallRecord]]:
    """``(line number, record)`` for a session's JSONL; a corrupt line, or a record newer than this reader
    (``schema_version``), raises naming the file and line. ``written``: the file of a live session, whose last line may
    still be being appended (no newline yet): only whole lines are read."""
    reader = RecordReader()
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if written and not line.endswith("\n"):
                return
            if not line.strip():
                continue
            try:
                record = reader.decode(json.loads(line))
            except ValueError as exc:  # RecordError, or a line that is not JSON
                why = exc if isinstance(exc, RecordError) else f"not a valid call record: {exc}"
                raise ValueError(f"{path}:{lineno}: {why}") from None
            yield lineno, record


def read_records(path: Path, *, written: bool = False) -> list[CallRecord]:
    return [rec for _, rec in iter_records(path, written=written)]
