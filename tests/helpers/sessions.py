"""The scripted CLI session every harness test runs (list files, read a file, edit it, run a check, answer) on the
calc_add task, in a runtime of the test's choice, and the checks shared by the runtimes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nemo_polar.env.harness import get_harness
from nemo_polar.env.harness.script import EditFile, Final, ReadFile, Shell
from nemo_polar.env.runtime.session import SessionResult, run_session
from nemo_polar.sandbox import SandboxSpec, get_runtime
from nemo_polar.sandbox.workspace import Task
from tests.conftest import ProxyHandle
from tests.helpers.ahead import RunAhead

TASK_FILE = Path(__file__).resolve().parents[2] / "examples" / "tasks" / "calc_add" / "task.yaml"
TASK_REPO = TASK_FILE.parent / "repo"
CHECK = "python3 -c 'import calc; print(\"sum\", calc.add(2, 3))'"
SCRIPT = [
    Shell(command="ls"),
    ReadFile(path="calc.py"),
    EditFile(path="calc.py", old="    return a - b", new="    return a + b"),
    Shell(command=CHECK),
    Final(text="Fixed add in calc.py."),
]
EXPECTED_PATCH = "-    return a - b\n+    return a + b\n"


def task() -> Task:
    return Task(instance_id="calc-1", problem_statement="Fix add in calc.py so that the tests pass.", repo=TASK_REPO)


def run(proxy: ProxyHandle, harness: str, tmp_path: Path, runtime: str = "bwrap", **kw: object) -> SessionResult:
    return run_session(
        get_harness(harness),
        task(),
        get_runtime(runtime),
        proxy.client(),
        tmp_path / "session",
        script=kw.pop("script", SCRIPT),  # type: ignore[arg-type]
        timeout=kw.pop("timeout", 300),  # type: ignore[arg-type]
        **kw,  # type: ignore[arg-type]
    )


def make_spec(tmp_path: Path, proxy_url: str) -> SandboxSpec:
    spec = SandboxSpec(workspace=tmp_path / "ws", home=tmp_path / "home", run_dir=tmp_path / "run", proxy_url=proxy_url)
    for d in (spec.workspace, spec.home, spec.run_dir):
        d.mkdir()
    return spec


def check_egress_audit(runtime: str, proxy_url: str, tmp_path: Path) -> None:
    """Name lookups from inside, a client's own and one under an HTTPS request, are refused and recorded; no proxy
    variable names another route."""
    probe = (
        "import os, socket, urllib.request\n"
        "print('proxy variables', sorted(k for k in os.environ if k.lower().endswith('_proxy')))\n"
        "try:\n    socket.getaddrinfo('egress-probe.invalid', 443)\nexcept OSError as e:\n    print('dns', e)\n"
        "try:\n    urllib.request.urlopen('https://api.example.com/x', timeout=5)\nexcept OSError as e:\n"
        "    print('http', e)\n"
    )
    with get_runtime(runtime) as rt:
        rt.start(make_spec(tmp_path, proxy_url))
        done = rt.exec(["python3", "-c", probe], {}, cwd=None, timeout=60, log_prefix=tmp_path / "probe")
        attempts = rt.egress_attempts()
    out = done.stdout.read_text()
    assert done.returncode == 0, done.stderr.read_text()
    assert "proxy variables []" in out
    assert "dns" in out and "http" in out  # both refused
    assert {("dns", "egress-probe.invalid"), ("dns", "api.example.com")} <= {(a.kind, a.target) for a in attempts}


def requests_text(result: SessionResult, index: int) -> str:
    return json.dumps(result.records[index].request)


class ScriptedSessions:
    """The scripted session of each harness the selected tests read, in bwrap on the shared proxy, run once, ahead of
    the tests (``RunAhead``), and read by every test that checks a side of it: the harness itself, Gym's token
    entries. Calling it with a harness gives its session and the session's directory."""

    def __init__(self, proxy: ProxyHandle, root: Path, wanted: list[str]) -> None:
        self.proxy, self.root = proxy, root
        self.ahead = RunAhead(self._one, wanted)

    def _one(self, harness: str) -> SessionResult:
        return run(self.proxy, harness, self.root / harness)

    def __call__(self, harness: str) -> tuple[SessionResult, Path]:
        return self.ahead(harness), self.root / harness / "session"


def harnesses_read(session: pytest.Session) -> list[str]:
    """The harnesses whose scripted session the selected tests read (the ``harness`` parameter of each test that
    uses the ``scripted_sessions`` fixture)."""
    return [
        item.callspec.params["harness"]  # type: ignore[attr-defined]
        for item in session.items
        if "scripted_sessions" in getattr(item, "fixturenames", ()) and hasattr(item, "callspec")
    ]
