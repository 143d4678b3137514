"""A session as NeMo Gym 0.7 observes a rollout: its standardized trajectory (``ng_trajectory``) and the response's
token usage, what Gym's post-run health checks read (nemo_gym/health/checks.py, nemo-gym 0.7.0).

One invocation per chain of the session (prefix merging's traces: the main chain, a subagent's, a compaction's), one
turn per sampled call in it, and every call the engine answered or refused as a model call with its token counts.
``usage`` sums the calls the turns name, as Gym's ``rollout_token_count_mismatch`` compares them (checks.py:682-703).
The exact ids and logprobs stay in ``response.output``, where NeMo-RL reads them: Gym's record holds counts only
(``TrajectoryTokenStats``, nemo_gym/rollout_observability.py:40-45).
"""

from __future__ import annotations

from typing import Any

from nemo_polar.proxy.conversation import ToolCall
from nemo_polar.proxy.store.records import CallRecord
from nemo_polar.reconstruct.builders import prefix_merging


def engine_calls(records: list[CallRecord]) -> list[CallRecord]:
    """The calls the engine sampled or that failed: what a model server's capture would hold (a call the proxy
    answered itself, a token count say, is no model call)."""
    return [r for r in records if r.sampled_token_ids or r.status_code >= 400 or r.error]


def chains(records: list[CallRecord]) -> list[tuple[str, list[CallRecord]]]:
    """Each chain of the session (a prefix-merged trace) and its sampled calls in order: the turns."""
    by_id = {r.call_id: r for r in records if r.sampled_token_ids}
    return [(t.trace_id, [by_id[c] for c in t.call_ids if c in by_id]) for t in prefix_merging(records).traces]


def usage(records: list[CallRecord]) -> dict[str, Any]:
    """The Responses API usage of the calls the session's turns are (Gym's ``NeMoGymResponseUsage``). Cached and
    reasoning tokens are not told apart here: 0."""
    turns = [r for _, chain in chains(records) for r in chain]
    prompt = sum(len(r.prompt_token_ids) for r in turns)
    completion = sum(len(r.sampled_token_ids) for r in turns)
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


def _answer(record: CallRecord) -> list[dict[str, Any]]:
    """The call's output as Responses items: its tool calls, then its text."""
    output = record.output or {}
    # Through the message model: a record leaves out a call's default fields (``arguments`` "{}": a call without any)
    items: list[dict[str, Any]] = [
        {"type": "function_call", "call_id": c.id, "name": c.name, "arguments": c.arguments}
        for c in map(ToolCall.model_validate, output.get("tool_calls") or [])
    ]
    text = output.get("content") if record.output is not None else record.output_text  # unparsed: the raw text
    if text:
        items.append({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]})
    return items


def _model_call(record: CallRecord, model: str) -> dict[str, Any]:
    sampled = len(record.sampled_token_ids)
    return {
        "model_call_id": record.call_id,
        "started_at": record.started_at,
        "completed_at": record.finished_at,
        # What the engine returned, so a call cut at max_tokens is told from a runaway one (checks.py:706-717).
        "response": {"output_text": record.output_text or ""},
        "response_metadata": {
            "model": model,
            "dialect": record.api,
            "status_code": record.status_code,
            "finish_reason": record.finish_reason,
            "error_category": record.error_code if record.status_code >= 400 or record.error else None,
        },
        "token_stats": {
            "prompt_tokens": len(record.prompt_token_ids),
            "completion_tokens": sampled,
            "total_tokens": len(record.prompt_token_ids) + sampled,
        },
    }


def trajectory(records: list[CallRecord], task_id: str, rollout_id: str, model: str) -> dict[str, Any] | None:
    """The session's ``ng_trajectory``, validated by Gym's own model; None where the installed Gym has none (NeMo-RL's
    Gym predates it) or the session made no call."""
    try:
        from nemo_polar.env.gym.compat import TrajectoryRecord
    except ImportError:
        return None
    calls = engine_calls(records)
    if not calls:
        return None
    invocations: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    for invocation_id, chain in chains(records):
        invocations.append({"invocation_id": invocation_id, "status": "completed"})
        for n, record in enumerate(chain, start=1):
            turns.append(
                {
                    "invocation_id": invocation_id,
                    "task_id": task_id,
                    "rollout_id": rollout_id,
                    "turn_no": n,
                    "timestamp": record.started_at,
                    "step_count": n - 1,
                    "answer": _answer(record),
                    "reasoning_content": (record.output or {}).get("reasoning"),
                    "model_calls": [{"model_call_id": record.call_id}],
                }
            )
    record = TrajectoryRecord.model_validate(
        {
            "task_id": task_id,
            "rollout_id": rollout_id,
            "invocations": invocations,
            "turns": turns,
            "model_calls": [_model_call(r, model) for r in calls],
        }
    )
    return record.model_dump(mode="json", exclude_none=True)
