"""The screenshot of ``polar view`` in docs/harnesses.md: one real Claude Code session with a subagent and an
auto-compaction.

Runs the scripted session of ``examples/tasks/view_demo/claude_code.yaml`` (the real CLI in bubblewrap, through an
in-process proxy on a running vLLM engine serving the tiny test model), checks that prefix merging finds what the
file expects (a ``subagent`` chain and a ``compaction`` segment among them, nothing lost, the audit clean), writes
the ``polar view`` report and screenshots it with headless Chromium::

    .venv/bin/python examples/view_screenshot.py --engine-url http://127.0.0.1:8011 --out docs/img/polar_view.png

(``make view-screenshot`` does this, with ``ENGINE_URL`` for the engine.)
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx
import yaml
from pydantic import BaseModel, Field

from nemo_polar.env.frontends.patterns import Expect
from nemo_polar.env.harness import get_harness
from nemo_polar.env.harness.script import Action
from nemo_polar.env.runtime.session import run_session
from nemo_polar.proxy.http.config import ProxyConfig
from nemo_polar.proxy.http.serve import ProxyServer
from nemo_polar.reconstruct.patterns import summarize
from nemo_polar.sandbox import get_runtime
from nemo_polar.sandbox.workspace import Task
from nemo_polar.view.report import write_report

EXAMPLES = Path(__file__).resolve().parent
TASK = EXAMPLES / "tasks" / "view_demo" / "claude_code.yaml"
REPO = EXAMPLES / "tasks" / "patterns" / "repo"
MUST_HAVE = ("subagent", "compaction")  # the chain roles the screenshot is for


class DemoTask(BaseModel):
    """A pattern file's fields (:class:`nemo_polar.env.frontends.patterns.PatternTask`) for a session of several
    scenarios."""

    about: str
    instruction: str
    harness_options: dict[str, Any] = Field(default_factory=dict)
    script: list[Action]
    expect: Expect
    timeout_s: float = 300.0


def run_demo(engine_url: str, task_file: Path, work: Path) -> Path:
    """Run the session into ``work/session`` and check its reconstruction; raises ``SystemExit`` if it differs."""
    demo = DemoTask.model_validate(yaml.safe_load(task_file.read_text()))
    harness = get_harness(task_file.stem, **demo.harness_options)
    task = Task(instance_id=f"view_demo-{harness.name}", problem_statement=demo.instruction, repo=REPO)
    config = ProxyConfig(engine_url=engine_url, record_dir=work / "records", model_aliases=["local-model"])
    with ProxyServer(config) as proxy:
        result = run_session(
            harness,
            task,
            get_runtime("bwrap"),
            proxy.client(),
            work / "session",
            script=demo.script,
            timeout=demo.timeout_s,
        )
    if result.status != "completed":
        raise SystemExit(f"the session ended {result.status}: {result.error}")
    row = summarize("view_demo", harness.name, result.records, harness.version)
    got = Expect.observed(row)
    missing = [role for role in MUST_HAVE if role not in row.chains]
    if missing or got != demo.expect or not row.audit_ok or row.tokens_lost:
        raise SystemExit(
            f"reconstruction is not what {task_file.name} expects (missing {missing}):\n"
            f"  got      {got.model_dump()}\n  expected {demo.expect.model_dump()}\n"
            f"  audit ok {row.audit_ok}, {row.tokens_lost} tokens lost {row.audit_failures}"
        )
    print(f"session {result.session_id}: {row.calls} calls, chains {row.chains}, breaks {row.breaks}")
    return result.session_dir


def write_view(engine_url: str, session: Path, work: Path) -> Path:
    """The report of ``session`` (inside ``work``), its tokens decoded with the engine's tokenizer; rendered from
    ``work`` so that the page names the session and tokenizer by short relative paths, not this machine's."""
    [model] = httpx.get(f"{engine_url}/v1/models", timeout=10).raise_for_status().json()["data"]
    tokenizer = work / model["id"]
    if not tokenizer.exists():
        tokenizer.symlink_to(Path(model["root"]), target_is_directory=True)
    with contextlib.chdir(work):
        return work / write_report([session.relative_to(work)], Path("report.html"), Path(model["id"]))


def screenshot(html: Path, out: Path, width: int, height: int) -> None:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        raise SystemExit("chromium is not installed (scripts/setup_system.sh installs it)")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="polar-chromium-") as profile:
        subprocess.run(
            [
                exe,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                "--run-all-compositor-stages-before-draw",  # the whole window painted, not the first tiles
                "--virtual-time-budget=5000",
                f"--user-data-dir={profile}",
                f"--screenshot={out.resolve()}",
                f"--window-size={width},{height}",
                html.resolve().as_uri(),
            ],
            check=True,
            capture_output=True,
            timeout=180,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine-url", required=True, help="a running vLLM engine serving the tiny test model")
    parser.add_argument("--out", type=Path, default=Path("docs/img/polar_view.png"))
    parser.add_argument("--task", type=Path, default=TASK, help="the scripted session; its name is the harness")
    parser.add_argument("--work-dir", type=Path, help="keep the session and report.html here (default: a temp dir)")
    parser.add_argument("--size", default="1280x1600", help="the browser window, WIDTHxHEIGHT")
    args = parser.parse_args(argv)
    width, height = (int(v) for v in args.size.split("x"))
    with tempfile.TemporaryDirectory(prefix="polar-view-demo-") as tmp:
        work = args.work_dir or Path(tmp)
        session = run_demo(args.engine_url, args.task, work)
        report = write_view(args.engine_url, session, work)
        screenshot(report, args.out, width, height)
    print(f"wrote {args.out} ({args.out.stat().st_size // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
