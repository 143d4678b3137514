"""One line per scenario session: what prefix merging made of it and whether anything was lost.

``polar patterns`` renders these lines (written by the pattern tests) as the scenario x CLI table in docs/harnesses.md.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from pydantic import BaseModel, Field

from nemo_polar.proxy.store.records import CallRecord
from nemo_polar.reconstruct.audit import audit
from nemo_polar.reconstruct.builders import prefix_merging
from nemo_polar.reconstruct.trace import Trace


class PatternRow(BaseModel):
    scenario: str
    harness: str
    version: str = ""
    calls: int = 0
    failed_calls: int = 0
    chains: dict[str, int] = Field(default_factory=dict, description="traces by role; retry siblings as 'retry'")
    breaks: dict[str, int] = Field(default_factory=dict)
    render_reasons: dict[str, int] = Field(default_factory=dict)
    tokens_lost: int = 0
    audit_ok: bool = False
    audit_failures: list[str] = Field(default_factory=list, description="call ids the audit names")


def chain_roles(traces: Iterable[Trace]) -> dict[str, int]:
    return dict(Counter("retry" if t.break_reason == "retry" else t.role for t in traces))


def render_reasons(records: Iterable[CallRecord]) -> dict[str, int]:
    return dict(Counter(r.render_reason or "none" for r in records))


def summarize(scenario: str, harness: str, records: Sequence[CallRecord], version: str = "") -> PatternRow:
    built = prefix_merging(records)
    report = audit(built.traces, list(records))
    return PatternRow(
        scenario=scenario,
        harness=harness,
        version=version,
        calls=len(records),
        failed_calls=len(built.failed_call_ids),
        chains=chain_roles(built.traces),
        breaks=dict(built.break_reasons),
        render_reasons=render_reasons(records),
        tokens_lost=report.tokens_lost,
        audit_ok=report.ok,
        audit_failures=list(report.failures()),
    )


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"


def _cell(row: PatternRow) -> str:
    failed = f" ({row.failed_calls} failed)" if row.failed_calls else ""
    audit_cell = "audit ok" if row.audit_ok else "audit FAILED: " + ", ".join(row.audit_failures)
    return (
        f"{row.calls} calls{failed}<br>chains: {_counts(row.chains)}<br>breaks: {_counts(row.breaks)}<br>"
        f"lost {row.tokens_lost} · {audit_cell}"
    )


def markdown_table(
    rows: Sequence[PatternRow],
    unsupported: dict[tuple[str, str], str],
    blocked: dict[tuple[str, str], str],
    scenarios: Sequence[str],
    harnesses: Sequence[str],
) -> str:
    """Scenarios x CLIs; a cell: calls, chains by role, breaks by reason, tokens lost, audit. Where the CLI has no
    such feature, ``—`` and a numbered note saying why; ``blocked`` and a note where the CLI has it and the proxy
    cannot serve it yet; ``not run`` where neither a result nor a reason exists."""
    by_key = {(r.scenario, r.harness): r for r in rows}
    notes: list[str] = []
    lines = [f"| scenario | {' | '.join(harnesses)} |", "|---" * (len(harnesses) + 1) + "|"]
    for scenario in scenarios:
        cells = []
        for harness in harnesses:
            row = by_key.get((scenario, harness))
            if row is not None:
                cells.append(_cell(row))
            elif (scenario, harness) in unsupported:
                notes.append(f"{len(notes) + 1}. {harness}, {scenario}: {unsupported[scenario, harness]}")
                cells.append(f"— ({len(notes)})")
            elif (scenario, harness) in blocked:
                notes.append(f"{len(notes) + 1}. {harness}, {scenario}, blocked: {blocked[scenario, harness]}")
                cells.append(f"blocked ({len(notes)})")
            else:
                cells.append("not run")
        lines.append(f"| {scenario} | {' | '.join(cells)} |")
    return "\n".join(lines + (["", *notes] if notes else []))
