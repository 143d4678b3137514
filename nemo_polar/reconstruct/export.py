"""Offline export of traces: SFT rows (chat messages beside the exact token fields) as JSONL or Parquet, NeMo Gym
result rows, or the traces themselves.

A row's ``messages`` are the last call's request, normalised by the proxy's own API parser (the harness's view of
the conversation: system prompt, user turns, tool results, assistant turns as the harness echoed them), followed by
that call's output, parsed from its sampled text the way the proxy parsed it for the harness. The token fields are
the trace itself: exactly what the engine was given and sampled. In ``chat`` mode the engine's own tool-call
(and reasoning) parsers take those parts out of the text the proxy records, so the last message can lack tool
calls that ``response_ids`` hold.

``tools`` (OpenAI function tools, as the template saw them) and ``metadata`` are JSON text: their shape varies from
row to row (tool schemas, free keys), and one fixed Arrow schema is what makes a Parquet file load back equal to
the rows it was written from.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from nemo_polar.proxy.apis import get_adapter
from nemo_polar.proxy.conversation import Conversation, Message, ToolCall
from nemo_polar.proxy.errors import ProxyError
from nemo_polar.proxy.parse.parser import StreamParser
from nemo_polar.proxy.store.records import CallRecord
from nemo_polar.reconstruct.gym import gym_output_items
from nemo_polar.reconstruct.trace import Role, Trace

Format = Literal["traces", "gym", "sft-jsonl", "sft-parquet"]
FORMATS: tuple[Format, ...] = ("traces", "gym", "sft-jsonl", "sft-parquet")


class SFTFunction(BaseModel):
    name: str
    arguments: str = Field(description="JSON text of the arguments object")


class SFTToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: SFTFunction


class SFTMessage(BaseModel):
    """An OpenAI chat message; every key is always present so that all rows share one schema."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str
    reasoning_content: str | None = None
    tool_calls: list[SFTToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None


class SFTRow(BaseModel):
    trace_id: str
    session_id: str
    messages: list[SFTMessage]
    tools: str = Field(default="[]", description="JSON text of the OpenAI tools the template rendered")
    prompt_token_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float | None]
    weight: float
    reward: float | None = None
    advantage: float | None = None
    role: Role
    segment: int
    break_reason: str | None = None
    call_ids: list[str]
    metadata: str = Field(default="{}", description="JSON text: api, mode, model, ... and the caller's metadata")


def conversation(rec: CallRecord) -> Conversation:
    """The record's request body, normalised by the parser of its API."""
    try:
        return get_adapter(rec.api).parse(rec.request)
    except ProxyError as exc:
        raise ValueError(f"record {rec.call_id}: {rec.api} request cannot be parsed: {exc.message}") from None


def output_message(rec: CallRecord, conv: Conversation) -> Message:
    """The assistant turn a call produced: as the proxy read it in the model's format and answered the harness (its
    record's ``output``), or, for records written before they carried it, parsed from the sampled text by the
    in-process parser (hermes/qwen3_coder; tool-call ids made up)."""
    if rec.output is not None:
        return Message.model_validate({"role": "assistant", **rec.output})
    parser = StreamParser(param_types=conv.param_type)
    msg = Message(role="assistant")
    for ev in [*parser.feed(rec.output_text or ""), *parser.finish()]:
        if ev.kind == "reasoning":
            msg.reasoning = (msg.reasoning or "") + ev.text
        elif ev.kind == "text":
            msg.content += ev.text
        elif ev.call is not None:
            call_id = f"call_{rec.call_id}_{len(msg.tool_calls)}"
            msg.tool_calls.append(ToolCall(id=call_id, name=ev.call.name, arguments=ev.call.arguments))
    return msg


def _sft_message(msg: Message, model_ids: Mapping[str, str]) -> SFTMessage:
    """A message of an SFT row; a call id the model itself wrote (``model_ids``: the harness's id -> the model's, as
    Mistral's format carries them) replaces the harness's, in the call and in the tool result that answers it."""
    return SFTMessage(
        role=msg.role,
        content=msg.content,
        reasoning_content=msg.reasoning or None,
        tool_calls=[
            SFTToolCall(id=model_ids.get(c.id, c.id), function=SFTFunction(name=c.name, arguments=c.arguments))
            for c in msg.tool_calls
        ],
        tool_call_id=model_ids.get(msg.tool_call_id or "", msg.tool_call_id) if msg.role == "tool" else None,
    )


def model_call_ids(trace: Trace, records: Mapping[str, CallRecord]) -> dict[str, str]:
    """The harness's call id -> the id the model wrote, for the trace's calls whose format carries one."""
    return {
        call["id"]: call["template_id"]
        for span in trace.spans
        if span.call_id in records and records[span.call_id].output
        for call in (records[span.call_id].output or {}).get("tool_calls", [])
        if call.get("template_id")
    }


def _by_id(records: Iterable[CallRecord] | Mapping[str, CallRecord]) -> Mapping[str, CallRecord]:
    return records if isinstance(records, Mapping) else {r.call_id: r for r in records}


def _last_record(trace: Trace, records: Mapping[str, CallRecord]) -> CallRecord:
    if not trace.spans:
        raise ValueError(f"trace {trace.trace_id} has no calls")
    call_id = trace.spans[-1].call_id
    if call_id not in records:
        raise ValueError(f"trace {trace.trace_id}: no record for call {call_id}")
    return records[call_id]


def sft_row(trace: Trace, records: Mapping[str, CallRecord], metadata: Mapping[str, Any] | None = None) -> SFTRow:
    last = _last_record(trace, records)
    conv = conversation(last)
    model_ids = model_call_ids(trace, records)
    tools = conv.template_tools() if conv.tool_choice != "none" else None  # what the proxy rendered
    meta: dict[str, Any] = {
        "api": last.api,
        "mode": last.mode,
        "model": conv.model,
        "finish_reason": last.finish_reason,
        "policy_versions": trace.policy_versions,
    }
    if conv.ignored:
        meta["ignored"] = conv.ignored
    meta.update(metadata or {})
    return SFTRow(
        trace_id=trace.trace_id,
        session_id=trace.session_id,
        messages=[_sft_message(m, model_ids) for m in [*conv.messages, output_message(last, conv)]],
        tools=json.dumps(tools or [], ensure_ascii=False),
        prompt_token_ids=trace.prompt_ids,
        response_ids=trace.response_ids,
        loss_mask=trace.loss_mask,
        logprobs=trace.logprobs,
        weight=trace.weight,
        reward=trace.reward,
        advantage=trace.advantage,
        role=trace.role,
        segment=trace.segment,
        break_reason=trace.break_reason,
        call_ids=trace.call_ids,
        metadata=json.dumps(meta, ensure_ascii=False, sort_keys=True),
    )


def sft_rows(
    traces: Iterable[Trace],
    records: Iterable[CallRecord] | Mapping[str, CallRecord],
    metadata: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[SFTRow]:
    """One row per trace; ``metadata`` maps a session id to extra keys for its rows (harness, instance_id, ...)."""
    by_id = _by_id(records)
    return [sft_row(t, by_id, (metadata or {}).get(t.session_id)) for t in traces]


def gym_rows(traces: Iterable[Trace], records: Iterable[CallRecord] | Mapping[str, CallRecord]) -> list[dict]:
    """NeMo Gym result rows: the trace's output items (token fields on each call's item) under ``response``."""
    by_id = dict(_by_id(records))
    rows = []
    for trace in traces:
        missing = next((s.call_id for s in trace.spans if s.call_id not in by_id), None)
        if missing is not None:
            raise ValueError(f"trace {trace.trace_id}: no record for call {missing}")
        rows.append(
            {
                "trace_id": trace.trace_id,
                "session_id": trace.session_id,
                "role": trace.role,
                "segment": trace.segment,
                "break_reason": trace.break_reason,
                "weight": trace.weight,
                "reward": trace.reward,
                "advantage": trace.advantage,
                "response": {"output": gym_output_items(trace, by_id)},
            }
        )
    return rows


def _open_for_writing(path: Path, mode: str) -> Any:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return path.open(mode, **({} if "b" in mode else {"encoding": "utf-8"}))
    except OSError as exc:
        raise OSError(f"cannot write {path}: {exc.strerror or exc}") from None


def write_jsonl(rows: Iterable[BaseModel | Mapping[str, Any]], path: Path) -> None:
    """One JSON object per line: SFT rows, traces or plain dicts."""
    with _open_for_writing(path, "w") as fh:
        for row in rows:
            fh.write((row.model_dump_json() if isinstance(row, BaseModel) else json.dumps(row)) + "\n")


def _arrow_schema() -> Any:
    import pyarrow as pa

    call = pa.struct(
        [
            ("id", pa.string()),
            ("type", pa.string()),
            ("function", pa.struct([("name", pa.string()), ("arguments", pa.string())])),
        ]
    )
    message = pa.struct(
        [
            ("role", pa.string()),
            ("content", pa.string()),
            ("reasoning_content", pa.string()),
            ("tool_calls", pa.list_(call)),
            ("tool_call_id", pa.string()),
        ]
    )
    return pa.schema(
        [
            ("trace_id", pa.string()),
            ("session_id", pa.string()),
            ("messages", pa.list_(message)),
            ("tools", pa.string()),
            ("prompt_token_ids", pa.list_(pa.int64())),
            ("response_ids", pa.list_(pa.int64())),
            ("loss_mask", pa.list_(pa.int64())),
            ("logprobs", pa.list_(pa.float64())),
            ("weight", pa.float64()),
            ("reward", pa.float64()),
            ("advantage", pa.float64()),
            ("role", pa.string()),
            ("segment", pa.int64()),
            ("break_reason", pa.string()),
            ("call_ids", pa.list_(pa.string())),
            ("metadata", pa.string()),
        ]
    )


def write_parquet(rows: Iterable[SFTRow], path: Path) -> None:
    """One fixed schema (see :func:`_arrow_schema`); loads with ``datasets.Dataset.from_parquet``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist([r.model_dump() for r in rows], schema=_arrow_schema())
    with _open_for_writing(path, "wb") as fh:
        pq.write_table(table, fh)


def export(
    traces: list[Trace],
    records: Iterable[CallRecord] | Mapping[str, CallRecord],
    path: Path,
    fmt: str,
    metadata: Mapping[str, Mapping[str, Any]] | None = None,
) -> None:
    """Write ``traces`` to ``path`` in one of :data:`FORMATS`."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; expected one of {', '.join(FORMATS)}")
    if fmt == "traces":
        write_jsonl(traces, path)
    elif fmt == "gym":
        write_jsonl(gym_rows(traces, records), path)
    elif fmt == "sft-jsonl":
        write_jsonl(sft_rows(traces, records, metadata), path)
    else:
        write_parquet(sft_rows(traces, records, metadata), path)
