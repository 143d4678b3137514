"""Every trace of a rollout as NeMo Gym's ``training_traces`` envelope (``delivery: all_traces``), for NeMo-RL's
``grpo.gym_multi_trace`` — the contract by which the per-request traces and the subagent and compaction segments
reach the trainer, beside the unchanged main-chain ``response``.

The envelope and its rules are restated from Gym PR #3212 (open; ``nemo_gym/token_id_capture/training_traces.py``,
as the PR describes it; no released nemo-gym has the module, 0.7.0 included) and NeMo-RL PR #4078 (open;
``docs/guides/gym-multi-trace-grpo.md``)::

    {"schema_version": 1, "rollout_id", "builder": "per_request" | "prefix_merging",
     "traces": [{"trace_id", "model_call_ids", "token_ids", "generation_logprobs", "loss_mask",
                 "sampled_spans": [{"model_call_id", "start", "end"}]}]}

- ``token_ids``, ``generation_logprobs`` and ``loss_mask`` have one entry per token; ``loss_mask[0] == 0``;
  every logprob is finite (0.0 where nothing was sampled);
- the sampled spans cover the trainable tokens (``loss_mask == 1``) exactly, and every sampled call has exactly
  one owner across the rollout's traces (context repeated in a later trace is masked there);
- ``trace_id == f"{rollout_id}:{last_call_id}"``; no ``routed_experts``.

Here a trace's ``model_call_ids`` are the calls it owns, in order. Where a trace of ours breaks a rule — a call
owned twice (the later copy), a sampled token without a finite logprob — or a call was sampled across a weight
update (an engine that kept it in flight: the envelope cannot say which tokens came from which policy), that
call's tokens are masked in it, with the reason, and a trace left with nothing sampled is not delivered: never a
silently different sample.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from nemo_polar.reconstruct.trace import Trace

SCHEMA_VERSION = 1
Builder = Literal["per_request", "prefix_merging"]


class SampledSpan(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model_call_id: str
    start: int = Field(ge=1)
    end: int


class TrainingTrace(BaseModel):
    model_config = ConfigDict(extra="forbid")
    trace_id: str
    model_call_ids: list[str] = Field(min_length=1)
    token_ids: list[int]
    generation_logprobs: list[float]
    loss_mask: list[int]
    sampled_spans: list[SampledSpan] = Field(min_length=1)


class TrainingTraces(BaseModel):
    """The envelope, checked by its rules on construction (a ``ValueError`` names the rule and the trace)."""

    model_config = ConfigDict(extra="forbid")
    schema_version: Literal[1] = SCHEMA_VERSION
    rollout_id: str = Field(min_length=1)
    builder: Builder
    traces: list[TrainingTrace]

    @model_validator(mode="after")
    def _rules(self) -> TrainingTraces:
        owners: dict[str, str] = {}
        for t in self.traces:
            n = len(t.token_ids)
            if not (len(t.generation_logprobs) == len(t.loss_mask) == n) or n == 0:
                raise ValueError(f"{t.trace_id}: token_ids, generation_logprobs and loss_mask differ in length")
            if t.loss_mask[0] != 0:
                raise ValueError(f"{t.trace_id}: loss_mask[0] must be 0 (the first token is context)")
            if set(t.loss_mask) - {0, 1}:
                raise ValueError(f"{t.trace_id}: loss_mask holds values other than 0 and 1")
            if not all(math.isfinite(x) for x in t.generation_logprobs):
                raise ValueError(f"{t.trace_id}: a generation logprob is not finite")
            covered = [0] * n
            for s in t.sampled_spans:
                if not 0 < s.start < s.end <= n:
                    raise ValueError(
                        f"{t.trace_id}: span of {s.model_call_id} ({s.start}, {s.end}) is outside the trace"
                    )
                if any(covered[s.start : s.end]):
                    raise ValueError(f"{t.trace_id}: sampled spans overlap at {s.model_call_id}")
                covered[s.start : s.end] = [1] * (s.end - s.start)
                if s.model_call_id in owners:
                    raise ValueError(f"call {s.model_call_id} is owned by {owners[s.model_call_id]} and {t.trace_id}")
                owners[s.model_call_id] = t.trace_id
            if covered != t.loss_mask:
                raise ValueError(f"{t.trace_id}: the sampled spans do not cover the trainable tokens exactly")
            if [s.model_call_id for s in t.sampled_spans] != t.model_call_ids:
                raise ValueError(f"{t.trace_id}: model_call_ids are not the calls its spans own, in order")
            if t.trace_id != f"{self.rollout_id}:{t.model_call_ids[-1]}":
                raise ValueError(f"{t.trace_id}: trace_id must be '<rollout_id>:<last call id>'")
        return self


class Envelope(BaseModel):
    """The envelope and what was kept out of it, with why (call id or trace id -> reason)."""

    training_traces: TrainingTraces
    masked: dict[str, str] = Field(default_factory=dict)


def training_traces(rollout_id: str, builder: Builder, traces: list[Trace]) -> Envelope:
    """Our traces as the envelope: each trace's context and sampled tokens as one token sequence."""
    masked: dict[str, str] = {}
    owned: set[str] = set()
    out: list[dict[str, Any]] = []
    for trace in traces:
        offset = len(trace.prompt_ids)
        mask = [0] * offset + list(trace.loss_mask)
        sampled_lp = [
            lp if lp is not None and m else 0.0 for lp, m in zip(trace.logprobs, trace.loss_mask, strict=True)
        ]
        logprobs = [0.0] * offset + sampled_lp
        spans = []
        for span in trace.spans:
            start, end = offset + span.start, offset + span.end
            sampled = trace.logprobs[span.start : span.end]
            kept = trace.loss_mask[span.start : span.end]
            why = None
            if span.call_id in owned:
                why = "owned by an earlier trace"
            elif len(span.policy_versions) > 1:  # the envelope has one policy per sampled token only implicitly
                why = f"sampled across a weight update (policy versions {span.policy_versions})"
            elif not all(kept):
                why = "masked by the trace builder (e.g. a truncated generation)"
            elif start == 0:
                why = "sampled with no context before it"
            elif not all(lp is not None and math.isfinite(lp) for lp in sampled):
                why = "a sampled token has no finite logprob"
            if why is not None:
                masked[span.call_id] = why
                mask[start:end] = [0] * (end - start)
                logprobs[start:end] = [0.0] * (end - start)
                continue
            if end > start:
                owned.add(span.call_id)
                spans.append({"model_call_id": span.call_id, "start": start, "end": end})
        if not spans:
            masked[trace.trace_id] = "nothing sampled left to train on"
            continue
        out.append(
            {
                "trace_id": f"{rollout_id}:{spans[-1]['model_call_id']}",
                "model_call_ids": [s["model_call_id"] for s in spans],
                "token_ids": trace.prompt_ids + trace.response_ids,
                "generation_logprobs": logprobs,
                "loss_mask": mask,
                "sampled_spans": spans,
            }
        )
    envelope = TrainingTraces(rollout_id=rollout_id, builder=builder, traces=out)  # type: ignore[arg-type]
    return Envelope(training_traces=envelope, masked=masked)
