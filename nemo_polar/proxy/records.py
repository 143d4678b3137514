"""Call records: one per model call, appended durably to a per-session JSONL file.

A record is written (and fsync'd) before the harness sees the end of the response, so the next call of the
session, and every downstream consumer, can rely on it. A failed call is recorded with ``error`` set and is
never confused with a complete one: ``complete`` is true only for a call whose sampled ids and logprobs
came from a finished engine generation.

Every record carries ``schema_version`` (:data:`RECORD_SCHEMA_VERSION`). Records outlive the proxy that wrote them and
are read by other processes (the trainer, ``polar reconstruct``) that may be older: unknown fields are ignored on
load, so a reader must refuse a record newer than it understands rather than silently drop what changed (NeMo Gym's
``TokenEntry`` readers do the same). Records written before the field existed load as version 1.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from nemo_polar.proxy.sampling import SamplingParams

Api = Literal["chat", "responses", "anthropic"]
Mode = Literal["continuation", "chat", "chat_prefix"]

# Bump when a field's meaning changes or a field a reader must not ignore is added; readers refuse newer records.
RECORD_SCHEMA_VERSION = 1


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


class RecordWriter:
    """Append-only JSONL writer for one session; every append is flushed and fsync'd."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._lock = asyncio.Lock()
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)

    def _append_sync(self, line: str) -> None:
        assert self.path is not None
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())

    def append_sync(self, record: CallRecord) -> None:
        """For paths that cannot await (a cancelled stream); one small write."""
        if self.path is not None:
            self._append_sync(record.model_dump_json() + "\n")

    async def append(self, record: CallRecord) -> None:
        if self.path is None:
            return
        line = record.model_dump_json() + "\n"
        async with self._lock:
            await asyncio.to_thread(self._append_sync, line)


def iter_records(path: Path) -> Iterator[tuple[int, CallRecord]]:
    """``(line number, record)`` for a session's JSONL; a corrupt line, or a record newer than this reader
    (``schema_version``), raises naming the file and line."""
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not a valid call record: {exc}") from None
            # Checked before validation so the message is this one, not a pydantic error dump.
            if isinstance(data, dict) and (why := newer_schema_error(data.get("schema_version"))) is not None:
                raise ValueError(f"{path}:{lineno}: {why}")
            try:
                yield lineno, CallRecord.model_validate(data)
            except ValueError as exc:
                raise ValueError(f"{path}:{lineno}: not a valid call record: {exc}") from None


def read_records(path: Path) -> list[CallRecord]:
    return [rec for _, rec in iter_records(path)]
