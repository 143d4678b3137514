"""Multi-context sessions from the real CLIs: subagents, compaction, parallel tool calls, a failing tool call,
an engine error and a dropped stream the CLI retries, and the CLI's own side calls.

Each scenario file under ``examples/tasks/patterns/`` scripts one CLI (the engine is constrained to the script's
text, so ids and logprobs are really sampled; the CLI and its tools are real and run in bubblewrap). For each:
the records are exact (the audit proves every stitched context, and the engine re-scores every trace), prefix
merging finds exactly the expected chains, breaks and render reasons (a silent fallback to fresh rendering changes
the counts), no complete call's tokens are lost, the main chain exports contiguously to NeMo Gym, the SFT export
keeps every agent chain, and ``polar view`` shows the chain tree. The selected sessions run a few at a time before
their tests check them. With ``POLAR_PATTERNS_OUT`` set each session's
summary line is written there for ``polar patterns`` (``make patterns``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from nemo_polar.env.frontends.patterns import SCENARIOS, Expect, PatternTask, load_patterns
from nemo_polar.env.harness import HARNESSES, get_harness
from nemo_polar.env.runtime.session import SessionResult, run_session
from nemo_polar.proxy.http.client import ProxyClient
from nemo_polar.proxy.store.records import CallRecord
from nemo_polar.reconstruct.builders import per_request, prefix_merging
from nemo_polar.reconstruct.envelope import training_traces
from nemo_polar.reconstruct.export import sft_rows
from nemo_polar.reconstruct.gym import check_contiguous, gym_output_items
from nemo_polar.reconstruct.patterns import summarize
from nemo_polar.reconstruct.recompute import recompute_logprobs
from nemo_polar.sandbox import get_runtime
from nemo_polar.sandbox.workspace import Task
from nemo_polar.view.report import render_report
from tests.conftest import ENV_HARNESSES, ProxyHandle, make_proxy
from tests.faults import FaultPoint
from tests.helpers.ahead import RunAhead
from tests.helpers.lanes import DIALECT_HARNESSES, lane

PATTERNS = Path(__file__).resolve().parents[1] / "examples" / "tasks" / "patterns"

CASES = load_patterns(PATTERNS)
RUN = [c for c in CASES if not c.unsupported and not c.blocked]
# What the proxy and reconstruction make of a retried, failed, parallel or dropped call does not depend on which CLI of
# a dialect made it, nor does a compaction's new context (a fresh chain, whatever the CLI summarised): one CLI per
# dialect in make test (Claude Code's summary tag among them), every CLI in make test-full. Subagents and side calls
# are each CLI's own requests, read by per-CLI rules: every CLI in make test.
PER_DIALECT = {"engine_retry", "parallel_tools", "tool_error", "client_disconnect", "compaction"}
KEEP = [c for c in RUN if c.scenario not in PER_DIALECT or c.harness in DIALECT_HARNESSES.values()]


def test_every_scenario_is_scripted_or_explained_for_every_cli() -> None:
    """The table has no holes: each scenario x CLI is a scripted session or a reason the CLI cannot do it."""
    have = {(c.scenario, c.harness) for c in CASES}
    missing = [f"{s}/{h}" for s in SCENARIOS for h in ENV_HARNESSES if (s, h) not in have]
    assert not missing, f"no pattern file for {missing}"
    assert all(c.harness in HARNESSES for c in CASES)
    assert all(len(c.about) > 20 for c in CASES)


@dataclass
class Ran:
    """One scenario's session, run ahead of its test: the result, the fault points it went through, its directory."""

    result: SessionResult | None
    error: BaseException | None
    engine_point: FaultPoint | None
    client_point: FaultPoint | None
    session_dir: Path


def run_case(case: PatternTask, proxy: ProxyHandle, engine_url: str, tmp: Path) -> Ran:
    """The CLI's session: through the shared proxy, or for an engine fault a proxy of its own whose engine URL is a
    fault point, and for a client fault through a fault point in front of the proxy."""
    engine_faults = [f.call for f in case.faults if f.at == "engine"]
    client_faults = [f.call for f in case.faults if f.at == "client"]
    engine_point = client_point = None
    with ExitStack() as stack:
        try:
            if engine_faults:
                engine_point = stack.enter_context(FaultPoint(engine_url, "http_500", engine_faults))
                proxy = stack.enter_context(contextmanager(make_proxy)(engine_point.url, tmp / "records"))
            client = proxy.client()
            if client_faults:
                client_point = stack.enter_context(FaultPoint(proxy.url, "disconnect", client_faults))
                client = ProxyClient(url=client_point.url, admin_url=client.admin_url, admin_token=client.admin_token)
            result = run_session(
                get_harness(case.harness, **case.harness_options),
                Task(instance_id=case.id, problem_statement=case.instruction, repo=PATTERNS / "repo"),
                get_runtime("bwrap"),
                client,
                tmp / "session",
                script=case.script,
                session_config=case.session,
                timeout=case.timeout_s,
            )
        except Exception as exc:  # reported by the scenario's own test
            return Ran(None, exc, engine_point, client_point, tmp / "session")
    return Ran(result, None, engine_point, client_point, tmp / "session")


@pytest.fixture(scope="module")
def sessions(
    request: pytest.FixtureRequest, proxy: ProxyHandle, engine_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunAhead[str, Ran]]:
    """The selected scenarios' sessions by case id, run ahead of their tests a few at a time (helpers/ahead.py)."""
    chosen = [item.callspec.params["case"] for item in request.session.items if item.originalname == "test_pattern"]
    by_id = {case.id: case for case in chosen}
    ahead = RunAhead(lambda i: run_case(by_id[i], proxy, engine_url, tmp_path_factory.mktemp(i)), list(by_id))
    yield ahead
    ahead.close()


def diagnosis(records: list[CallRecord], session_dir: Path) -> str:
    """What decided the session's shape, for a failure seen only on another machine: per call its reason, prompt and
    sampled sizes and request size; and the CLI's own account (its logged token usage and compactions)."""
    lines = [
        f"{r.render_reason} prompt={len(r.prompt_token_ids)} sampled={len(r.sampled_token_ids)} "
        f"request={len(json.dumps(r.request))} out={(r.output_text or '')[:60]!r}"
        for r in records
    ]
    for log in sorted((session_dir / "home").rglob("*.jsonl")):
        for line in log.read_text(errors="replace").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if not isinstance(entry, dict) or entry.get("type") not in ("assistant", "tool_result", "system"):
                continue
            info = (entry.get("systemPayload") or {}).get("info")
            if entry.get("type") == "system" and info is None:
                continue
            lines.append(
                f"{log.name}: {entry.get('type')} {entry.get('subtype') or ''} usage={entry.get('usageMetadata')} "
                f"info={info} chars={len(json.dumps(entry.get('message') or entry.get('toolCallResult')))}"
            )
    return "\n".join(lines)


@pytest.mark.engine
@pytest.mark.parametrize("case", lane(RUN, KEEP, ids=lambda c: c.id))
def test_pattern(case: PatternTask, sessions: RunAhead[str, Ran], model_dir: str) -> None:
    ran = sessions(case.id)
    if ran.error is not None:
        raise ran.error
    result = ran.result
    assert result is not None
    harness = get_harness(case.harness, **case.harness_options)
    assert result.status == "completed", result.error
    assert result.egress == []
    for p, kind in ((ran.engine_point, "engine"), (ran.client_point, "client")):
        if p is not None:  # every injected fault really happened, at the call it was meant for
            assert sorted(p.faulted) == sorted(f.call for f in case.faults if f.at == kind)
    records = result.records
    expect = case.expect
    assert expect is not None

    row = summarize(case.scenario, case.harness, records, harness.version)
    if out := os.environ.get("POLAR_PATTERNS_OUT"):
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / f"{case.id}.json").write_text(row.model_dump_json(indent=1))
    got = Expect.observed(row).model_dump()
    assert got in [e.model_dump() for e in (expect, *case.also)], diagnosis(records, ran.session_dir)

    # Nothing lost, every context proven; a call the proxy linked to its parent was continued, not re-rendered.
    assert row.audit_ok and row.tokens_lost == 0, row.audit_failures
    for rec in records:
        if rec.parent_call_id is not None and rec.complete:
            assert rec.render_reason == "continuation", rec.call_id

    built = prefix_merging(records)
    by_id = {r.call_id: r for r in records}
    # The engine re-scores every trainable token of every trace (what `polar audit --recompute-logprobs` does).
    drift = recompute_logprobs(built.traces, Path(model_dir))
    assert drift["tokens"] == sum(t.trainable_tokens for t in built.traces)
    # NeMo-RL's contiguity rule holds along the main chain; the SFT export keeps every agent chain.
    for trace in built.traces:
        if trace.role == "main":
            check_contiguous(gym_output_items(trace, by_id))
    rows = sft_rows(built.traces, by_id)
    assert [(r.trace_id, r.role) for r in rows] == [(t.trace_id, t.role) for t in built.traces]
    assert all(
        r.messages[-1].role == "assistant" and r.response_ids == t.response_ids
        for r, t in zip(rows, built.traces, strict=True)
    )

    # Every trace as NeMo Gym's training_traces envelope (delivery: all_traces), by either builder: each call the
    # builder traced owned by exactly one trace, nothing masked (the engine's logprobs are finite, no call twice).
    for builder, build in (("prefix_merging", built), ("per_request", per_request(records))):
        envelope = training_traces(case.id.replace("/", "-"), builder, build.traces)
        owned = [s.model_call_id for t in envelope.training_traces.traces for s in t.sampled_spans]
        assert envelope.masked == {} and sorted(owned) == sorted(c for t in build.traces for c in t.call_ids)

    # polar view shows every chain in the session's chain tree.
    html = render_report([ran.session_dir])
    for trace in built.traces:
        assert f'data-trace="{trace.trace_id}"' in html


def test_polar_patterns_table_and_what_it_refuses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from nemo_polar.cli import main as polar
    from nemo_polar.reconstruct.patterns import PatternRow

    tasks, results = tmp_path / "tasks", tmp_path / "results"
    for scenario, harness, body in (
        (
            "subagent",
            "pi",
            "about: Pi has four tools (read, bash, edit, write) and none that starts an agent.\nunsupported: true\n",
        ),
        ("subagent", "claude_code", (PATTERNS / "parallel_tools" / "pi.yaml").read_text()),
    ):
        (tasks / scenario).mkdir(parents=True, exist_ok=True)
        (tasks / scenario / f"{harness}.yaml").write_text(body)
    results.mkdir()
    row = PatternRow(
        scenario="subagent",
        harness="claude_code",
        calls=4,
        chains={"main": 1, "subagent": 1},
        breaks={"new_conversation": 1},
        audit_ok=True,
    )
    (results / "subagent-claude_code.json").write_text(row.model_dump_json())
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- patterns:table -->\nold\n<!-- /patterns:table -->\nrest\n")

    assert polar(["patterns", "--tasks", str(tasks), "--results", str(results), "--markdown", str(readme)]) == 0
    table = capsys.readouterr().out.strip()
    assert "| scenario | claude_code | pi |" in table
    assert (
        "| subagent | 4 calls<br>chains: main 1, subagent 1<br>breaks: new_conversation 1<br>"
        "lost 0 · audit ok | — (1) |" in table
    )
    assert "1. pi, subagent: Pi has four tools" in table
    assert readme.read_text() == f"intro\n<!-- patterns:table -->\n{table}\n<!-- /patterns:table -->\nrest\n"

    # a lost token, a failed audit or a scripted scenario without a result is an error, named
    (results / "subagent-claude_code.json").write_text(row.model_copy(update={"tokens_lost": 3}).model_dump_json())
    assert polar(["patterns", "--tasks", str(tasks), "--results", str(results)]) == 1
    assert "subagent-claude_code: 3 tokens lost" in capsys.readouterr().err
    (results / "subagent-claude_code.json").unlink()
    assert polar(["patterns", "--tasks", str(tasks), "--results", str(results)]) == 1
    assert "subagent-claude_code: not run" in capsys.readouterr().err
    (tasks / "subagent" / "codex.yaml").write_text("about: no script\n")
    with pytest.raises(SystemExit, match="needs instruction, script, expect"):
        polar(["patterns", "--tasks", str(tasks), "--results", str(results)])
