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
full records (:class:`RecordReader`), checking each rebuilt prompt and request against its digest.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys
import time
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, PrivateAttr, model_validator

from nemo_polar.proxy.prefix import common_prefix, common_suffix
from nemo_polar.proxy.sampling import SamplingParams

Api = Literal["chat", "responses", "anthropic"]
Mode = Literal["continuation", "chat", "chat_prefix"]

# Bump when a field's meaning changes or a field a reader must not ignore is added; readers refuse newer records.
RECORD_SCHEMA_VERSION = 2  # 2: prompts and requests may be stored as what they add to an earlier record


def newer_schema_error(version: object) -> str | None:
    """Why a record of ``version`` cannot be read here, or ``None`` when it can (a missing version is 1)."""
    if isinstance(version, int) and not isinstance(version, bool) and version > RECORD_SCHEMA_VERSION:
        return (
            f"call record schema_version {version} is newer than this reader understands "
            f"(up to {RECORD_SCHEMA_VERSION}); upgrade nemo_polar to read it"
        )
    return None


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
    # Records written before top_k was recorded load with top_k None (every SamplingParams field is optional).
    sampling: SamplingParams | None = Field(default=None, description="what the engine was sent (session pins applied)")
    output_text: str | None = Field(default=None, description="the sampled text as the engine detokenised it")
    started_at: float
    render_s: float | None = Field(default=None, description="time spent building the engine request")
    tokenize: str | None = Field(
        default=None, description="continuation mode: tail:<chars> (only the appended text tokenized) or full:<why>"
    )
    finished_at: float | None = None
    status_code: int = 200
    error: str | None = None
    complete: bool = False
    # Set by RecordReader for a prompt it rebuilt as an earlier record's prompt + sampled ids + new ids: those three
    # lists. Holding while they are still the records' own lists, it proves the prefix without comparing them.
    _extends: tuple[list[int], list[int], list[int]] | None = PrivateAttr(default=None)

    def extends(self, parent: CallRecord) -> bool | None:
        """True when this prompt is known to start with ``parent``'s prompt + sampled ids (as read), None when
        not known either way."""
        proof = self._extends
        if proof is None:
            return None
        before, sampled, prompt = proof
        if (
            before is parent.prompt_token_ids
            and sampled is parent.sampled_token_ids
            and prompt is self.prompt_token_ids
        ):
            return True
        return None

    @model_validator(mode="after")
    def _refuse_a_newer_record(self) -> CallRecord:
        if (why := newer_schema_error(self.schema_version)) is not None:
            raise ValueError(why)
        return self

    def mark_failed(self, message: str, status_code: int) -> CallRecord:
        self.error = message
        self.status_code = status_code
        self.complete = False
        self.finished_at = time.time()
        return self


def prompt_digest(ids: list[int]) -> str:
    """SHA-256 of the ids as little-endian int32: what a stored prompt is checked against when rebuilt."""
    packed = array("i", ids)
    if sys.byteorder != "little":
        packed.byteswap()
    return hashlib.sha256(packed.tobytes()).hexdigest()


class PromptDelta(BaseModel):
    """A prompt stored as what it adds to an earlier record of the same session file."""

    call: str = Field(description="the earlier record's call id")
    keep: int = Field(ge=0, description="how many of that record's prompt + sampled ids this prompt starts with")
    tail: list[int] = Field(description="the ids after those")
    sha256: str = Field(description="prompt_digest of the whole prompt")


class RequestDelta(BaseModel):
    """A request stored as an earlier record's request text with its middle replaced (the harness resends the
    whole history every call: what changes is the end of the conversation, before the unchanged tools and options).
    Texts are :func:`request_text`."""

    call: str = Field(description="the earlier record's call id")
    prefix: int = Field(ge=0, description="characters kept from the start of that record's request text")
    suffix: int = Field(ge=0, description="characters kept from its end")
    text: str = Field(description="what stands between them")
    sha256: str = Field(description="of the whole request text (ASCII)")


def request_text(request: Any) -> str:
    """One canonical JSON text of a request (ASCII: escapes survive any encoding)."""
    return json.dumps(request, separators=(",", ":"))


MIN_REQUEST_SHARED = 256  # characters a delta must save to be worth its indirection


def _prompt_delta(record: CallRecord, parent: CallRecord) -> PromptDelta | None:
    prompt = record.prompt_token_ids
    for base in (parent.prompt_token_ids + parent.sampled_token_ids, parent.prompt_token_ids):
        if base and prompt[: len(base)] == base:
            tail = prompt[len(base) :]
            return PromptDelta(call=parent.call_id, keep=len(base), tail=tail, sha256=prompt_digest(prompt))
    return None


def _text_digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _request_delta(text: str, parent: CallRecord, parent_digest: str | None) -> RequestDelta | None:
    """``text`` (a request text) as a delta of ``parent``'s request, if that is still what was written for it."""
    if parent.request is None or parent_digest is None:
        return None
    before = request_text(parent.request)
    if _text_digest(before) != parent_digest:  # changed in memory since it was written: not what a reader has
        return None
    prefix = common_prefix(before, text)
    suffix = common_suffix(before, text, min(len(before), len(text)) - prefix)
    if prefix + suffix < MIN_REQUEST_SHARED:
        return None
    middle = text[prefix : len(text) - suffix]
    return RequestDelta(call=parent.call_id, prefix=prefix, suffix=suffix, text=middle, sha256=_text_digest(text))


class RecordWriter:
    """Append-only JSONL writer for one session; every append is flushed and fsync'd."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._lock = asyncio.Lock()
        self._written: dict[str, CallRecord] = {}  # by call id: what a later prompt may be stored against
        self._request_digests: dict[str, str] = {}  # by call id: the digest of the request text written for it
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)

    def line(self, record: CallRecord) -> str:
        """The record's JSONL line: its prompt and its request stored as what they add to its parent's, where they
        extend them."""
        parent = self._written.get(record.parent_call_id or "")
        self._written[record.call_id] = record
        text = None if record.request is None else request_text(record.request)
        if text is not None:
            self._request_digests[record.call_id] = _text_digest(text)
        stored: dict[str, BaseModel] = {}
        if parent is not None:
            if (prompt := _prompt_delta(record, parent)) is not None:
                stored["prompt_from"] = prompt
            digest = self._request_digests.get(parent.call_id)
            if text is not None and (request := _request_delta(text, parent, digest)) is not None:
                stored["request_from"] = request
        if not stored:
            return record.model_dump_json() + "\n"
        exclude = {"prompt_token_ids"} if "prompt_from" in stored else set()
        exclude |= {"request"} if "request_from" in stored else set()
        body = record.model_dump_json(exclude=exclude)
        return body[:-1] + "".join(f',"{k}":{v.model_dump_json()}' for k, v in stored.items()) + "}\n"

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
        async with self._lock:  # serialising (linear in the request) and the fsync both run off the event loop
            await asyncio.to_thread(lambda: self._append_sync(self.line(record)))


class RecordError(ValueError):
    """A line that is not a readable call record; the message says why."""


class RecordReader:
    """Decodes one session file's lines in order into full records (a ``prompt_from`` prompt rebuilt from the
    earlier record it names, and checked against its digest)."""

    def __init__(self, verify: bool = True) -> None:
        self.verify = verify
        self._seen: dict[str, CallRecord] = {}

    def decode(self, data: Any) -> CallRecord:
        """A parsed line; raises ValueError saying what is wrong with it."""
        if isinstance(data, dict) and (why := newer_schema_error(data.get("schema_version"))) is not None:
            raise RecordError(why)  # before validation, so the message is this one, not a pydantic error dump
        if isinstance(data, dict):
            data = {"schema_version": 1, **data}  # written before the field existed
        if isinstance(data, dict) and "request_from" in data:
            data["request"] = self._request(RequestDelta.model_validate(data.pop("request_from")))
        base = delta = None
        if isinstance(data, dict) and "prompt_from" in data:
            delta = PromptDelta.model_validate(data.pop("prompt_from"))
            base = self._seen.get(delta.call)
            if base is None:
                raise RecordError(f"its prompt extends call {delta.call}, which is not an earlier record of the file")
            ids = base.prompt_token_ids + base.sampled_token_ids
            if delta.keep > len(ids):
                raise RecordError(f"its prompt keeps {delta.keep} ids of call {delta.call}, which has {len(ids)}")
            prompt = ids[: delta.keep] + delta.tail
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
            record._extends = (base.prompt_token_ids, base.sampled_token_ids, record.prompt_token_ids)
        self._seen[record.call_id] = record
        return record

    def _request(self, delta: RequestDelta) -> Any:
        base = self._seen.get(delta.call)
        if base is None:
            raise RecordError(f"its request extends call {delta.call}, which is not an earlier record of the file")
        before = request_text(base.request)
        if delta.prefix + delta.suffix > len(before):
            raise RecordError(f"its request keeps {delta.prefix + delta.suffix} characters of call {delta.call}'s")
        text = before[: delta.prefix] + delta.text + before[len(before) - delta.suffix :]
        if self.verify and _text_digest(text) != delta.sha256:
            raise RecordError("its rebuilt request does not match the digest it was written with")
        return json.loads(text)


def iter_records(path: Path) -> Iterator[tuple[int, CallRecord]]:
    """``(line number, record)`` for a session's JSONL; a corrupt line, or a record newer than this reader
    (``schema_version``), raises naming the file and line."""
    reader = RecordReader()
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                record = reader.decode(json.loads(line))
            except ValueError as exc:  # RecordError, or a line that is not JSON
                why = exc if isinstance(exc, RecordError) else f"not a valid call record: {exc}"
                raise ValueError(f"{path}:{lineno}: {why}") from None
            yield lineno, record


def read_records(path: Path) -> list[CallRecord]:
    return [rec for _, rec in iter_records(path)]
