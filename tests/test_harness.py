"""The real coding CLIs, unchanged, in bubblewrap sandboxes that reach only the proxy.

Each runs a scripted multi-turn session (the engine is constrained to the script's text, so the ids and logprobs
are really sampled): list files, read a file, edit it, run a check, answer. The tools really run in the sandbox;
the records, the patch, the merged trace and the egress audit are checked.
"""

from __future__ import annotations

import json
import secrets
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from nemo_polar.env.harness import get_harness
from nemo_polar.env.harness.script import Final, Shell
from nemo_polar.env.runtime.session import run_session
from nemo_polar.proxy.http.client import ProxyClient
from nemo_polar.reconstruct.audit import audit
from nemo_polar.reconstruct.builders import per_request, prefix_merging
from nemo_polar.reconstruct.export import sft_rows
from nemo_polar.reconstruct.gym import check_contiguous, gym_output_items
from nemo_polar.reconstruct.recompute import recompute_logprobs
from nemo_polar.sandbox import SandboxSpec, get_runtime
from nemo_polar.sandbox.workspace import Task
from tests.conftest import ENV_HARNESSES, ProxyHandle
from tests.helpers.lanes import lane
from tests.helpers.sessions import (
    EXPECTED_PATCH,
    SCRIPT,
    TASK_FILE,
    TASK_REPO,
    ScriptedSessions,
    check_egress_audit,
    make_spec,
    requests_text,
    run,
    task,
)

pytestmark = pytest.mark.engine


@pytest.mark.parametrize("harness", ENV_HARNESSES)
def test_scripted_session_in_bwrap(scripted_sessions: ScriptedSessions, model_dir: str, harness: str) -> None:
    """Every CLI's session end to end: sandbox, proxy, records, patch, reconstruction, audit, exports, recomputed
    logprobs. The session is the one the other front-end tests read (``scripted_sessions``)."""
    result, session_dir = scripted_sessions(harness)
    assert result.status == "completed", result.error
    assert result.exit_code == 0
    assert result.egress == []  # nothing but the proxy was attempted

    # Five model calls, each constrained to the script's text and recorded completely.
    recs = result.records
    assert [r.complete for r in recs] == [True] * 5
    assert recs[-1].output is not None and recs[-1].output["content"] == "Fixed add in calc.py."  # as parsed
    assert all(r.sampled_token_ids and len(r.sampled_logprobs) == len(r.sampled_token_ids) for r in recs)
    # The tools really ran inside the sandbox: their output reached the model in the next request.
    assert "test_calc.py" in requests_text(result, 1)  # ls
    assert "return a - b" in requests_text(result, 2)  # read
    assert "sum 5" in requests_text(result, 4)  # the check ran on the edited file

    # The patch is the edit, nothing from the harness's home or caches.
    assert EXPECTED_PATCH in result.patch
    assert "calc.py" in result.patch and "__pycache__" not in result.patch
    assert (session_dir / "patch.diff").read_text() == result.patch

    # One main chain, no breaks, and the audit proves every stitched context.
    built = prefix_merging(recs)
    main = [t for t in built.traces if t.role == "main"]
    assert len(main) == 1 and len(built.traces) == 1
    assert [s.call_id for s in main[0].spans] == [r.call_id for r in recs]
    assert not built.break_reasons
    report = audit(built.traces, recs)
    assert report.ok, report

    # The rest of reconstruction on the same real session: per-request traces, the NeMo Gym export (the
    # contiguity rule NeMo-RL asserts), SFT rows with messages, and logprob recomputation under the same weights.
    per_call = per_request(recs)
    assert len(per_call.traces) == 5 and audit(per_call.traces, recs).ok
    items = gym_output_items(main[0], {r.call_id: r for r in recs})
    check_contiguous(items)
    assert [it["generation_token_ids"] for it in items] == [r.sampled_token_ids for r in recs]
    [row] = sft_rows(built.traces, recs, {result.session_id: {"harness": harness}})
    assert row.messages[-1].role == "assistant" and row.messages[-1].content == "Fixed add in calc.py."
    assert any(m.role == "tool" and "return a - b" in (m.content or "") for m in row.messages)
    assert json.loads(row.metadata)["harness"] == harness
    # Scripted turns are held to their ids by a logits processor, and vLLM reports the model's own (raw) logprobs of
    # what it sampled: recomputing under the same weights agrees (CPU float noise), so the records carry the policy's
    # logprobs even where the script chose the tokens. (A structured-outputs mask gave the masked sampler's, near 0.)
    drift = recompute_logprobs(built.traces, Path(model_dir))
    assert drift["tokens"] == main[0].trainable_tokens
    assert drift["mean_abs_logprob_delta"] < 0.05 and drift["kl_k3"] < 0.01, drift

    saved = json.loads((session_dir / "session.json").read_text())
    assert saved["status"] == "completed" and saved["harness"] == harness
    disk = [json.loads(line) for line in (session_dir / "records.jsonl").read_text().splitlines()]
    assert [r["call_id"] for r in disk] == [r.call_id for r in recs]


def test_egress_audit_records_and_refuses(proxy: ProxyHandle, tmp_path: Path) -> None:
    """The audit is not vacuous."""
    check_egress_audit("bwrap", proxy.url, tmp_path)


def test_sandbox_isolation(proxy: ProxyHandle, tmp_path: Path) -> None:
    """Only the workspace and home are writable, host files are invisible, the proxy answers through the relay."""
    spec = make_spec(tmp_path, proxy.url)
    script = (
        "touch /workspace/ok /root/ok; touch /usr/x 2>/dev/null && echo usr-writable; "
        f"test -e {tmp_path} && echo host-visible; echo pid1=$(cat /proc/1/comm); "
        "exec 3<>/dev/tcp/127.0.0.1/18080; printf 'GET /health HTTP/1.0\\r\\n\\r\\n' >&3; head -1 <&3"
    )
    with get_runtime("bwrap") as rt:
        rt.start(spec)
        done = rt.exec(["bash", "-c", script], {}, cwd=None, timeout=60, log_prefix=tmp_path / "iso")
    out = done.stdout.read_text()
    assert done.returncode == 0, done.stderr.read_text()
    assert (spec.workspace / "ok").exists() and (spec.home / "ok").exists()
    assert "usr-writable" not in out and "host-visible" not in out
    assert "pid1=bwrap" in out
    assert "200 OK" in out


def test_hang_times_out_and_kills_the_group(engine_url: str, tmp_path: Path) -> None:
    """A CLI that never finishes: the engine holds the end of its first model call until the test lets it go, so
    the CLI is hung whatever the machine's load, and only the wall-clock budget can end it."""
    from tests.conftest import make_proxy
    from tests.faults import FaultPoint

    with FaultPoint(engine_url, "hold_finish", [0]) as point:
        for handle in make_proxy(point.url, tmp_path / "records"):
            try:
                result = run(handle, "pi", tmp_path, timeout=15)
            finally:
                point.release()
    assert result.status == "timeout"
    assert result.exit_code is None
    assert "killed" in (result.error or "")
    assert (tmp_path / "session" / "session.json").exists()


def test_crash_is_a_harness_error(proxy: ProxyHandle, tmp_path: Path) -> None:
    """Codex rejects a Chat Completions provider outright; the session records the CLI's own error."""

    class Broken(type(get_harness("codex"))):  # type: ignore[misc]
        def launch(self, *a, **kw):  # type: ignore[no-untyped-def]
            launch = super().launch(*a, **kw)
            launch.argv = [arg.replace('wire_api="responses"', 'wire_api="chat"') for arg in launch.argv]
            return launch

    result = run_session(
        Broken(), task(), get_runtime("bwrap"), proxy.client(), tmp_path / "s", script=SCRIPT, timeout=120
    )
    assert result.status == "harness_error"
    assert result.exit_code not in (0, None)
    assert "wire_api" in (result.error or "")
    assert result.records == []


def test_unreachable_proxy_fails_fast(tmp_path: Path) -> None:
    """Codex would retry forever; the sandbox init checks the route first."""
    from nemo_polar.engine.launcher import free_port

    dead = ProxyClient(url=f"http://127.0.0.1:{free_port()}", admin_url=f"http://127.0.0.1:{free_port()}")
    with pytest.raises(ConnectionError, match="unreachable"):
        run_session(get_harness("codex"), task(), get_runtime("bwrap"), dead, tmp_path / "s", timeout=60)


def test_missing_cli_and_runtime_say_what_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from nemo_polar.env.harness import HarnessMissing
    from nemo_polar.sandbox import RuntimeUnavailable

    monkeypatch.setenv("POLAR_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(HarnessMissing, match="make setup"):
        get_harness("pi").require()
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap, no socat
    spec = SandboxSpec(workspace=tmp_path, home=tmp_path, run_dir=tmp_path, proxy_url="http://127.0.0.1:1")
    with pytest.raises(RuntimeUnavailable, match="bubblewrap"):
        get_runtime("bwrap").start(spec)
    with pytest.raises(ValueError, match="unknown harness"):
        get_harness("cursor")
    with pytest.raises(ValueError, match="unknown runtime"):
        get_runtime("firejail")


def test_workspace_has_no_other_commits(tmp_path: Path) -> None:
    """A git task repository is flattened to its base commit: later commits (the fix) are unreachable."""
    import subprocess

    from nemo_polar.sandbox.workspace import git, prepare_workspace

    repo = tmp_path / "repo"
    shutil.copytree(TASK_REPO, repo)
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    base = git(repo, "rev-parse", "HEAD").decode().strip()
    (repo / "calc.py").write_text((repo / "calc.py").read_text().replace("a - b", "a + b"))
    git(repo, "commit", "-qam", "the fix")
    ws = prepare_workspace(Task(instance_id="t", problem_statement="p", repo=repo, base_commit=base), tmp_path / "ws")
    assert "a - b" in (ws / "calc.py").read_text()
    log = subprocess.run(["git", "log", "--all", "--oneline"], cwd=ws, capture_output=True, text=True).stdout
    assert len(log.splitlines()) == 1 and "fix" not in log


def test_host_relay_listens_before_the_sandbox_starts(tmp_path: Path) -> None:
    """The relay is handed out only once its socket is bound: a sandbox started right after it reaches the proxy
    (before, a sandbox that started while socat was still starting failed its proxy check under load)."""
    from nemo_polar.sandbox import RuntimeUnavailable
    from nemo_polar.sandbox.hostside import HostRelay

    for _ in range(5):
        relay = HostRelay(tmp_path, "http://127.0.0.1:1")
        try:
            assert relay.socket.is_socket() and relay.proc.poll() is None
        finally:
            relay.close()
        relay.socket.unlink(missing_ok=True)  # socat removes it on a clean exit
    with pytest.raises(RuntimeUnavailable, match="did not listen"):
        HostRelay(tmp_path / "missing", "http://127.0.0.1:1", timeout_s=5)


def test_sandbox_without_a_proxy_route_fails_fast(tmp_path: Path) -> None:
    from nemo_polar.engine.launcher import free_port
    from nemo_polar.sandbox.base import PROXY_UNREACHABLE

    spec = make_spec(tmp_path, f"http://127.0.0.1:{free_port()}")
    with get_runtime("bwrap") as rt:
        rt.start(spec)
        done = rt.exec(["true"], {}, cwd=None, timeout=60, log_prefix=tmp_path / "x")
    assert done.returncode == PROXY_UNREACHABLE
    assert done.duration_s < 30
    assert "model proxy is not reachable from the sandbox" in done.stderr.read_text()


@pytest.mark.parametrize("harness", ENV_HARNESSES)
def test_every_env_composes_into_its_harness(harness: str) -> None:
    """`env=polar_<cli>` composes (Hydra) into a spec whose adapter takes its options: what `polar rollout` runs.
    Each adapter's session itself runs in test_scripted_session_in_bwrap; the command line once, below."""
    from nemo_polar.env.frontends.rollout import compose, env_spec

    spec = env_spec(compose([f"env=polar_{harness}", f"task={TASK_FILE}", "engine.url=http://127.0.0.1:1"]))
    assert spec.name == f"polar_{harness}" and spec.harness == harness
    assert get_harness(spec.harness, **spec.harness_options).name == harness


def test_polar_rollout_cli(engine_url: str, tmp_path: Path) -> None:
    """`polar rollout env=polar_<cli> task=FILE` composes the Hydra config and writes the session directory."""
    import subprocess
    import sys

    out = tmp_path / "rollout"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "nemo_polar.cli",
            "rollout",
            "env=polar_codex",
            f"task={TASK_FILE}",
            f"engine.url={engine_url}",
            f"out={out}",
            "timeout=300",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["env"] == "polar_codex" and summary["status"] == "completed" and summary["calls"] == 5
    assert EXPECTED_PATCH in (out / "patch.diff").read_text()
    assert json.loads((out / "session.json").read_text())["harness"] == "codex"


def test_a_task_files_script_is_used_unless_scripted_is_false(tmp_path: Path) -> None:
    """``polar rollout task=FILE``: the file's scripted turns by default, none with ``scripted=false`` (the model acts
    on its own), and ``scripted=true`` refused for a file without a script."""
    from nemo_polar.env.frontends.rollout import load_task, task_script

    task = load_task(TASK_FILE)
    assert task.script and task_script(task, None) == task.script == task_script(task, True)
    assert task_script(task, False) is None
    bare = tmp_path / "task.yaml"
    data = yaml.safe_load(TASK_FILE.read_text()) | {"repo": str(task.repo)}
    bare.write_text(yaml.safe_dump({k: v for k, v in data.items() if k != "script"}))
    with pytest.raises(ValueError, match=r"scripted=true, but the task file of .* has no script"):
        task_script(load_task(bare), True)
    assert task_script(load_task(bare), None) is None


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["env=polar_cursor", "task=x.yaml"], "Could not find 'env/polar_cursor'"),
        (
            ["env=polar_pi", "task=missing.yaml", "engine.url=http://127.0.0.1:1"],
            "task file missing.yaml does not exist",
        ),
        (["env=polar_pi", f"task={TASK_FILE}", "engine.url=null"], "no engine"),
        (["env=polar_pi"], "task"),
    ],
)
def test_polar_rollout_bad_input(overrides: list[str], message: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from nemo_polar.cli import main

    monkeypatch.delenv("POLAR_ENGINE_URL", raising=False)
    with pytest.raises(SystemExit, match=message):
        main(["rollout", *overrides])


def process_lines_holding(secret: str) -> list[str]:
    """The command line of every process on this machine that holds ``secret``."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes()
        except OSError:  # gone since the listing
            continue
        if secret.encode() in argv:
            found.append(argv.replace(b"\0", b" ").decode(errors="replace"))
    return found


@pytest.mark.parametrize("runtime", ["bwrap", "docker", "local"])
def test_what_a_command_inside_is_given_is_on_no_command_line(runtime: str, tmp_path: Path) -> None:
    """A session's API key reaches the harness by its environment: while the command runs (it waits for a file the
    test writes after looking), no process on the machine, the runtime's own launcher included, carries the key in
    its argv, which every local user can read."""
    secret = f"polar-{secrets.token_urlsafe(24)}"
    spec = make_spec(tmp_path, "http://127.0.0.1:1").model_copy(update={"proxy_url": None})
    # It waits in the workspace, which every runtime binds (a grading container's home is the image's own).
    script = 'echo "seen:$POLAR_TEST_KEY"; while [ ! -e go ]; do sleep 0.05; done'
    stdout = tmp_path / "env.stdout.log"
    with get_runtime(runtime) as rt, ThreadPoolExecutor(1) as pool:
        rt.start(spec)
        given = {"POLAR_TEST_KEY": secret}
        job = pool.submit(rt.exec, ["bash", "-c", script], given, cwd=None, timeout=300, log_prefix=tmp_path / "env")
        for _ in range(6000):  # the command has started and printed what it was given
            if job.done() or (stdout.exists() and "seen:" in stdout.read_text()):
                break
            time.sleep(0.05)
        holding = process_lines_holding(secret)
        (spec.workspace / "go").touch()
        done = job.result()
    assert holding == []
    assert done.returncode == 0, done.stderr.read_text()
    assert stdout.read_text().strip() == f"seen:{secret}"


def test_mini_swe_agent_text_mode_and_a_reply_it_drops(proxy: ProxyHandle, tmp_path: Path) -> None:
    """mini-swe-agent's text mode reads one fenced command per reply; a reply without one is a format error it
    answers without keeping the reply, so that sampled turn is in no later prompt: it stays a trace of its own (no
    token lost), and the session goes on as a new chain from the error message."""
    from nemo_polar.env.harness.mini_swe_agent import MiniSweAgent
    from nemo_polar.proxy.store.sessions import ScriptTurn
    from nemo_polar.reconstruct.patterns import summarize

    class Rambling(MiniSweAgent):
        """Its first reply is text without a command, as a policy's may be."""

        def action_turn(self, action: Final | Shell, workspace: str) -> ScriptTurn:  # type: ignore[override]
            if isinstance(action, Final) and action.text.startswith("Let me"):
                return ScriptTurn(content=action.text)
            return super().action_turn(action, workspace)

    text = MiniSweAgent(mode="text")
    result = run_session(
        text, task(), get_runtime("bwrap"), proxy.client(), tmp_path / "text", script=SCRIPT, timeout=300
    )
    assert result.status == "completed", result.error
    assert len(result.records) == 5 and EXPECTED_PATCH in result.patch
    assert "```mswea_bash_command" in requests_text(result, 1)  # the reply, echoed verbatim as text
    assert "<returncode>0</returncode>" in requests_text(result, 1)  # the observation, a user message
    assert len(prefix_merging(result.records).traces) == 1

    script = [Final(text="Let me look around first."), *SCRIPT]
    dropped = run_session(
        Rambling(), task(), get_runtime("bwrap"), proxy.client(), tmp_path / "dropped", script=script, timeout=300
    )
    assert dropped.status == "completed", dropped.error
    assert len(dropped.records) == 6 and EXPECTED_PATCH in dropped.patch
    assert "Let me look around first." not in requests_text(dropped, 1)  # not kept ...
    assert "No tool calls found" in requests_text(dropped, 1)  # ... answered with a format error
    row = summarize("format_error", "mini_swe_agent", dropped.records, MiniSweAgent.version)
    assert row.tokens_lost == 0 and row.audit_ok, row.audit_failures
    built = prefix_merging(dropped.records)
    assert [t.call_ids for t in built.traces] == [[r.call_id] for r in dropped.records[:1]] + [
        [r.call_id for r in dropped.records[1:]]
    ]


def test_hermes_verify_nudges_are_turns_of_the_same_chain(proxy: ProxyHandle, tmp_path: Path) -> None:
    """With Hermes's own verify-on-stop, a final reply after an edit without test evidence is answered with a nudge
    (a user turn) instead of ending the run, up to twice: three final replies, all in one chain, no token lost."""
    from nemo_polar.env.harness.hermes import Hermes
    from nemo_polar.reconstruct.patterns import summarize

    finals = [Final(text="Fixed add in calc.py."), Final(text="Checked it by hand."), Final(text="Done.")]
    result = run_session(
        Hermes(verify_on_stop=True),
        task(),
        get_runtime("bwrap"),
        proxy.client(),
        tmp_path / "session",
        script=[*SCRIPT[:-1], *finals],
        timeout=300,
    )
    assert result.status == "completed", result.error
    assert len(result.records) == len(SCRIPT) + 2 and EXPECTED_PATCH in result.patch
    nudged = [r for r in result.records if "fresh passing verification evidence" in json.dumps(r.request)]
    assert len(nudged) == 2  # the two calls after the first two final replies
    row = summarize("verify_nudge", "hermes", result.records, Hermes.version)
    assert row.tokens_lost == 0 and row.audit_ok, row.audit_failures
    assert [t.call_ids for t in prefix_merging(result.records).traces] == [[r.call_id for r in result.records]]


OTHER_DIALECTS = [
    ("copilot", "responses"),
    ("copilot", "messages"),
    ("cline", "messages"),
    ("opencode", "responses"),
    ("opencode", "messages"),
]


# make test: each other dialect once (a CLI's provider configuration for it); make test-full: every CLI in each.
@pytest.mark.parametrize(
    ("harness", "api"),
    lane(OTHER_DIALECTS, [("copilot", "responses"), ("cline", "messages")], ids=lambda c: "-".join(c)),
)
def test_a_harness_over_its_other_dialects(proxy: ProxyHandle, harness: str, api: str, tmp_path: Path) -> None:
    """Copilot CLI's and opencode's provider can be OpenAI Responses or Anthropic Messages, Cline's Anthropic Messages,
    as well as Chat Completions (their environments' default, run everywhere else): the same session, one chain, in
    each."""
    result = run_session(
        get_harness(harness, api=api),
        task(),
        get_runtime("bwrap"),
        proxy.client(),
        tmp_path / "s",
        script=SCRIPT,
        timeout=300,
    )
    assert result.status == "completed", result.error
    assert {r.api for r in result.records} == {"responses" if api == "responses" else "anthropic"}
    assert len(result.records) == len(SCRIPT) and EXPECTED_PATCH in result.patch and result.egress == []
    assert [t.call_ids for t in prefix_merging(result.records).traces] == [[r.call_id for r in result.records]]


@pytest.mark.parametrize(
    ("harness", "option", "allowed"),
    [
        ("copilot", "api", "chat, responses, messages"),
        ("cline", "api", "chat, messages"),
        ("opencode", "api", "chat, responses, messages"),
        ("mini_swe_agent", "mode", ""),
    ],
)
def test_a_bad_harness_option_is_a_clear_error(harness: str, option: str, allowed: str) -> None:
    with pytest.raises(ValueError, match=f"{harness} {option} must be one of {allowed}.*not 'gemini'"):
        get_harness(harness, **{option: "gemini"})


def test_a_session_of_several_runs_is_one_command_and_one_transcript() -> None:
    """Follow-up prompts are later runs of the same CLI session (Gemini CLI resumes the latest), each only after
    the one before succeeded, in one command line; their JSON outputs read back as one transcript, a list."""
    import shlex

    from nemo_polar.env.harness.base import Endpoint

    cli = get_harness("gemini_cli", follow_ups=["Now fix it."])
    launch = cli.launch("Look first.", Endpoint(base_url="http://x", api_key="k"), root="/r", home="/h", workspace="/w")
    assert launch.argv[:2] == ["/bin/sh", "-c"]
    first, second = (shlex.split(run) for run in launch.argv[2].split(" && "))
    assert first[-2:] == ["-p", "Look first."] and second[-4:] == ["-r", "latest", "-p", "Now fix it."]
    assert (
        get_harness("gemini_cli")
        .launch("x", Endpoint(base_url="h", api_key="k"), root="/r", home="/h", workspace="/w")
        .argv[0]
        == "/r/node_modules/.bin/gemini"
    )
    assert cli.transcript('{"response": "a"}\n{"response": "b"}\n') == [{"response": "a"}, {"response": "b"}]
    assert cli.transcript('{"response": "a"}') == {"response": "a"}
    assert cli.transcript("not json") is None
