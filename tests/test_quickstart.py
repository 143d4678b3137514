"""The quick start as a newcomer follows it: every command in the bash blocks of ``docs/quickstart.md`` is run as
written, in order, in a scratch directory that sees the checkout's ``.venv`` and ``examples/`` (so what the commands
write stays out of the tree), on a free port in place of the page's 8011. ``make demo`` is run by
``tests/test_demo.py`` (its program, on the shared engine) and ``make test`` by CI; any other command added to the
page without being run here fails the test. The README must stay short and link only to pages that exist."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest

from nemo_polar.engine.launcher import free_port
from tests.conftest import ROOT

pytestmark = pytest.mark.engine

QUICKSTART = ROOT / "docs" / "quickstart.md"
RUN_ELSEWHERE = {"make demo": "tests/test_demo.py", "make test": "CI"}
PAGE_PORT = "8011"


def page_commands() -> list[str]:
    blocks = re.findall(r"^```bash\n(.*?)^```", QUICKSTART.read_text(), flags=re.S | re.M)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


def _json_out(stdout: str) -> dict[str, Any]:
    """The JSON summary a command prints last (after any progress output)."""
    return json.loads(stdout[stdout.index("{") :])


def test_every_quickstart_command_runs_as_written(tmp_path: Path) -> None:
    commands = page_commands()
    assert set(RUN_ELSEWHERE) <= set(commands)
    ours = [c for c in commands if c not in RUN_ELSEWHERE]
    assert ours and all(c.startswith(".venv/bin/polar ") for c in ours), ours
    assert ours[0].startswith(".venv/bin/polar engine up") and ours[-1].startswith(".venv/bin/polar engine down")

    for name in (".venv", "examples"):
        (tmp_path / name).symlink_to(ROOT / name)
    port = str(free_port())
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLAR_TEST_")}
    outputs: dict[str, subprocess.CompletedProcess[str]] = {}
    try:
        for command in ours:
            argv = [arg.replace(PAGE_PORT, port) for arg in shlex.split(command)]
            done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
            assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
            outputs[command] = done
    finally:
        subprocess.run([str(ROOT / ".venv/bin/polar"), "engine", "down", "--port", port], capture_output=True)

    by_verb = {c.split()[1]: c for c in ours if c.split()[1] not in ("rollout", "engine")}
    rollouts = [c for c in ours if c.split()[1] == "rollout"]
    assert outputs[ours[0]].stdout.strip() == f"http://127.0.0.1:{port}"
    assert outputs[ours[-1]].stdout.strip() == f"stopped http://127.0.0.1:{port}"

    # One Codex session on a task: completed, its records audited exact, and a page to look at.
    [session_cmd] = [c for c in rollouts if " task=" in c]
    session = _json_out(outputs[session_cmd].stdout)
    assert session["env"] == "polar_codex" and session["status"] == "completed" and session["calls"] == 5
    session_dir = tmp_path / session["session_dir"]
    assert len((session_dir / "records.jsonl").read_text().splitlines()) == 5
    assert (session_dir / "patch.diff").read_text().count("+    return a + b") == 1
    audit = _json_out(outputs[by_verb["audit"]].stdout)
    assert audit["ok"] is True and audit["tokens_lost"] == 0 and audit["traces"] == 1
    [page] = [Path(a) for a in shlex.split(by_verb["view"]) if a.endswith(".html")]
    assert 'class="session"' in (tmp_path / page).read_text()

    # A GRPO group of two attempts at a bundled SWE task, graded and reconstructed with advantages.
    [group_cmd] = [c for c in rollouts if " dataset=" in c]
    group = _json_out(outputs[group_cmd].stdout)
    assert group["attempts"] == group["resolved"] == group["trainable"] == 2 and group["mean_reward"] == 1.0
    traces = [json.loads(line) for line in (tmp_path / group["out"] / "traces.jsonl").read_text().splitlines()]
    assert len(traces) == 2 and all(t["reward"] == 1.0 and t["advantage"] == 0.0 for t in traces)


def test_readme_is_short_and_links_to_pages_that_exist() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme)
    assert "docs/quickstart.md" in links
    for link in links:
        assert (ROOT / link).is_file(), link
