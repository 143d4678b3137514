"""A self-contained static HTML report of rollouts: sessions, their calls, the prefix-merged chains and every token.

Inputs, in any mix: a session directory (``session.json``, ``records.jsonl``, ``patch.diff``, logs, ``grade.json``
or a gateway's ``outcome.json``), a directory holding session directories or record files (a gateway
``state_dir``, ``runs/``, a proxy ``--record-dir``), a records JSONL, or a traces JSONL from ``polar reconstruct``.
Everything is grouped by session id: a traces file is shown instead of rebuilding the chains and is audited
against the records of the same session when they are given too (reading them: :mod:`nemo_polar.view.inputs`).

The page is one HTML file with inline CSS and no scripts or external URLs; every value is escaped by Jinja2's
autoescaping, because records hold whatever a harness or model wrote.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import jinja2

from nemo_polar.paths import cache_dir
from nemo_polar.proxy.store.records import CallRecord
from nemo_polar.reconstruct.audit import AuditReport, audit
from nemo_polar.reconstruct.builders import prefix_merging
from nemo_polar.reconstruct.trace import Trace
from nemo_polar.view.inputs import Entry, ReportError, SessionDir, collect

DEFAULT_MAX_TOKENS = 4000
OPEN_CONTEXT = 48  # context runs up to this many tokens are shown expanded; longer ones start collapsed


# -- token text -------------------------------------------------------------------------------------------------
class Decoder:
    """Token ids as text with the model's tokenizer, or the ids themselves when there is none."""

    def __init__(self, tokenizer: Any = None, source: Path | None = None) -> None:
        self.tokenizer = tokenizer
        self.source = source

    @classmethod
    def load(cls, model_dir: Path) -> Decoder:
        if not model_dir.is_dir():
            raise ReportError(f"{model_dir}: no such tokenizer directory")
        from transformers import AutoTokenizer  # heavy; only when asked to decode

        try:
            tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
        except (OSError, ValueError) as exc:
            raise ReportError(f"{model_dir}: cannot load a tokenizer: {exc}") from None
        return cls(tok, model_dir)

    def pieces(self, ids: Sequence[int]) -> list[str]:
        if self.tokenizer is None:
            return [f"{i} " for i in ids]
        return self.tokenizer.batch_decode(
            [[i] for i in ids], skip_special_tokens=False, clean_up_tokenization_spaces=False
        )

    def text(self, ids: Sequence[int]) -> str:
        if self.tokenizer is None:
            return " ".join(map(str, ids))
        return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)


def find_tokenizer(records: Iterable[CallRecord]) -> Path | None:
    """A local model directory named by the records' ``model`` (a path, or a model in the project cache)."""
    names = {r.request.get("model") for r in records if isinstance(r.request, dict)}
    for name in sorted(n for n in names if isinstance(n, str) and n):
        for candidate in (Path(name), cache_dir() / "models" / name):
            if (candidate / "tokenizer_config.json").is_file():
                return candidate
    return None


# -- view models --------------------------------------------------------------------------------------------------
@dataclass
class Tok:
    text: str
    title: str
    cls: Literal["train", "masked"]


@dataclass
class Run:
    """One stretch of a trace's token stream: a call marker, a context run (collapsible) or sampled tokens."""

    kind: Literal["call", "context", "sampled"]
    label: str = ""
    head: str = ""
    omitted: int = 0
    tail: str = ""
    n: int = 0
    open: bool = False
    tokens: list[Tok] = field(default_factory=list)
    audit: list[str] = field(default_factory=list)


@dataclass
class TraceView:
    trace: Trace
    runs: list[Run]
    shown: int
    total: int
    audit: dict[str, list[str]]  # call id -> the audit checks it failed

    @property
    def drift(self) -> bool:
        return bool(self.trace.break_reason or self.audit)


@dataclass
class CallRow:
    rec: CallRecord
    latency_s: float | None
    trace_index: int | None
    preview: str


@dataclass
class ChainNode:
    """A trace in the session's chain tree, under the chain that was running when it started."""

    index: int
    trace: Trace
    after_call: str | None  # the call of the parent chain it started after
    children: list[ChainNode] = field(default_factory=list)


def chain_tree(traces: Sequence[Trace], records: dict[str, CallRecord]) -> list[ChainNode]:
    """Nest each trace under the trace holding the latest call that started before its first call (the call that
    spawned a subagent, asked for a compaction summary, or was retried); roots are the session's first chains."""
    start = {i: records[t.call_ids[0]].started_at for i, t in enumerate(traces) if t.call_ids[0] in records}
    calls = sorted((records[c].started_at, c, i) for i, t in enumerate(traces) for c in t.call_ids if c in records)
    nodes = [ChainNode(i, t, None) for i, t in enumerate(traces)]
    roots: list[ChainNode] = []
    for node in nodes:
        t0 = start.get(node.index)
        before = [(at, c, i) for at, c, i in calls if i != node.index and t0 is not None and at < t0]
        if not before:
            roots.append(node)
            continue
        _, call_id, parent = before[-1]
        node.after_call = call_id
        nodes[parent].children.append(node)
    return roots


@dataclass
class SessionView:
    anchor: str
    session_id: str
    sources: list[str]
    dir: SessionDir | None
    calls: list[CallRow]
    failed: list[CallRecord]
    traces: list[TraceView]
    traces_from: str  # "prefix_merging" or the traces file
    audit: AuditReport | None
    stage_offsets: list[tuple[str, float]]
    tree: list[ChainNode] = field(default_factory=list)

    @property
    def status(self) -> str | None:
        d = self.dir
        if d is None:
            return None
        if d.result is not None:
            return d.result.status
        return d.outcome.session_status or d.outcome.status if d.outcome is not None else None

    @property
    def reward(self) -> str:
        d = self.dir
        grade = d.grade if d else None
        if grade is not None:
            return f"masked ({grade.status})" if grade.mask_sample else f"{grade.reward:g}"
        if d is not None and d.outcome is not None:
            o = d.outcome
            return "masked" if o.mask_sample or o.reward is None else f"{o.reward:g}"
        return "—"

    @property
    def breaks(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for tv in self.traces:
            if tv.trace.break_reason:
                out[tv.trace.break_reason] = out.get(tv.trace.break_reason, 0) + 1
        return out


def _context_run(ids: Sequence[int], label: str, decoder: Decoder, limit: int) -> Run:
    """Long context is elided in the middle: its start and its end (the latest turn) are what a reader needs."""
    n = len(ids)
    run = Run("context", label=f"{label} · {n} tokens", n=n, open=n <= OPEN_CONTEXT)
    if n <= limit:
        run.head = decoder.text(ids)
    else:
        half = limit // 2
        run.head, run.omitted, run.tail = decoder.text(ids[:half]), n - 2 * half, decoder.text(ids[-half:])
    return run


def trace_view(trace: Trace, decoder: Decoder, bad: dict[str, list[str]], max_tokens: int) -> TraceView:
    context_limit = max(32, max_tokens // 16)
    budget = max_tokens
    runs: list[Run] = []

    def context(ids: Sequence[int], label: str) -> None:
        nonlocal budget
        run = _context_run(ids, label, decoder, max(2, min(context_limit, budget)))
        budget -= run.n - run.omitted
        runs.append(run)

    context(trace.prompt_ids, "prompt")
    for span in trace.spans:
        if budget <= 0:
            break
        label = f"call {span.call_id} · finish {span.finish_reason or '—'}"
        runs.append(Run("call", label=label, audit=bad.get(span.call_id, [])))
        if span.start > span.context_start:
            context(trace.response_ids[span.context_start : span.start], "context")
        ids = trace.response_ids[span.start : span.end][: max(budget, 0)]
        toks = []
        for k, (tid, piece) in enumerate(zip(ids, decoder.pieces(ids), strict=True)):
            lp, trainable = trace.logprobs[span.start + k], trace.loss_mask[span.start + k] == 1
            title = f"id {tid} · logprob {lp:.4f}" if lp is not None else f"id {tid} · masked"
            toks.append(Tok(piece, title, "train" if trainable else "masked"))
        budget -= len(ids)
        runs.append(Run("sampled", n=len(ids), tokens=toks))
    total = len(trace.prompt_ids) + len(trace.response_ids)
    calls = {s.call_id for s in trace.spans}
    return TraceView(trace, runs, max_tokens - max(budget, 0), total, {c: v for c, v in bad.items() if c in calls})


def session_view(e: Entry, decoder: Decoder, max_tokens: int, index: int) -> SessionView:
    records = sorted(e.records.values(), key=lambda r: (r.started_at, r.call_id))
    audit_report: AuditReport | None = None
    if e.traces is not None:
        traces, traces_from = e.traces, ", ".join(s for s in e.sources if s.endswith(".jsonl")) or "traces file"
    else:
        traces, traces_from = prefix_merging(records).traces, "prefix_merging"
    if records:
        audit_report = audit(traces, records)
    bad = audit_report.failures() if audit_report else {}
    views = [trace_view(t, decoder, bad, max_tokens) for t in traces]
    where = {c: i for i, t in enumerate(traces) for c in t.call_ids}
    calls = [
        CallRow(
            r,
            r.finished_at - r.started_at if r.finished_at is not None else None,
            where.get(r.call_id),
            (r.output_text or "")[:160],
        )
        for r in records
    ]
    stage_offsets: list[tuple[str, float]] = []
    if e.dir is not None and e.dir.outcome is not None and e.dir.outcome.stage_times:
        times = e.dir.outcome.stage_times
        t0 = min(times.values())
        stage_offsets = [(stage, t - t0) for stage, t in sorted(times.items(), key=lambda kv: kv[1])]
    return SessionView(
        anchor=f"s{index}",
        session_id=e.session_id,
        sources=e.sources,
        dir=e.dir,
        calls=calls,
        failed=[r for r in records if not r.complete],
        traces=views,
        traces_from=traces_from,
        audit=audit_report,
        stage_offsets=stage_offsets,
        tree=chain_tree(traces, e.records),
    )


# -- rendering ----------------------------------------------------------------------------------------------------
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(Path(__file__).parent),
        autoescape=True,  # records carry arbitrary harness and model text
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["diff_class"] = _diff_class
    return env


def _diff_class(line: str) -> str:
    if line.startswith(("+++", "---", "diff ", "index ")):
        return "meta"
    return {"+": "add", "-": "del", "@": "hunk"}.get(line[:1], "")


def render_report(
    inputs: list[Path], tokenizer_dir: Path | None = None, *, max_tokens: int = DEFAULT_MAX_TOKENS
) -> str:
    """The report for ``inputs`` as one HTML document; :class:`ReportError` names the input that is not usable."""
    if not inputs:
        raise ReportError("no inputs: give session directories, records JSONL or traces JSONL")
    if max_tokens < 1:
        raise ReportError(f"max_tokens must be positive, got {max_tokens}")
    entries = collect(inputs)
    if tokenizer_dir is not None:
        decoder = Decoder.load(tokenizer_dir)
    else:
        found = find_tokenizer(r for e in entries for r in e.records.values())
        decoder = Decoder.load(found) if found else Decoder()
    sessions = [session_view(e, decoder, max_tokens, i) for i, e in enumerate(entries)]
    return (
        _environment()
        .get_template("report.html.j2")
        .render(
            sessions=sessions,
            inputs=[str(p) for p in inputs],
            tokenizer=str(decoder.source) if decoder.source else None,
            max_tokens=max_tokens,
            generated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        )
    )


def write_report(
    inputs: list[Path], output: Path, tokenizer_dir: Path | None = None, *, max_tokens: int = DEFAULT_MAX_TOKENS
) -> Path:
    html = render_report(inputs, tokenizer_dir, max_tokens=max_tokens)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(html, encoding="utf-8")
    return output


def run(args: argparse.Namespace) -> int:
    try:
        out = write_report(args.inputs, args.output, args.tokenizer, max_tokens=args.max_tokens)
    except (ReportError, OSError) as exc:
        print(f"polar view: {exc}", file=sys.stderr)
        return 2
    print(f"polar view: wrote {out}")
    return 0
