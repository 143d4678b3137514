"""Proxy call records in NeMo Gym's token-capture language: one ``TokenEntry`` per model call.

The spec is nemo-gym 0.7.0's ``nemo_gym.token_id_capture`` (``records.py``: ``TokenEntry``, ``stamp_lineage``;
``sink.py``: how a capture is committed or marked incomplete; ``store.py``: the reference sink and source). This module
lives in ``env/gym`` rather than ``reconstruct/`` because every function here builds or returns Gym's own pydantic
class: ``env/gym`` is the layer that already requires nemo-gym, so ``reconstruct/`` stays importable without that
optional dependency (``polar reconstruct --format gym-token-entries`` imports this module only for that format).

Record -> entry, field by field:

- ``model_call_id`` = ``call_id``; ``rollout_id`` = :func:`rollout_id_of` the session (the Gym agent's
  ``metadata.rollout_id`` when the caller knows it, else the session id: records themselves do not carry session
  metadata, so the caller passes the mapping).
- ``prompt_token_ids``, ``generation_token_ids``, ``generation_log_probs`` = the record's exact engine ids and
  logprobs; ``model`` = the model the harness asked for; ``created_at`` = when the record was written (Gym stamps
  capture time, after the response), ``response_id`` stays unset (the proxy does not record the ids it minted).
- ``output_items``: the assistant turn as Responses output items (``reasoning``, ``message``, ``function_call``),
  parsed from the sampled text the way the proxy parsed it for the harness; ``token_item_index`` = the last item.
- Lineage is the proxy's own request-time decision, stamped with Gym's ``stamp_lineage`` (``cum_len``, ``digest``):
  a record the proxy continued (``parent_call_id``) is ``RESOLVED``; a request without model-authored history
  (``render_reason`` ``first_call``/``new_conversation``) is a ``ROOT``; a request with history the proxy could not
  prove (``history_diverged``, ``assistant_turn_not_from_proxy``, ``delta_render_failed``, ...) is ``UNRESOLVED``
  with that reason in ``parent_resolution_reason`` -- Gym's rule that an unproven continuation never becomes a root.
  ``prefix_requested``/``prefix_supplied`` say whether the engine was given the parent's exact ids (continuation
  and ``chat_prefix`` modes) and whether the prompt proves it.
- Entries are not stamped with ``stamp_continuation``: Gym's request-time resolver serves calls Gym's own model
  server captures, while the proxy resolved these parents itself, token-exactly; unstamped entries are invisible to
  resolution, as Gym documents.
- A failed call (``complete: false``) has no entry. One the serving side refused before sampling
  (:attr:`CallRecord.refused <nemo_polar.proxy.store.records.CallRecord.refused>`: context too long, a conversation the
  template refuses) lost nothing: it is an engine refusal (:attr:`TokenExport.refused`), which Gym main's sinks record
  with ``record_engine_refusal`` -- it resolves the call -- and a sink without that method (Gym 0.7.0) as an
  incomplete mark. Any other failed call (an engine fault, a client gone mid-stream) is a call of the rollout without
  a capture, which Gym marks with ``TokenSink.mark_incomplete(rollout_id, model_call_id)`` so that consumers mask the
  rollout (:attr:`TokenExport.incomplete_call_ids`).
- Extra keys (``TokenEntry`` allows them): ``polar_session_id``, ``polar_policy_version``, ``polar_finish_reason``,
  ``polar_mode``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from nemo_polar.env.gym.compat import (
    ParentResolutionStatus,
    TokenCaptureStore,
    TokenEntry,
    TokenSink,
    stamp_lineage,
    validate_rollout_id,
)
from nemo_polar.proxy.conversation import Message
from nemo_polar.proxy.store.records import CallRecord
from nemo_polar.reconstruct.export import conversation, output_message

# Reasons the proxy renders a request afresh because it has no model-authored history: Gym's ROOT.
ROOT_REASONS = frozenset({"first_call", "new_conversation"})


class EngineRefusal(BaseModel):
    """A call refused before sampling, as Gym main's ``record_engine_refusal`` takes it."""

    model_call_id: str
    code: str = Field(description="the error code the harness got, else http_<status>")
    parent_call_id: str | None = None
    status: int
    message: str | None = None

    @classmethod
    def of(cls, record: CallRecord) -> EngineRefusal:
        return cls(
            model_call_id=record.call_id,
            code=record.error_code or f"http_{record.status_code}",
            parent_call_id=record.parent_call_id,
            status=record.status_code,
            message=record.error,
        )


class TokenExport(BaseModel):
    """One rollout's captures: entries for its completed calls, the calls refused before sampling, and the calls
    that failed otherwise (Gym's incomplete marks)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    rollout_id: str
    session_ids: list[str] = Field(default_factory=list)
    entries: list[TokenEntry] = Field(default_factory=list)
    refused: list[EngineRefusal] = Field(default_factory=list)
    incomplete_call_ids: list[str] = Field(default_factory=list)


def rollout_id_of(session_id: str, metadata: Mapping[str, Any] | None = None) -> str:
    """A session's Gym rollout id: ``metadata["rollout_id"]`` (what the Gym agent puts in the session's metadata),
    else the session id. Validated the way Gym's store validates keys."""
    rollout_id = (metadata or {}).get("rollout_id")
    return validate_rollout_id(str(rollout_id) if rollout_id else session_id)


def lineage(record: CallRecord) -> tuple[str | None, ParentResolutionStatus | None, str]:
    """``(parent_call_id, parent_resolution, reason)``: the proxy's request-time parent decision in Gym's terms. A
    record without ``render_reason`` (written by hand, or before it existed) has no decision: ``None``, Gym's value for
    callers that do not provide one, which its builder treats as an unproven boundary."""
    if record.parent_call_id is not None:
        return record.parent_call_id, ParentResolutionStatus.RESOLVED, ""
    if record.render_reason is None:
        return None, None, ""
    reason = record.render_reason.removeprefix("engine_render:")
    if reason in ROOT_REASONS:
        return None, ParentResolutionStatus.ROOT, ""
    return None, ParentResolutionStatus.UNRESOLVED, reason


def output_items(record: CallRecord) -> list[dict[str, Any]]:
    """The call's assistant turn as Responses output items, content only (token arrays live on the entry)."""
    try:
        msg = output_message(record, conversation(record))
    except ValueError:  # an unparseable request: the text is still the model's
        msg = Message(role="assistant", content=record.output_text or "")
    items: list[dict[str, Any]] = []
    if msg.reasoning:
        items.append({"type": "reasoning", "summary": [{"type": "summary_text", "text": msg.reasoning}]})
    if msg.content or not msg.tool_calls:
        text = {"type": "output_text", "text": msg.content, "annotations": []}
        message = {"type": "message", "id": f"msg_{record.call_id}", "role": "assistant", "status": "completed"}
        items.append({**message, "content": [text]})
    for call in msg.tool_calls:
        items.append(
            {
                "type": "function_call",
                "call_id": call.id,
                "name": call.name,
                "arguments": call.arguments,
                "status": "completed",
            }
        )
    return items


def _extends(child: CallRecord, parent: CallRecord) -> bool:
    n = len(parent.prompt_token_ids)
    full = n + len(parent.sampled_token_ids)
    prompt = child.prompt_token_ids
    return full <= len(prompt) and prompt[:n] == parent.prompt_token_ids and prompt[n:full] == parent.sampled_token_ids


def token_entry(record: CallRecord, rollout_id: str, parent: CallRecord | None = None) -> TokenEntry:
    """One completed call as a ``TokenEntry``; ``parent`` is the record ``parent_call_id`` names, when at hand (it
    decides ``prefix_supplied``)."""
    if not record.complete:
        raise ValueError(f"record {record.call_id} is not complete: a failed call is an incomplete mark, not an entry")
    parent_id, status, reason = lineage(record)
    requested = parent_id is not None and record.mode != "chat"  # continuation and chat_prefix send the parent's ids
    items = output_items(record)
    body = record.request if isinstance(record.request, dict) else {}
    entry = TokenEntry(
        rollout_id=validate_rollout_id(rollout_id),
        model_call_id=record.call_id,
        model=str(body.get("model") or ""),
        prompt_token_ids=list(record.prompt_token_ids),
        generation_token_ids=list(record.sampled_token_ids),
        generation_log_probs=list(record.sampled_logprobs),
        output_items=items,
        token_item_index=len(items) - 1 if items else None,
        created_at=record.finished_at or record.started_at,
        prefix_requested=requested,
        prefix_supplied=requested and parent is not None and _extends(record, parent),
        polar_session_id=record.session_id,
        polar_policy_version=record.policy_version,
        polar_finish_reason=record.finish_reason,
        polar_mode=record.mode,
    )
    stamp_lineage(entry, parent_id, parent_resolution=status)
    entry.parent_resolution_reason = reason
    return entry


def export_rollout(records: Iterable[CallRecord], rollout_id: str) -> TokenExport:
    """One rollout's records (one or more sessions) as entries, in call order, plus its refused and failed calls."""
    ordered = sorted(records, key=lambda r: (r.started_at, r.call_id))
    by_id = {r.call_id: r for r in ordered}
    out = TokenExport(rollout_id=validate_rollout_id(rollout_id), session_ids=sorted({r.session_id for r in ordered}))
    for rec in ordered:
        if rec.complete:
            out.entries.append(token_entry(rec, rollout_id, by_id.get(rec.parent_call_id or "")))
        elif rec.refused:
            out.refused.append(EngineRefusal.of(rec))
        else:
            out.incomplete_call_ids.append(rec.call_id)
    return out


def export_sessions(
    sessions: Mapping[str, Iterable[CallRecord]], rollout_ids: Mapping[str, str] | None = None
) -> list[TokenExport]:
    """Sessions (as :func:`nemo_polar.reconstruct.io.load_records` groups them) as rollouts; ``rollout_ids`` maps a
    session id to its rollout id (default: the session id). Sessions mapped to one rollout are exported together."""
    grouped: dict[str, list[CallRecord]] = {}
    for session_id, records in sessions.items():
        grouped.setdefault(rollout_id_of(session_id, {"rollout_id": (rollout_ids or {}).get(session_id)}), []).extend(
            records
        )
    return [export_rollout(records, rollout_id) for rollout_id, records in sorted(grouped.items())]


async def publish(sink: TokenSink, exports: Iterable[TokenExport]) -> int:
    """Put every entry into any Gym ``TokenSink`` (Gym's file store, :class:`~.token_store.PolarTokenStore`, a
    framework transport), record each refused call where the sink can (Gym main's optional
    ``record_engine_refusal``; else it is marked incomplete) and mark each failed call incomplete, as Gym's capture
    path does. Returns the entries put."""
    n = 0
    for export in exports:
        for entry in export.entries:
            await sink.put(entry)
            n += 1
        record_refusal = getattr(sink, "record_engine_refusal", None)
        for refusal in export.refused:
            if record_refusal is None:
                await sink.mark_incomplete(export.rollout_id, refusal.model_call_id)
            else:
                await record_refusal(export.rollout_id, **refusal.model_dump(exclude={"status", "message"}))
        for call_id in export.incomplete_call_ids:
            await sink.mark_incomplete(export.rollout_id, call_id)
    return n


def write_token_store(exports: list[TokenExport], directory: Path) -> int:
    """Write rollouts into a NeMo Gym token store directory (Gym's own ``TokenCaptureStore``: what its
    ``trajectories_for_rollout(rollout_id, [directory])`` reads). A rollout already there is replaced."""
    store = TokenCaptureStore(directory)
    for export in exports:
        store.delete(export.rollout_id)
    return asyncio.run(publish(store, exports))
