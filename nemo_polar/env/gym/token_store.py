"""NeMo Gym's ``TokenSink``/``TokenSource`` and ``LineageResolver`` over the proxy's durable record store.

The protocols are nemo-gym 0.7.0's ``nemo_gym.token_id_capture.protocols``, checked by its ``conformance.py``; Gym's
own file store (``store.py``) is the reference behaviour. A Gym or NeMo-RL process points :class:`PolarTokenStore` at
the proxy's ``--record-dir`` and puts, freezes, reads and retires a rollout's captures there; two sources coexist:

- The proxy's records, ``<record_dir>/<session_id>.jsonl``, written by the proxy alone (appended and fsync'd before
  each response ends). A rollout reads the session named like it (rollout id = session id, when no Gym rollout id
  was set) and every session bound to it with :meth:`PolarTokenStore.bind_session` (the Gym agent knows both ids: it
  puts ``rollout_id`` in the session's metadata). Their records are read as entries through the exporter
  (:mod:`.tokens`): a failed call makes the snapshot incomplete. The store never writes or deletes these files.
- Entries a Gym process ``put``s, in the store's own files beside them (``<record_dir>/gym-tokens/<rollout_id>/``,
  which no ``*.jsonl`` glob of the record dir picks up): ``entries/<sha256(call id)>.json`` (one canonical JSON entry
  each, written to a temporary file, fsync'd and ``os.replace``d, so an entry is whole or absent), ``state.json``
  (frozen, snapshot id, version, incomplete marks, bound sessions, the proxy files' sizes at the snapshot; replaced
  the same way), ``intents`` (``begin_call``) and ``refusals`` (``record_engine_refusal``), each appended and fsync'd,
  and ``lock`` (``flock``: one writer per rollout across processes).

Rules (each one a ``conformance.py`` check or a ``protocols.py`` sentence):

- ``put`` is durable when it returns; the same bytes again are a no-op; other bytes under a call id raise, after
  marking the rollout incomplete. A put after ``freeze`` raises (a hard fence) -- but the proxy cannot be fenced, so
  a proxy record written after the freeze is the relaxed fence: the next ``freeze`` or ``drop`` sees the session file
  grow, bumps the version and a ``drop`` of the older snapshot fails.
- ``mark_incomplete`` works after a freeze and bumps the version; ``begin_call`` intents without an entry or an
  engine refusal at freeze make the snapshot incomplete (Gym main's optional sink methods; a refused call has no
  entry and loses nothing, and a call both sampled and refused is a conflict). The proxy's own refused calls
  (:attr:`~nemo_polar.proxy.store.records.CallRecord.refused`) count as refusals, its other failed calls as incomplete.
- ``freeze`` is idempotent (same snapshot id, version and entries) and survives a new instance: the state is on disk.
  Entries are unique per call id: a put entry equal to a proxy record's entry counts once, a conflicting one makes
  the snapshot incomplete (fail closed at the reader).
- ``drop`` retires exactly the consumed snapshot: it deletes the put entries and intents and keeps a tombstone (a
  late writer still sees the rollout retired). The proxy's files stay: the proxy owns their retention, as a transport
  without delete does in Gym's protocol. ``delete`` is the unconditional clean-up of Gym's file store: it clears the
  retirement too.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, Field

from nemo_polar.env.gym.compat import IncrementalLineageStore, TokenCaptureSnapshot, TokenEntry, validate_rollout_id
from nemo_polar.env.gym.tokens import export_rollout
from nemo_polar.paths import atomic_write
from nemo_polar.proxy.store.records import CallRecord, RecordReader
from nemo_polar.proxy.store.sessions import SESSION_ID

SUBDIR = "gym-tokens"


class RolloutState(BaseModel):
    """``state.json``: what is not an entry. Unknown to Gym; read back only by this store."""

    frozen: bool = False
    retired: bool = False
    snapshot_id: str = ""
    version: int = 0
    incomplete_calls: list[str] = Field(default_factory=list, description="mark_incomplete call ids ('' allowed)")
    sessions: list[str] = Field(default_factory=list, description="proxy sessions bound to this rollout")
    proxy_sizes: dict[str, int] = Field(default_factory=dict, description="session -> bytes read at the snapshot")


def canonical(entry: TokenEntry) -> bytes:
    """The stored bytes of an entry; "same payload" in the protocol means these bytes."""
    return orjson.dumps(entry.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)


class PolarTokenStore:
    """``TokenSink`` + ``TokenSource`` over a proxy record dir (see the module docstring). Holds no handles: any
    number of instances, in any processes, share one directory."""

    def __init__(self, record_dir: str | Path) -> None:
        self.record_dir = Path(record_dir)
        self.root = self.record_dir / SUBDIR
        self.root.mkdir(parents=True, exist_ok=True)

    # -- layout -------------------------------------------------------------------------------------------------
    def rollout_dir(self, rollout_id: str) -> Path:
        return self.root / validate_rollout_id(rollout_id)

    def entries_dir(self, rollout_id: str) -> Path:
        return self.rollout_dir(rollout_id) / "entries"

    def _entry_path(self, rollout_id: str, call_id: str) -> Path:
        return self.entries_dir(rollout_id) / f"{hashlib.sha256(call_id.encode()).hexdigest()}.json"

    @contextlib.contextmanager
    def locked(self, rollout_id: str, *, shared: bool = False) -> Iterator[None]:
        """The rollout's ``flock``: exclusive for writers, shared for readers that must not see a half-done change."""
        directory = self.rollout_dir(rollout_id)
        directory.mkdir(exist_ok=True)
        with (directory / "lock").open("a+b") as fh:
            fcntl.flock(fh.fileno(), fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)

    def _state(self, rollout_id: str) -> RolloutState:
        path = self.rollout_dir(rollout_id) / "state.json"
        return RolloutState.model_validate_json(path.read_bytes()) if path.exists() else RolloutState()

    def _save(self, rollout_id: str, state: RolloutState) -> None:
        atomic_write(self.rollout_dir(rollout_id) / "state.json", state.model_dump_json().encode())

    @staticmethod
    def _writable(rollout_id: str, state: RolloutState, *, after_freeze: bool = False) -> None:
        if state.retired:
            raise RuntimeError(f"token capture for rollout {rollout_id} is retired")
        if state.frozen and not after_freeze:
            raise RuntimeError(f"token capture for rollout {rollout_id} is already frozen")

    # -- the proxy's records ------------------------------------------------------------------------------------
    def _sessions(self, rollout_id: str, state: RolloutState) -> list[str]:
        """The proxy sessions read under ``rollout_id``: the one of that id, if it exists, and the bound ones."""
        own = SESSION_ID.match(rollout_id) and (self.record_dir / f"{rollout_id}.jsonl").exists()
        return sorted({*([rollout_id] if own else []), *state.sessions})

    def _proxy_lines(self, sessions: list[str]) -> dict[str, bytes]:
        """Each session file's whole lines. A line without its newline is an append in flight (the proxy does not
        take this store's lock): it is read once it is whole."""
        lines = {}
        for session_id in sessions:
            path = self.record_dir / f"{session_id}.jsonl"
            data = path.read_bytes() if path.exists() else b""
            lines[session_id] = data[: data.rfind(b"\n") + 1]
        return lines

    def _proxy_records(self, lines: dict[str, bytes]) -> list[CallRecord]:
        records = []
        for session_id, data in lines.items():
            reader = RecordReader()  # one per file: a prompt may be stored against an earlier line of it
            for lineno, line in enumerate(data.splitlines(), 1):
                if line.strip():
                    try:
                        records.append(reader.decode(json.loads(line)))
                    except ValueError as exc:
                        path = self.record_dir / f"{session_id}.jsonl"
                        raise ValueError(f"{path}:{lineno}: not a readable call record: {exc}") from None
        return records

    @staticmethod
    def _proxy_moved(state: RolloutState, lines: dict[str, bytes]) -> bool:
        """Whether a session file grew since the snapshot; if so the version moves (the relaxed fence). ``lines`` is
        the one read the caller's snapshot is made of, so what the state records is exactly what was read."""
        sizes = {session_id: len(data) for session_id, data in lines.items()}
        if sizes == state.proxy_sizes:
            return False
        state.proxy_sizes = sizes
        state.version += 1
        return True

    # -- TokenSink ----------------------------------------------------------------------------------------------
    async def put(self, entry: TokenEntry) -> None:
        await asyncio.to_thread(self.put_now, entry)

    def put_now(self, entry: TokenEntry) -> None:
        payload = canonical(entry)
        rollout_id = entry.rollout_id
        with self.locked(rollout_id):
            state = self._state(rollout_id)
            self._writable(rollout_id, state)
            path = self._entry_path(rollout_id, entry.model_call_id)
            if path.exists():
                if path.read_bytes() == payload:
                    return
                state.incomplete_calls.append(entry.model_call_id)
                state.version += 1
                self._save(rollout_id, state)
                raise ValueError(
                    f"model call {entry.model_call_id!r} of rollout {rollout_id!r} was put with other bytes"
                )
            path.parent.mkdir(exist_ok=True)
            atomic_write(path, payload)

    async def mark_incomplete(self, rollout_id: str, model_call_id: str = "") -> None:
        await asyncio.to_thread(self.mark_incomplete_now, rollout_id, model_call_id)

    def mark_incomplete_now(self, rollout_id: str, model_call_id: str = "") -> None:
        with self.locked(rollout_id):
            state = self._state(rollout_id)
            self._writable(rollout_id, state, after_freeze=True)
            state.incomplete_calls.append(model_call_id)
            state.version += 1
            self._save(rollout_id, state)

    async def begin_call(self, rollout_id: str, model_call_id: str) -> None:
        """Gym's optional pre-dispatch intent: an intent without an entry at freeze masks the rollout."""
        await asyncio.to_thread(self._append, rollout_id, "intents", model_call_id.encode())

    async def record_engine_refusal(
        self, rollout_id: str, *, model_call_id: str, code: str, parent_call_id: str | None = None, **detail: Any
    ) -> None:
        """Gym main's optional refusal record: the engine refused the call before sampling, so the call is resolved
        (its ``begin_call`` intent no longer masks the rollout) without an entry. Durable when it returns; a write,
        so refused after a freeze like a put."""
        refusal = {"model_call_id": model_call_id, "code": code, "parent_call_id": parent_call_id, **detail}
        line = orjson.dumps(refusal, option=orjson.OPT_SORT_KEYS)  # raises on what JSON cannot hold
        await asyncio.to_thread(self._append, rollout_id, "refusals", line)

    def _append(self, rollout_id: str, name: str, line: bytes) -> None:
        with self.locked(rollout_id):
            self._writable(rollout_id, self._state(rollout_id))
            with (self.rollout_dir(rollout_id) / name).open("ab") as fh:
                fh.write(line + b"\n")
                fh.flush()
                os.fsync(fh.fileno())

    def _lines(self, rollout_id: str, name: str) -> list[bytes]:
        path = self.rollout_dir(rollout_id) / name
        return path.read_bytes().splitlines() if path.exists() else []

    async def bind_session(self, rollout_id: str, session_id: str) -> None:
        """Read proxy session ``session_id``'s records under ``rollout_id`` (before the rollout is frozen)."""
        await asyncio.to_thread(self.bind_session_now, rollout_id, session_id)

    def bind_session_now(self, rollout_id: str, session_id: str) -> None:
        if not SESSION_ID.match(session_id):
            raise ValueError(f"not a proxy session id: {session_id!r}")
        with self.locked(rollout_id):
            state = self._state(rollout_id)
            self._writable(rollout_id, state)
            if session_id not in state.sessions:
                state.sessions.append(session_id)
                self._save(rollout_id, state)

    # -- TokenSource --------------------------------------------------------------------------------------------
    async def freeze(self, rollout_id: str) -> TokenCaptureSnapshot:
        return await asyncio.to_thread(self.freeze_now, rollout_id)

    def freeze_now(self, rollout_id: str) -> TokenCaptureSnapshot:
        with self.locked(rollout_id):
            state = self._state(rollout_id)
            self._writable(rollout_id, state, after_freeze=True)
            lines = self._proxy_lines(self._sessions(rollout_id, state))
            if not state.frozen:
                state.frozen, state.snapshot_id, state.version = True, uuid.uuid4().hex, state.version + 1
                state.proxy_sizes = {session_id: len(data) for session_id, data in lines.items()}
                self._save(rollout_id, state)
            elif self._proxy_moved(state, lines):
                self._save(rollout_id, state)
            proxy = export_rollout(self._proxy_records(lines), rollout_id)
            entries, conflicts = self._entries(rollout_id, proxy.entries)
            intents = {line.decode() for line in self._lines(rollout_id, "intents")}
            refused = {r.model_call_id for r in proxy.refused} | {
                orjson.loads(line)["model_call_id"] for line in self._lines(rollout_id, "refusals")
            }
            sampled = {e.model_call_id for e in entries}
            dangling = intents - sampled - refused
            conflicts += sorted(refused & sampled)  # a call both sampled and refused: one of them is wrong
            return TokenCaptureSnapshot(
                rollout_id=rollout_id,
                entries=tuple(entries),
                incomplete=bool(state.incomplete_calls or proxy.incomplete_call_ids or dangling or conflicts),
                snapshot_id=state.snapshot_id,
                version=state.version,
            )

    def _entries(self, rollout_id: str, proxy: list[TokenEntry]) -> tuple[list[TokenEntry], list[str]]:
        """The proxy's entries and the put ones, one per call id; and the call ids seen with two payloads."""
        by_id: dict[str, tuple[bytes, TokenEntry]] = {e.model_call_id: (canonical(e), e) for e in proxy}
        conflicts: list[str] = []
        directory = self.entries_dir(rollout_id)
        for path in sorted(directory.glob("*.json")) if directory.exists() else []:
            payload = path.read_bytes()
            entry = TokenEntry.model_validate_json(payload)
            seen = by_id.get(entry.model_call_id)
            if seen is None:
                by_id[entry.model_call_id] = (payload, entry)
            elif seen[0] != payload:
                conflicts.append(entry.model_call_id)
        return [entry for _, entry in by_id.values()], conflicts

    async def drop(self, rollout_id: str, *, snapshot_id: str, version: int) -> bool:
        return await asyncio.to_thread(self.drop_now, rollout_id, snapshot_id, version)

    def drop_now(self, rollout_id: str, snapshot_id: str, version: int) -> bool:
        with self.locked(rollout_id):
            state = self._state(rollout_id)
            if state.frozen and self._proxy_moved(state, self._proxy_lines(self._sessions(rollout_id, state))):
                self._save(rollout_id, state)  # a proxy record landed after the snapshot: it is stale
                return False
            if not state.frozen or state.snapshot_id != snapshot_id or state.version != version:
                return False
            shutil.rmtree(self.entries_dir(rollout_id), ignore_errors=True)
            for name in ("intents", "refusals"):
                (self.rollout_dir(rollout_id) / name).unlink(missing_ok=True)
            state.retired = True
            self._save(rollout_id, state)
            return True

    def delete(self, rollout_id: str) -> None:
        """Unconditionally remove what this store holds for a rollout -- its put entries, intents, refusals, marks,
        bound sessions and its freeze or retirement -- as Gym's file store's ``delete`` does (administrative
        clean-up before a rollout id is used again; consumers ``drop``). The lock stays, so concurrent callers keep
        one inode; the proxy's records stay too (the proxy owns them), so a rollout named like a proxy session
        reads that session again."""
        with self.locked(rollout_id):
            directory = self.rollout_dir(rollout_id)
            shutil.rmtree(directory / "entries", ignore_errors=True)
            for name in ("intents", "refusals", "state.json"):
                (directory / name).unlink(missing_ok=True)

    async def close(self) -> None:
        """Nothing to release: every write was durable before it returned."""


class PolarLineageStore(IncrementalLineageStore):
    """Gym's ``LineageResolver`` over the entries put into a :class:`PolarTokenStore`: Gym's own matcher
    (``IncrementalLineageStore``, as ``protocols.py`` asks external stores to embed) with this store's files as its
    backend. Cursor: the entry files already indexed; ref: an entry file. The proxy's records carry no continuation
    fingerprint (see :mod:`.tokens`), so they are not indexed here."""

    def __init__(self, record_dir: str | Path, **cache: Any) -> None:
        super().__init__(**cache)
        self._store = PolarTokenStore(record_dir)

    def _read_locked(self, rollout_id: str) -> contextlib.AbstractContextManager[None]:
        return self._store.locked(rollout_id, shared=True)

    def _fetch_new_entries(self, rollout_id: str, cursor: Any) -> tuple[list[tuple[TokenEntry, Any]], Any]:
        directory = self._store.entries_dir(rollout_id)
        names = sorted(p.name for p in directory.glob("*.json")) if directory.exists() else []
        seen: frozenset[str] = cursor or frozenset()
        if not seen <= set(names):  # retired: the files went away
            raise IncrementalLineageStore.CursorReset
        fresh = [directory / name for name in names if name not in seen]
        return [(TokenEntry.model_validate_json(path.read_bytes()), path) for path in fresh], frozenset(names)

    def _load_entry(self, rollout_id: str, ref: Any) -> TokenEntry:
        return TokenEntry.model_validate_json(Path(ref).read_bytes())
