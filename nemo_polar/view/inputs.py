"""The report's inputs read and grouped by session: session directories (``session.json``, ``records.jsonl``,
``patch.diff``, logs, ``grade.json`` or a gateway's ``outcome.json``), directories holding them or record files,
records JSONL and traces JSONL. Bad input raises :class:`ReportError` naming the path."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ValidationError

from nemo_polar.env.gateway import SessionOutcome
from nemo_polar.env.runtime.attempt import AttemptDir
from nemo_polar.env.runtime.session import SessionResult
from nemo_polar.proxy.store.records import CallRecord
from nemo_polar.reconstruct.io import load_records
from nemo_polar.reconstruct.trace import Trace
from nemo_polar.rewards.grader import GradeResult

TEXT_CAP = 200_000  # characters of a patch or log kept (a log's tail: that is where failures are)
SEARCH_DEPTH = 3  # runs/<env>/<instance>-<time>/ is the deepest layout the project writes
M = TypeVar("M", bound=BaseModel)


class ReportError(ValueError):
    """Bad input: the message names the path."""


def _model(path: Path, model: type[M]) -> M:
    try:
        return model.model_validate_json(path.read_bytes())
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(map(str, first["loc"])) or "(root)"
        raise ReportError(f"{path}: not a valid {model.__name__}: {where}: {first['msg']}") from None


def _text(path: Path, *, tail: bool = False) -> str:
    text = path.read_text(errors="replace")
    if len(text) <= TEXT_CAP:
        return text
    cut = len(text) - TEXT_CAP
    return f"[{cut} characters not shown]\n" + text[-TEXT_CAP:] if tail else text[:TEXT_CAP] + f"\n[{cut} more]"


@dataclass
class SessionDir:
    """What the report read of one attempt directory (:class:`~nemo_polar.env.runtime.attempt.AttemptDir`)."""

    path: Path
    result: SessionResult | None = None
    outcome: SessionOutcome | None = None
    grade: GradeResult | None = None
    request: dict[str, Any] | None = None
    patch: str | None = None
    grader_log: tuple[str, str] | None = None  # (where, text)
    logs: list[tuple[str, str]] = field(default_factory=list)
    records: list[CallRecord] = field(default_factory=list)

    @property
    def outcome_id(self) -> str | None:
        return self.outcome.request_id if self.outcome is not None else None


def read_session_dir(path: Path) -> SessionDir:
    attempt = AttemptDir(path)
    d = SessionDir(path)
    if attempt.session.is_file():
        d.result = _model(attempt.session, SessionResult)
    if attempt.outcome.is_file():
        d.outcome = _model(attempt.outcome, SessionOutcome)
    if attempt.grade.is_file():
        d.grade = _model(attempt.grade, GradeResult)
    elif d.outcome is not None and d.outcome.grade is not None:  # the gateway keeps the grade in the outcome
        d.grade = d.outcome.grade
    if attempt.request.is_file():
        try:
            d.request = json.loads(attempt.request.read_text())
        except json.JSONDecodeError as exc:
            raise ReportError(f"{attempt.request}: not JSON: {exc}") from None
    if attempt.patch.is_file():
        d.patch = _text(attempt.patch)
    if attempt.records.is_file():
        d.records = _records(attempt.records)
    log = d.grade.log_path if d.grade is not None else None
    if log is None or not log.is_file():  # the grade's own path, else where the evaluator writes under the session
        log = next(iter(sorted(attempt.eval.glob("*/eval.stdout.log"))), None)
    if log is not None and log.is_file():
        d.grader_log = (str(log), _text(log, tail=True))
    for suffix in (".stderr.log", ".stdout.log"):
        path_log = attempt.harness_logs.with_suffix(suffix)
        if path_log.is_file():
            d.logs.append((path_log.name, _text(path_log, tail=True)))
    return d


def _records(path: Path) -> list[CallRecord]:
    try:
        return [r for recs in load_records([path]).values() for r in recs]
    except ValueError as exc:
        raise ReportError(str(exc)) from None


def _traces(path: Path) -> list[Trace]:
    out = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if line.strip():
                try:
                    out.append(Trace.model_validate_json(line))
                except ValidationError as exc:
                    raise ReportError(f"{path}:{lineno}: not a valid trace: {exc.errors()[0]['msg']}") from None
    return out


def _jsonl_kind(path: Path, *, strict: bool = True) -> Literal["records", "traces"] | None:
    """What a JSONL file holds, by its first row; anything else raises (``strict``) or is None."""
    with path.open(encoding="utf-8", errors="replace") as fh:
        first = next((line for line in fh if line.strip()), None)
    try:
        row = json.loads(first) if first is not None else None
    except json.JSONDecodeError:
        row = None
    keys = set(row) if isinstance(row, dict) else set()
    if {"call_id", "prompt_token_ids"} <= keys:
        return "records"
    if {"trace_id", "response_ids", "loss_mask"} <= keys:
        return "traces"
    if not strict:
        return None
    if first is None:
        raise ReportError(f"{path}: empty file: expected a records or traces JSONL")
    if row is None:
        raise ReportError(f"{path}: not JSONL: expected a records or traces JSONL")
    shown = ", ".join(sorted(keys)[:8]) or type(row).__name__
    raise ReportError(f"{path}: not a records or traces JSONL (first line has: {shown})")


def _is_session_dir(path: Path) -> bool:
    a = AttemptDir(path)
    return any(f.is_file() for f in (a.session, a.records, a.outcome, a.grade))


def _search(root: Path, depth: int) -> tuple[list[Path], list[Path]]:
    """Session directories and JSONL files under ``root``, without descending into a session directory."""
    dirs: list[Path] = []
    files: list[Path] = []
    for child in sorted(root.iterdir()):
        if child.is_dir() and _is_session_dir(child):
            dirs.append(child)
        elif child.is_dir() and depth > 1:
            more_dirs, more_files = _search(child, depth - 1)
            dirs += more_dirs
            files += more_files
        elif child.is_file() and child.suffix == ".jsonl":
            files.append(child)
    return dirs, files


def _started(d: SessionDir) -> tuple[float, str]:
    return min((r.started_at for r in d.records), default=float("inf")), str(d.path)


@dataclass
class Entry:
    session_id: str
    sources: list[str] = field(default_factory=list)
    dir: SessionDir | None = None
    records: dict[str, CallRecord] = field(default_factory=dict)
    traces: list[Trace] | None = None


def collect(inputs: Sequence[Path]) -> list[Entry]:
    """Read every input, grouped by session id in order of first appearance."""
    entries: dict[str, Entry] = {}

    def entry(key: str, session_id: str, source: Path) -> Entry:
        e = entries.setdefault(key, Entry(session_id))
        if str(source) not in e.sources:
            e.sources.append(str(source))
        return e

    def add_file(path: Path) -> None:
        if _jsonl_kind(path) == "records":
            for rec in _records(path):
                entry(rec.session_id, rec.session_id, path).records.setdefault(rec.call_id, rec)
        else:
            for trace in _traces(path):
                e = entry(trace.session_id, trace.session_id, path)
                e.traces = [*(e.traces or []), trace]

    for path in inputs:
        if not path.exists():
            raise ReportError(f"{path}: no such file or directory")
        attempt = AttemptDir(path.parent)
        if path.is_file() and path in (attempt.session, attempt.outcome, attempt.grade):
            path = path.parent  # session.json / outcome.json / grade.json stand for their session directory
        if path.is_dir():
            dirs, files = ([path], []) if _is_session_dir(path) else _search(path, SEARCH_DEPTH)
            # chronological: a runs/ or state_dir names sessions by id or request, not by when they ran
            for sd in sorted(map(read_session_dir, dirs), key=_started):
                sid = sd.result.session_id if sd.result else sd.records[0].session_id if sd.records else None
                # a session that never reached the proxy (cancelled while queued) has no id: its directory is it
                e = entry(sid or f"dir:{sd.path}", sid or sd.outcome_id or sd.path.name, sd.path)
                e.dir = sd
                for rec in sd.records:
                    e.records.setdefault(rec.call_id, rec)
            usable = [f for f in files if _jsonl_kind(f, strict=False)]  # found, not named: skip other JSONL
            if not dirs and not usable:
                raise ReportError(f"{path}: holds no session directory and no records or traces JSONL")
            for f in usable:
                add_file(f)
        elif path.is_file():
            if path.suffix != ".jsonl":
                raise ReportError(
                    f"{path}: unrecognised input: expected a session directory, a records JSONL or a traces JSONL"
                )
            add_file(path)
        else:
            raise ReportError(f"{path}: not a regular file or directory")
    return list(entries.values())
