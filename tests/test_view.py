"""``polar view``: real proxy sessions on the real engine rendered to HTML, checked in headless Chromium."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import openai
import pytest

# Resolved at collection, before any proxy exists: the proxy loads the same tokenizer in a worker thread of this
# process, and transformers' lazy module is not safe to resolve from two threads at once.
from transformers import AutoTokenizer

from nemo_polar.cli import main as polar
from nemo_polar.env.gateway import SessionOutcome
from nemo_polar.env.runtime.session import SessionResult, write_session
from nemo_polar.env.runtime.verdict import Verdict
from nemo_polar.proxy.store.records import CallRecord
from nemo_polar.reconstruct.builders import prefix_merging
from nemo_polar.reconstruct.io import load_records, write_traces
from nemo_polar.rewards.grader import GradeResult
from nemo_polar.sandbox.egress import EgressAttempt
from nemo_polar.view.report import render_report, write_report
from tests.conftest import ProxyHandle
from tests.helpers.clients import loopback, openai_client

SCRIPT = "<script>alert('polar')</script>"
PATCH = "diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1 +1 @@\n-return a - b\n+return a + b\n"


class Elements(HTMLParser):
    """Every element of a document with its attributes and the text directly inside it."""

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[dict[str, Any]] = []
        self._open: list[dict[str, Any]] = []
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        el = {"tag": tag, **{k: v or "" for k, v in attrs}, "text": ""}
        self.elements.append(el)
        if tag not in ("meta", "br", "link", "img", "input"):
            self._open.append(el)

    def handle_endtag(self, tag: str) -> None:
        while self._open and self._open.pop()["tag"] != tag:
            pass

    def handle_data(self, data: str) -> None:
        if self._open:
            self._open[-1]["text"] += data

    def by_class(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.elements if name in e.get("class", "").split()]

    def tokens(self, kind: str = "train") -> list[dict[str, Any]]:
        """Token spans of the traces (the legend's samples carry no title)."""
        return [e for e in self.by_class(kind) if "tok" in e["class"].split() and "title" in e]


def chromium(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing in CI: scripts/setup_system.sh installs it")
        pytest.skip("chromium is not installed (Debian: apt-get install chromium; scripts/setup_system.sh does it)")
    profile = tmp / "chromium-profile"
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, check=True)


def converse(client: openai.OpenAI, history: list[dict[str, Any]], turns: int) -> list[dict[str, Any]]:
    for turn in range(turns):
        reply = client.chat.completions.create(model="local-model", messages=history)
        history = [
            *history,
            {"role": "assistant", "content": reply.choices[0].message.content},
            {"role": "user", "content": f"tool output {turn}"},
        ]
    return history


def session_dir(
    root: Path, proxy: ProxyHandle, session_id: str, status: str, **extra: Any
) -> tuple[Path, list[CallRecord]]:
    """A session directory written by the session runner's own writer, from the proxy's records on disk."""
    [records] = load_records([proxy.record_dir / f"{session_id}.jsonl"]).values()
    d = root / "polar_codex" / f"calc_add-{session_id}"
    d.mkdir(parents=True)
    result = SessionResult(
        session_id=session_id,
        harness="codex",
        harness_version="0.169.0",
        runtime="bwrap",
        instance_id="calc_add",
        status=status,  # type: ignore[arg-type]
        exit_code=0 if status == "completed" else 1,
        calls=len(records),
        timings={"setup_s": 0.41, "run_s": 3.2, "collect_s": 0.05},
        session_dir=d,
        records=records,
        **extra,
    )
    write_session(result)
    return d, records


@pytest.fixture(scope="module")
def runs(proxy: ProxyHandle, engine_url: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two real sessions through the proxy: a graded one with one chain, and one whose history the harness
    rewrote (so prefix merging starts a new trace there) that ended with a harness error."""
    root = tmp_path_factory.mktemp("runs")

    good = proxy.session(sampling_overrides={"max_tokens": 8})
    client = openai_client(proxy, good["api_key"])
    converse(client, [{"role": "system", "content": "main agent"}, {"role": "user", "content": f"fix {SCRIPT}"}], 3)
    good_dir, good_records = session_dir(root, proxy, good["session_id"], "completed", patch=PATCH)
    log = good_dir / "eval" / "calc_add-0" / "eval.stdout.log"
    log.parent.mkdir(parents=True)
    log.write_text(">>>>> Start Test Output\ntests/test_calc.py::test_add PASSED\n>>>>> End Test Output\n")
    grade = GradeResult(
        instance_id="calc_add",
        reward=1.0,
        resolved=True,
        status="resolved",
        mask_sample=False,
        fail_to_pass=1.0,
        pass_to_pass=1.0,
        resolution="RESOLVED_FULL",
        log_path=log,
    )
    (good_dir / "grade.json").write_text(grade.model_dump_json(indent=2))

    broken = proxy.session(sampling_overrides={"max_tokens": 8})
    client = openai_client(proxy, broken["api_key"])
    history = converse(client, [{"role": "user", "content": "list the files"}], 2)
    history[0] = {"role": "user", "content": "list the files, briefly"}  # the harness rewrote its history
    converse(client, history, 1)
    egress = [EgressAttempt(kind="dns", target="plugins.example.invalid", at=time.time())]
    broken_dir, broken_records = session_dir(
        root, proxy, broken["session_id"], "harness_error", error=f"exit 1: {SCRIPT}", egress=egress
    )
    now = time.time()
    outcome = SessionOutcome(
        request_id="r1",
        status="published",
        verdict=Verdict(kind="harness_error", reason="harness session harness_error"),
        session_status="harness_error",
        stage_times={"queued": now, "init": now + 0.1, "run": now + 1.0, "postrun": now + 4.2, "done": now + 4.3},
    )
    (broken_dir / "outcome.json").write_text(outcome.model_dump_json(indent=2))

    model_root = Path(loopback.get(f"{engine_url}/v1/models", timeout=10).json()["data"][0]["root"])
    return {
        "root": root,
        "good": (good["session_id"], good_dir, good_records),
        "broken": (broken["session_id"], broken_dir, broken_records),
        "model_root": model_root,
    }


@pytest.mark.engine
def test_report_renders_in_chromium(runs: dict[str, Any], tmp_path: Path) -> None:
    good_id, _, good_records = runs["good"]
    broken_id, _, broken_records = runs["broken"]
    report = tmp_path / "report.html"
    t0 = time.monotonic()
    assert polar(["view", str(runs["root"]), "-o", str(report), "--tokenizer", str(runs["model_root"])]) == 0
    render_s = time.monotonic() - t0
    html = report.read_text()
    assert "http://" not in html and "https://" not in html and "<script" not in html  # self-contained, inert
    assert "<link" not in html and " src=" not in html

    shot = tmp_path / "report.png"
    chromium(tmp_path, f"--screenshot={shot}", "--window-size=1280,2000", report.as_uri())
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 30_000, render_s
    dom = chromium(tmp_path, "--dump-dom", report.as_uri()).stdout
    page = Elements(dom)

    # sessions, found under runs/<env>/<instance>-<id>/, with their status, reward, grader log and patch
    assert [e["text"] for e in page.by_class("session-id")] == [good_id, broken_id]
    sections = {e["data-session-id"]: e for e in page.elements if e["tag"] == "section"}
    assert set(sections) == {good_id, broken_id}
    assert [e["text"] for e in page.by_class("session-status")] == ["completed", "harness_error"]
    assert [e["text"] for e in page.by_class("reward")] == ["1", "masked"]
    assert [e["text"] for e in page.by_class("grade-status")] == ["resolved"]
    assert "tests/test_calc.py::test_add PASSED" in page.by_class("grader-log")[0]["text"]
    assert any(e["text"] == "+return a + b" for e in page.by_class("add"))
    assert "plugins.example.invalid" in dom and "init +0.10 s" in dom

    # every call of both sessions is listed; every trainable token is one span titled with its id and logprob
    calls = page.by_class("call")
    assert len(calls) == len(good_records) + len(broken_records) == 6
    trainable = page.tokens()
    traces = [t for recs in (good_records, broken_records) for t in prefix_merging(recs).traces]
    assert len(trainable) == sum(t.trainable_tokens for t in traces) > 0
    first = good_records[0]
    assert trainable[0]["title"] == f"id {first.sampled_token_ids[0]} · logprob {first.sampled_logprobs[0]:.4f}"
    assert all(e["tag"] == "span" and e["title"].startswith("id ") for e in trainable)
    tokenizer = AutoTokenizer.from_pretrained(str(runs["model_root"]))
    sampled = [i for t in traces for i, m in zip(t.response_ids, t.loss_mask, strict=True) if m]
    # HTML parsing normalises line breaks (CR LF and CR become LF), as every browser does.
    decoded = [tokenizer.decode([i]).replace("\r\n", "\n").replace("\r", "\n") for i in sampled]
    assert [e["text"] for e in trainable] == decoded
    # decoded with the model's tokenizer: the tool results are readable text in the masked context
    assert any("tool output 1" in e["text"] for e in page.by_class("ctx"))

    # the rewritten history: a compaction trace whose break reason is marked, its trace edged as drift
    breaks = [e for e in page.by_class("break-reason") if e["tag"] == "span" and e["text"] == "history_diverged"]
    assert breaks, "the break reason is not shown"
    roles = [(e["data-role"], "drift" in e["class"].split()) for e in page.by_class("trace")]
    assert roles == [("main", False), ("main", False), ("compaction", True)]

    # harness text is escaped: the page holds the text, never an element
    assert not [e for e in page.elements if e["tag"] == "script"]
    assert "&lt;script&gt;alert('polar')&lt;/script&gt;" in dom or "&lt;script&gt;alert(&#39;polar&#39;)" in dom
    assert SCRIPT in html.replace("&lt;", "<").replace("&gt;", ">").replace("&#39;", "'")


@pytest.mark.engine
def test_records_file_shows_ids_and_caps_long_traces(runs: dict[str, Any], tmp_path: Path) -> None:
    _, good_dir, good_records = runs["good"]
    # no tokenizer given and none named by the records ("local-model"): ids are shown
    page = Elements(render_report([good_dir / "records.jsonl"]))
    assert "shown as ids" in "".join(e["text"] for e in page.elements if e["tag"] == "p")
    [trace] = prefix_merging(good_records).traces
    sampled = [f"{i} " for i, m in zip(trace.response_ids, trace.loss_mask, strict=True) if m]
    assert [e["text"] for e in page.tokens()] == sampled and len(sampled) == trace.trainable_tokens
    assert not page.by_class("cap-note") and not page.by_class("elided")

    # a cap below the prompt's length: the prompt's middle is elided and the rest of the trace is noted, not shown
    assert len(trace.prompt_ids) > 20
    capped = Elements(render_report([good_dir / "records.jsonl"], max_tokens=20))
    [note] = capped.by_class("cap-note")
    total = len(trace.prompt_ids) + len(trace.response_ids)
    assert note["text"].startswith(f"showing 20 of {total} tokens")
    [elided] = capped.by_class("elided")
    assert elided["text"] == f"… {len(trace.prompt_ids) - 20} tokens not shown …"
    assert not capped.tokens() and not capped.by_class("call-mark")


@pytest.mark.engine
def test_traces_file_is_audited_against_the_records(runs: dict[str, Any], tmp_path: Path) -> None:
    _, good_dir, good_records = runs["good"]
    [trace] = prefix_merging(good_records).traces
    exact, tampered = tmp_path / "exact.jsonl", tmp_path / "tampered.jsonl"
    write_traces([trace], exact)
    k = trace.spans[-1].start  # the last call's first sampled token: no later context depends on it
    forged = trace.model_copy(update={"response_ids": [*trace.response_ids[:k], 0, *trace.response_ids[k + 1 :]]})
    write_traces([forged], tampered)
    records = good_dir / "records.jsonl"

    ok = Elements(render_report([exact, records]))
    assert [e["text"] for e in ok.by_class("ok")] == ["exact", "exact"] and not ok.by_class("audit-failure")
    bad = Elements(render_report([tampered, records]))
    [failure] = bad.by_class("audit-failure")
    assert failure["text"] == f"audit: {trace.spans[-1].call_id} sampled_mismatch"
    [shown] = bad.by_class("trace")
    assert "drift" in shown["class"].split()
    assert [c["class"].split() for c in bad.by_class("call")] == [["call"]] * 2 + [["call", "drift"]]
    assert bad.by_class("audit-failed")
    # without records there is nothing to audit against, and the page says so
    alone = render_report([tampered])
    assert "audit not run (no records)" in alone and "audit-failure" not in alone


def test_bad_inputs_are_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "r.html")

    def fails(*inputs: Path, extra: tuple[str, ...] = ()) -> str:
        assert polar(["view", *map(str, inputs), "-o", out, *extra]) == 2
        return capsys.readouterr().err

    missing = tmp_path / "nope"
    assert fails(missing) == f"polar view: {missing}: no such file or directory\n"
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    assert f"polar view: {text}: unrecognised input" in fails(text)
    other = tmp_path / "rows.jsonl"
    other.write_text(json.dumps({"instance_id": "x", "model_patch": ""}) + "\n")
    assert f"{other}: not a records or traces JSONL (first line has: instance_id, model_patch)" in fails(other)
    empty_file = tmp_path / "empty.jsonl"
    empty_file.write_text("\n")
    assert f"{empty_file}: empty file" in fails(empty_file)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert f"{empty}: holds no session directory and no records or traces JSONL" in fails(empty)
    (empty / "preds.jsonl").write_text(json.dumps({"instance_id": "x"}) + "\n")  # found, not named: skipped
    assert f"{empty}: holds no session directory" in fails(empty)
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "session.json").write_text('{"session_id": "s"}')
    assert f"{corrupt / 'session.json'}: not a valid SessionResult" in fails(corrupt)
    bad_line = tmp_path / "bad.jsonl"
    bad_line.write_text('{"call_id": "a", "prompt_token_ids": [1]}\n')
    assert f"{bad_line}:1: not a valid call record" in fails(bad_line)
    assert not (tmp_path / "r.html").exists()

    records = tmp_path / "ok.jsonl"
    rec = CallRecord(
        call_id="a",
        session_id="s",
        api="chat",
        mode="continuation",
        request={"model": "m", "messages": [{"role": "user", "content": SCRIPT}]},
        prompt_token_ids=[1, 2],
        sampled_token_ids=[3],
        sampled_logprobs=[-0.5],
        output_text=SCRIPT,
        started_at=1.0,
        complete=True,
    )
    records.write_text(rec.model_dump_json() + "\n")
    assert f"polar view: {tmp_path / 'no-model'}: no such tokenizer directory" in fails(
        records, extra=("--tokenizer", str(tmp_path / "no-model"))
    )
    assert f"polar view: {tmp_path}: cannot load a tokenizer" in fails(records, extra=("--tokenizer", str(tmp_path)))
    html = write_report([records], tmp_path / "r.html").read_text()
    assert "&lt;script&gt;" in html and "<script" not in html

    # the same through a real process: argparse's own errors and ours both exit 2
    cli = [str(Path(sys.executable).with_name("polar")), "view"]
    done = subprocess.run([*cli, str(missing), "-o", out], capture_output=True, text=True)
    assert done.returncode == 2 and str(missing) in done.stderr
    assert subprocess.run([*cli, str(records)], capture_output=True, text=True).returncode == 2  # no -o


def test_chain_tree_nests_chains_under_the_call_they_started_after(tmp_path: Path) -> None:
    """The session's chains as a tree: a subagent under the main call that spawned it, a compaction segment under
    the call that came before it; every chain is an item of the tree on the page."""
    from nemo_polar.view.report import chain_tree
    from tests.helpers.records import subagent_and_compaction

    records = subagent_and_compaction()  # m1 s1 m2 s2 m3 k1, in call order
    traces = prefix_merging(records).traces
    [main] = chain_tree(traces, {r.call_id: r for r in records})
    assert (main.trace.role, main.after_call) == ("main", None)
    assert [(c.trace.role, c.after_call, c.children) for c in main.children] == [
        ("subagent", "m1", []),
        ("compaction", "m3", []),
    ]
    path = tmp_path / "records.jsonl"
    path.write_text("".join(r.model_dump_json() + "\n" for r in records))
    page = Elements(render_report([path]))
    items = [e for e in page.elements if e["tag"] == "li" and "data-trace" in e]
    assert [e["data-trace"] for e in items] == [main.trace.trace_id, *(c.trace.trace_id for c in main.children)]


@pytest.mark.engine
def test_readme_screenshot_session_has_a_subagent_and_a_compaction(engine_url: str, tmp_path: Path) -> None:
    """``make view-screenshot`` reproduces the picture in docs/harnesses.md: the real Claude Code session of
    examples/tasks/view_demo has exactly the chains its file expects (a subagent and a compaction among them; the
    script exits otherwise), and the page shows each of them in the chain tree."""
    import runpy

    script = runpy.run_path(str(Path(__file__).parents[1] / "examples" / "view_screenshot.py"))
    out = tmp_path / "view.png"
    assert script["main"](["--engine-url", engine_url, "--out", str(out), "--work-dir", str(tmp_path)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 50_000
    html = (tmp_path / "report.html").read_text()
    for role in ("main", "subagent", "compaction"):
        assert f"· {role}</a>" in html
    assert str(tmp_path) not in html  # short relative names only
