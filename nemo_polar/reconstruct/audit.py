"""Fidelity audit: every trace's trainable tokens are the recorded sampled ids, the context each call is stitched
into is exactly the prompt the engine was given, and every complete call's sampled ids are in exactly one trace
(coverage: a builder that drops or duplicates a call fails the audit naming it)."""

from __future__ import annotations

from collections import Counter

from pydantic import BaseModel, Field

from nemo_polar.proxy.store.records import CallRecord
from nemo_polar.reconstruct.trace import Trace

FAILURE_KINDS = ("sampled_mismatch", "context_mismatch", "missing_records", "uncovered", "duplicated")


class AuditReport(BaseModel):
    traces: int = 0
    calls: int = 0
    trainable_tokens: int = 0
    sampled_mismatch: list[str] = Field(default_factory=list, description="call ids whose sampled ids differ")
    context_mismatch: list[str] = Field(default_factory=list, description="call ids stitched into another context")
    missing_records: list[str] = Field(default_factory=list)
    uncovered: list[str] = Field(default_factory=list, description="complete calls in no trace: their tokens are lost")
    duplicated: list[str] = Field(default_factory=list, description="complete calls in more than one trace")
    tokens_lost: int = Field(default=0, description="sampled ids of the uncovered calls")
    break_reasons: dict[str, int] = Field(default_factory=dict)

    def failures(self) -> dict[str, list[str]]:
        """Each call id the audit names, with the checks it failed (in FAILURE_KINDS order)."""
        named: dict[str, list[str]] = {}
        for kind in FAILURE_KINDS:
            for call_id in getattr(self, kind):
                named.setdefault(call_id, []).append(kind)
        return named

    @property
    def ok(self) -> bool:
        return not self.failures()


def audit(traces: list[Trace], records: list[CallRecord]) -> AuditReport:
    by_id = {r.call_id: r for r in records}
    report = AuditReport(traces=len(traces))
    reasons: Counter[str] = Counter()
    for trace in traces:
        report.trainable_tokens += trace.trainable_tokens
        if trace.break_reason:
            reasons[trace.break_reason] += 1
        for span in trace.spans:
            report.calls += 1
            rec = by_id.get(span.call_id)
            if rec is None:
                report.missing_records.append(span.call_id)
                continue
            if trace.response_ids[span.start : span.end] != rec.sampled_token_ids:
                report.sampled_mismatch.append(span.call_id)
            trainable = [
                lp
                for lp, m in zip(
                    trace.logprobs[span.start : span.end], trace.loss_mask[span.start : span.end], strict=True
                )
                if m
            ]
            if trainable and trainable != rec.sampled_logprobs:
                report.sampled_mismatch.append(span.call_id)
            if trace.context_before(span) != rec.prompt_token_ids:
                report.context_mismatch.append(span.call_id)
    report.break_reasons = dict(reasons)
    placed = Counter(c for trace in traces for c in trace.call_ids)
    for rec in records:
        if not rec.complete:
            continue  # a failed call has no finished generation to train on; builders list it as failed
        if placed[rec.call_id] == 0:
            report.uncovered.append(rec.call_id)
            report.tokens_lost += len(rec.sampled_token_ids)
        elif placed[rec.call_id] > 1:
            report.duplicated.append(rec.call_id)
    return report
