r"""Build traces from a session's call records.

``per_request``: one trace per call. ``prefix_merging``: calls are linked in token space — a call extends the
earlier call whose full sequence (prompt + sampled ids) is a prefix of its prompt — and each path of that tree
becomes one trace in which every call contributes its context delta (masked) and its sampled ids (trainable).
Nothing is dropped: siblings (retries, branches) that a later call does not extend become traces of their own,
calls that extend nothing start new traces with the reason recorded, and failed calls are listed in the result.

Merging rule, in every mode: call B is stitched after call A only when B's recorded prompt is A's prompt + A's
sampled ids + an interstitial, token for token. The interstitial (an end-of-turn token the sampled ids lack,
tool results, the next generation prompt and its glue) is then taken verbatim from B's prompt and masked, so
the stitched context of every call is provably the prompt the engine was given (what the audit checks). A turn
that stopped without its end-of-turn token among the sampled ids therefore merges: the template's end-of-turn
is the first token of B's interstitial, exactly as in continuation mode.

When the proxy linked B to A (``parent_call_id``) and the rule fails (``chat`` mode: the engine re-rendered the
history), B is not spliced; the reason says why:

- ``template_glue``: A's prompt ends with glue the template adds to the generation prompt but not to the same
  turn in history (Qwen3's empty ``<think>\n\n</think>\n\n`` with thinking off), and B's prompt is A's prompt
  without it. A's ids were sampled after the glue, B's after a history without it: no single token sequence
  holds both contexts, so this is not provable (a template that keeps the glue in history merges).
- ``retokenized``: B's prompt keeps A's whole prompt, but the ids of A's turn in it differ from the sampled
  ones (the re-render tokenised non-canonical sampled ids canonically, or rewrote the turn's end or
  whitespace). Stitching A's sampled ids would give B a context the engine never saw.
- ``context_mismatch``: B's prompt differs from A's before A's turn.

If B still extends an earlier call of the chain (A's turn was re-tokenised but everything before it is intact),
B is stitched there with A's re-rendered turn as masked context, and A's own trace carries the reason. Otherwise
B starts a new segment: the role of the chain it continues and the next segment number.

Roots other than the session's first chain get a role from what they carry:

- ``compaction``: the request carries the text of an earlier text-only reply of the session (the summary the CLI
  asked for) — the history was rewritten around it. Reason ``compaction``; the segment numbering continues the
  chain the summary came from. The summary call is one too when the CLI asked for it in a new conversation, and
  so is a rewritten history the proxy flagged (``history_diverged``).
- ``subagent``: a new conversation that carries no summary (its own system prompt and task).

Calls given the same prompt (a CLI resending a request after an error or a dropped stream) are siblings: the one
the session continued is kept in the chain, every other one is a trace of its own with reason ``retry``.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from pydantic import BaseModel, Field

from nemo_polar.engine.families import generation_glue
from nemo_polar.proxy.conversation import parts_text
from nemo_polar.proxy.store.records import CallRecord
from nemo_polar.reconstruct.side_rules import DEFAULT_SIDE_RULES, SideRule, carried_summary
from nemo_polar.reconstruct.trace import Role, Span, Trace


class BuilderConfig(BaseModel):
    mask_truncated: bool = Field(default=False, description="mask the sampled ids of calls cut by max_tokens")
    side_rules: list[SideRule] = Field(default_factory=lambda: list(DEFAULT_SIDE_RULES))
    generation_glue: list[list[int]] = Field(
        default_factory=generation_glue,  # every declared family's
        description="id sequences a template appends to the generation prompt only; names breaks, never merges",
    )


@dataclass
class BuildResult:
    traces: list[Trace]
    failed_call_ids: list[str] = field(default_factory=list)  # not traceable: no finished generation to prove
    break_reasons: Counter[str] = field(default_factory=Counter)

    @property
    def stats(self) -> dict[str, object]:
        return {
            "traces": len(self.traces),
            "calls": sum(len(t.spans) for t in self.traces),
            "failed_calls": len(self.failed_call_ids),
            "break_reasons": dict(self.break_reasons),
            "roles": dict(Counter(t.role for t in self.traces)),
        }


def _system_and_tools(record: CallRecord) -> tuple[str, int]:
    """The system prompt text and the number of tools of a recorded request, read without a full parse."""
    body = record.request if isinstance(record.request, dict) else {}
    tools = body.get("tools")
    n_tools = len(tools) if isinstance(tools, list) else 0
    parts: list = []
    if record.api == "gemini":  # one tools entry holds every declaration; fields by JSON or proto name
        declared = [
            t.get("functionDeclarations", t.get("function_declarations")) for t in tools or [] if isinstance(t, dict)
        ]
        n_tools = sum(len(d) for d in declared if isinstance(d, list))
        system = body.get("systemInstruction", body.get("system_instruction"))
        parts.append(system.get("parts") if isinstance(system, dict) else system)
    elif record.api == "anthropic":
        parts.append(body.get("system"))
    else:
        if record.api == "responses":
            parts.append(body.get("instructions"))
        items = body.get("messages" if record.api == "chat" else "input")
        if isinstance(items, list):
            parts += [
                m.get("content") for m in items if isinstance(m, dict) and m.get("role") in ("system", "developer")
            ]
    texts = []
    for part in parts:
        try:
            texts.append(parts_text(part, kinds=("text", "input_text")))
        except ValueError:
            continue
    return "\n".join(texts), n_tools


def _last_user_text(record: CallRecord) -> str:
    """The text of the request's last message if the user sent it (a tool result's output is not user text)."""
    body = record.request if isinstance(record.request, dict) else {}
    key = {"gemini": "contents", "responses": "input"}.get(record.api, "messages")
    items = body.get(key)
    if isinstance(items, str):  # a Responses input given as one string
        return items
    last = items[-1] if isinstance(items, list) and items else None
    if not isinstance(last, dict) or last.get("role") != "user":
        return ""
    try:
        return parts_text(last.get("parts" if record.api == "gemini" else "content"), kinds=("text", "input_text"))
    except ValueError:
        return ""


def side_rule(record: CallRecord, rules: list[SideRule]) -> str | None:
    system, n_tools = _system_and_tools(record)
    for rule in rules:
        if rule.api is not None and rule.api != record.api:
            continue
        if rule.system_contains is not None and rule.system_contains not in system:
            continue
        if rule.last_user_contains is not None and rule.last_user_contains not in _last_user_text(record):
            continue
        if rule.max_tools is not None and n_tools > rule.max_tools:
            continue
        return rule.name
    return None


def _full_len(rec: CallRecord) -> int:
    return len(rec.prompt_token_ids) + len(rec.sampled_token_ids)


def _extends(child: CallRecord, parent: CallRecord) -> bool:
    """``child``'s prompt starts with ``parent``'s prompt + sampled ids. The short sampled part is compared first
    (most mismatches show there) and the parent's full sequence is never built: this runs once per call on contexts
    of up to 100k tokens."""
    if child.extends(parent):  # proven when the record was read (its prompt was stored as a delta of parent's)
        return True
    prompt, before, sampled = child.prompt_token_ids, parent.prompt_token_ids, parent.sampled_token_ids
    n = len(before)
    if n + len(sampled) > len(prompt) or prompt[n : n + len(sampled)] != sampled:
        return False
    return prompt[:n] == before


def _mismatch(child: CallRecord, parent: CallRecord, glue: list[list[int]]) -> str:
    """Why ``child``'s prompt is not ``parent``'s full sequence + an interstitial (see the module docstring)."""
    prompt, before = child.prompt_token_ids, parent.prompt_token_ids
    if prompt[: len(before)] == before:
        return "retokenized"
    for tail in glue:
        head = len(before) - len(tail)
        if tail and head >= 0 and before[head:] == tail and prompt[:head] == before[:head]:
            return "template_glue"
    return "context_mismatch"


def _trace(path: list[CallRecord], role: Role, segment: int, reason: str | None, cfg: BuilderConfig) -> Trace:
    first = path[0]
    # Only the stitched length is needed: each call's prompt extends the path so far (the builders checked it), and
    # copying the growing sequence per call would make a trace cost quadratic in its length.
    stitched = len(first.prompt_token_ids)
    response: list[int] = []
    mask: list[int] = []
    logprobs: list[float | None] = []
    spans: list[Span] = []
    for rec in path:
        context = rec.prompt_token_ids[stitched:]
        start = len(response) + len(context)
        response += context
        mask += [0] * len(context)
        logprobs += [None] * len(context)
        masked = cfg.mask_truncated and rec.finish_reason == "length"
        response += rec.sampled_token_ids
        mask += [0 if masked else 1] * len(rec.sampled_token_ids)
        logprobs += [None] * len(rec.sampled_token_ids) if masked else list(rec.sampled_logprobs)
        spans.append(
            Span(
                call_id=rec.call_id,
                context_start=start - len(context),
                start=start,
                end=len(response),
                finish_reason=rec.finish_reason,
                policy_versions=_call_versions(rec),
            )
        )
        stitched = len(first.prompt_token_ids) + len(response)
    versions = sorted({v for span in spans for v in span.policy_versions})
    return Trace(
        trace_id=f"{first.session_id}/{first.call_id}",
        session_id=first.session_id,
        prompt_ids=list(first.prompt_token_ids),
        response_ids=response,
        loss_mask=mask,
        logprobs=logprobs,
        spans=spans,
        role=role,
        segment=segment,
        break_reason=reason,
        policy_versions=versions,
    )


def _call_versions(rec: CallRecord) -> list[int]:
    """The policy versions the call's tokens were sampled under: its own, and any a weight update during the
    generation brought before its last token (an engine that keeps in-flight requests across an update)."""
    versions = {rec.policy_version} if rec.policy_version is not None else set()
    versions |= {c["policy_version"] for c in rec.policy_version_changes if c["at_token"] < len(rec.sampled_token_ids)}
    return sorted(versions)


def _split(records: Iterable[CallRecord], cfg: BuilderConfig) -> tuple[list[CallRecord], list[CallRecord], list[str]]:
    ordered = sorted(records, key=lambda r: (r.started_at, r.call_id))
    failed = [r.call_id for r in ordered if not r.complete]
    usable = [r for r in ordered if r.complete]
    side = [r for r in usable if side_rule(r, cfg.side_rules)]
    side_ids = {r.call_id for r in side}
    return [r for r in usable if r.call_id not in side_ids], side, failed


def _weigh(traces: list[Trace]) -> list[Trace]:
    """Per-sample weights: under a loss that averages per sample, a session counts once however many traces it has;
    side calls count for nothing. A token-level loss counts each sampled token once whatever the split, and uses
    no weight but the side calls' 0 (nemo_polar.learn.loop.rows)."""
    trainable = [t for t in traces if t.role != "side"]
    for t in traces:
        t.weight = 0.0 if t.role == "side" else 1.0 / len(trainable)
    return traces


def per_request(records: Iterable[CallRecord], cfg: BuilderConfig | None = None) -> BuildResult:
    cfg = cfg or BuilderConfig()
    agent, side, failed = _split(records, cfg)
    traces = [_trace([r], "main", 0, None, cfg) for r in agent] + [
        _trace([r], "side", 0, "side_call", cfg) for r in side
    ]
    return BuildResult(_weigh(traces), failed, Counter({"side_call": len(side)}) if side else Counter())


def prefix_merging(records: Iterable[CallRecord], cfg: BuilderConfig | None = None) -> BuildResult:
    cfg = cfg or BuilderConfig()
    agent, side, failed = _split(records, cfg)
    by_id = {r.call_id: r for r in agent}
    parent: dict[str, str | None] = {}
    children: dict[str, list[str]] = {r.call_id: [] for r in agent}
    split: dict[str, str] = {}  # call -> why it leaves the chain the proxy linked it into
    origin: dict[str, str] = {}  # call -> the root of the chain it belongs to, across segments
    seen: list[CallRecord] = []
    for rec in agent:
        hint = by_id.get(rec.parent_call_id or "")
        hint = hint if hint is not None and hint.call_id in parent else None
        if hint is not None and _extends(rec, hint):
            found: CallRecord | None = hint
        else:  # the longest earlier full sequence that is a prefix of this prompt
            found = max((p for p in seen if _extends(rec, p)), key=_full_len, default=None)
            if hint is not None:
                split[rec.call_id] = _mismatch(rec, hint, cfg.generation_glue)
                fork = _child_towards(hint.call_id, found.call_id, parent) if found else None
                if fork is not None:  # whichever of rec and the hint's branch is not continued carries the reason
                    split[fork] = split[rec.call_id]
        parent[rec.call_id] = found.call_id if found else None
        if found is not None:
            children[found.call_id].append(rec.call_id)
            origin[rec.call_id] = origin[found.call_id]
        else:
            origin[rec.call_id] = origin[hint.call_id] if hint is not None else rec.call_id
        seen.append(rec)

    size: dict[str, int] = {}
    for rec in reversed(agent):  # children start after their parent, so sizes are ready in reverse order
        size[rec.call_id] = 1 + sum(size[c] for c in children[rec.call_id])

    roots = [r for r in agent if parent[r.call_id] is None]
    kept_for = _root_retries(roots, size)
    for retried in kept_for:  # a resent first request: the same chain, not a new one
        split[retried] = "retry"
    main_root = next((r.call_id for r in roots if split.get(r.call_id) != "retry"), None)
    summaries = {r.call_id: r for r in agent if _summary_text(r)}
    for rec in roots:
        if rec.call_id == main_root or rec.call_id in split or rec.parent_call_id is not None:
            continue
        source = _carried_summary(rec, [summaries[c] for c in summaries if by_id[c].started_at < rec.started_at])
        if source is not None:
            origin[rec.call_id] = origin[source.call_id]
            split[rec.call_id] = "compaction"
            if parent[source.call_id] is None and source.call_id != main_root:
                split.setdefault(source.call_id, "compaction")  # the summary asked for in a conversation of its own
        elif (below := _rerendered_from(rec, seen)) is not None:
            origin[rec.call_id] = origin[below.call_id]
    result = BuildResult([], failed)
    segments: Counter[str] = Counter()
    for rec in roots:
        reason = split.get(rec.call_id) or _root_reason(rec)
        chain = origin[rec.call_id]
        if reason == "retry":
            chain = origin[rec.call_id] = origin[kept_for[rec.call_id]]
        role: Role = "main" if chain == main_root else _root_role(by_id[chain])
        if reason == "compaction":
            role = "compaction"
        traces = _paths(rec.call_id, by_id, children, size, split, role, reason, segments[chain], result, cfg)
        segments[chain] += len(traces)
        result.traces += traces
        if reason:
            result.break_reasons[reason] += 1
    for rec in side:
        result.traces.append(_trace([rec], "side", 0, "side_call", cfg))
        result.break_reasons["side_call"] += 1
    _weigh(result.traces)
    return result


def _child_towards(node: str, ancestor: str, parent: dict[str, str | None]) -> str | None:
    """The child of ``ancestor`` on the path up from ``node``, or None when ``ancestor`` is not above ``node``."""
    while (up := parent[node]) is not None:
        if up == ancestor:
            return node
        node = up
    return None


def _root_retries(roots: list[CallRecord], size: dict[str, int]) -> dict[str, str]:
    """Roots given the same prompt as another root, each mapped to the one that stands for the group: the root the
    session continued furthest (the latest of those)."""
    groups: defaultdict[tuple[int, ...], list[CallRecord]] = defaultdict(list)
    for rec in roots:
        groups[tuple(rec.prompt_token_ids)].append(rec)
    kept_for: dict[str, str] = {}
    for same in groups.values():
        kept = max(same, key=lambda r: (size[r.call_id], r.started_at))
        kept_for.update({r.call_id: kept.call_id for r in same if r is not kept})
    return kept_for


def _summary_text(rec: CallRecord) -> str | None:
    """A text-only reply long enough to be recognised where a CLI carries it into a rewritten history."""
    text = (rec.output_text or "").strip()
    if rec.finish_reason != "stop" or "<tool_call>" in text:
        return None
    text = carried_summary(text)
    return text if len(text) >= 24 else None


def _strings(value: object) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def _carried_summary(root: CallRecord, earlier: list[CallRecord]) -> CallRecord | None:
    """The latest earlier text-only reply whose text this root's request carries (a compaction summary)."""
    texts = list(_strings(root.request))
    for rec in sorted(earlier, key=lambda r: r.started_at, reverse=True):
        summary = _summary_text(rec)
        if summary and any(summary in t for t in texts):
            return rec
    return None


def _rerendered_from(root: CallRecord, calls: list[CallRecord]) -> CallRecord | None:
    """For a root the proxy rendered afresh although its history has model turns it produced (the continuation cut
    was not provable, e.g. ``end_of_turn_in_sampled``): the latest earlier call whose prompt this root's prompt
    extends. The chain goes on there in a new segment, with the render reason as its break reason."""
    reason = (root.render_reason or "").removeprefix("engine_render:")
    if reason in ("", "first_call", "new_conversation", "history_diverged", "assistant_turn_not_from_proxy"):
        return None
    earlier = [c for c in calls if c.started_at < root.started_at and c.prompt_token_ids]
    n = len(root.prompt_token_ids)
    found = [
        c
        for c in earlier
        if len(c.prompt_token_ids) < n and root.prompt_token_ids[: len(c.prompt_token_ids)] == c.prompt_token_ids
    ]
    return max(found, key=lambda c: (len(c.prompt_token_ids), c.started_at), default=None)


def _root_reason(rec: CallRecord) -> str | None:
    if rec.parent_call_id is not None:  # linked to a call not traced here (failed, a side call, another file)
        return "context_mismatch"
    reason = (rec.render_reason or "").removeprefix("engine_render:")
    return None if reason in ("first_call", "") else reason


def _root_role(rec: CallRecord) -> Role:
    reason = (rec.render_reason or "").removeprefix("engine_render:")
    return "compaction" if reason in ("history_diverged", "assistant_turn_not_from_proxy") else "subagent"


def _paths(
    root: str,
    by_id: dict[str, CallRecord],
    children: dict[str, list[str]],
    size: dict[str, int],
    split: dict[str, str],
    role: Role,
    reason: str | None,
    first_segment: int,
    result: BuildResult,
    cfg: BuilderConfig,
) -> list[Trace]:
    """Split a call tree into paths: each node continues into the child with the largest subtree (ties go to the
    later call, which is what a retry replaces); every other child starts a new path ("branch", or why it left
    the chain the proxy linked it into)."""
    traces: list[Trace] = []
    pending: list[tuple[str, str | None]] = [(root, reason)]
    while pending:
        node, why = pending.pop(0)
        path = [by_id[node]]
        while children[node]:
            kids = children[node]
            best = max(kids, key=lambda c: (size[c], by_id[c].started_at))
            for other in kids:
                if other != best:
                    same_prompt = by_id[other].prompt_token_ids == by_id[best].prompt_token_ids
                    other_why = split.get(other, "retry" if same_prompt else "branch")
                    pending.append((other, other_why))
                    result.break_reasons[other_why] += 1
            node = best
            path.append(by_id[node])
        traces.append(_trace(path, role, first_segment + len(traces), why, cfg))
    return traces
