"""A NeMo Gym user's path as ``docs/train.md`` writes it: the page's Gym CLI blocks run as written (bash, in a scratch
working directory that sees the checkout's ``.venv``, the shared engine's port for the page's 8011, and no
``.venv/bin`` on ``PATH``: Gym runs no uv). ``gym env start`` brings up the agent, Gym's relay and the native server
from the venvs ``polar gym-venvs`` prepared; ``gym eval run`` collects a rollout through the agent and one through the
native server."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from nemo_polar.env.gym import agent_name, venvs
from nemo_polar.env.gym.rows import split_rows
from tests.conftest import ROOT
from tests.helpers.doc_blocks import doc_block, run_block
from tests.helpers.lanes import FULL

pytestmark = pytest.mark.engine

TRAIN = ROOT / "docs" / "train.md"
PAGE_PORT = "8011"


def page_block(name: str) -> str:
    """The bash block after ``<!-- gym-cli: NAME -->`` on the page."""
    return doc_block(TRAIN, "gym-cli", name)


def page_env(cwd: Path) -> dict[str, str]:
    """What the page's blocks run with: a working directory that sees the checkout's ``.venv``, no ``.venv/bin`` on
    ``PATH`` (so Gym runs no uv) and none of the tests' settings."""
    (cwd / ".venv").symlink_to(ROOT / ".venv")
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if Path(p) != ROOT / ".venv" / "bin")
    return {k: v for k, v in os.environ.items() if not k.startswith(("POLAR_TEST_", "NEMO_GYM_"))} | {"PATH": path}


def assert_rewarded_rows(path: Path) -> dict[str, object]:
    """One row of Gym's shape, rewarded and trainable: the main chain's items with token ids and logprobs."""
    [row] = [json.loads(line) for line in path.read_text().splitlines()]
    assert row["reward"] == 1.0 and row["resolved"] is True and row["mask_sample"] is False, path
    items = [item for item in row["response"]["output"] if item.get("generation_token_ids")]
    assert items and all(
        len(i["generation_token_ids"]) == len(i["generation_log_probs"]) > 0 and i["prompt_token_ids"] for i in items
    ), path
    return row


def _status(cwd: Path, env: dict[str, str]) -> list[dict[str, object]]:
    done = subprocess.run(
        [str(ROOT / ".venv/bin/gym"), "env", "status", "--json"], cwd=cwd, env=env, capture_output=True, text=True
    )
    try:
        servers = json.loads(done.stdout[done.stdout.index("[") :]) if "[" in done.stdout else []
    except ValueError:
        return []
    return servers if isinstance(servers, list) else []


def test_gyms_cli_runs_a_polar_environment_as_the_page_writes_it(tmp_path: Path, engine_url: str) -> None:
    port = engine_url.rsplit(":", 1)[1]
    env = page_env(tmp_path)
    servers_log = tmp_path / "servers.log"
    with servers_log.open("w") as log:
        servers = subprocess.Popen(
            ["bash", "-euo", "pipefail", "-c", page_block("servers").replace(PAGE_PORT, port)],
            cwd=tmp_path,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 300
        while len(up := _status(tmp_path, env)) < 3 or not all(s.get("status") == "success" for s in up):
            assert servers.poll() is None, servers_log.read_text()[-3000:]
            assert time.monotonic() < deadline, servers_log.read_text()[-3000:]
            time.sleep(3)
        assert sorted(str(s.get("process_name")) for s in up) == [
            "polar_pi_agent",
            "polar_pi_environment_server",
            "polar_pi_native",
        ]
        done = run_block(page_block("rollouts"), tmp_path, env, timeout=600)
    finally:
        os.killpg(servers.pid, signal.SIGTERM)  # gym env start stops its servers and its Ray cluster
        servers.wait(timeout=120)

    # Gym ran each server from the venv where it looks for it; on a Python older than nemo-gym's marker, the overlay
    # polar gym-venvs put there (Gym ran no uv: it is not on PATH).
    log = servers_log.read_text()
    for server_type, name in venvs.servers("polar_pi"):
        assert f"from venv {tmp_path / server_type / name / '.venv'}" in log
        if not venvs.gym_builds_its_venvs():
            assert list(
                (tmp_path / server_type / name / ".venv").glob(f"lib/python*/site-packages/{venvs.OVERLAY_PTH}")
            )
    agent, native = (assert_rewarded_rows(tmp_path / p) for p in ("rollouts/agent.jsonl", "rollouts/native.jsonl"))
    assert agent["instance_id"] == native["instance_id"]
    # Gym's post-run health checks: every one observes the agent's rollout (it carries the trajectory and usage they
    # read); through the native server Gym alone builds the trajectory, from a capture our calls never reach.
    agent_health, native_health = re.findall(r"Rollout health: [^\n]*", done.stdout)
    assert agent_health.startswith("Rollout health: 1 checked, 1 healthy, 0 unhealthy, 0 unobserved"), agent_health
    assert native_health.startswith("Rollout health: 1 checked, 0 healthy, 0 unhealthy, 1 unobserved"), native_health


@FULL
def test_gyms_one_step_collects_a_split_through_the_agent_and_the_native_server(
    tmp_path: Path, engine_url: str
) -> None:
    """The page's one-step block as written: ``gym eval run --split validation`` starts the servers, prepares the
    split (flat rows to the agent; the native variant's materialized tasks to the native server), collects, stops the
    servers and reports health."""
    script = page_block("one-step").replace(PAGE_PORT, engine_url.rsplit(":", 1)[1])
    done = run_block(script, tmp_path, page_env(tmp_path), timeout=900)
    first_validation_task = split_rows(agent_name("polar_pi"), "validation")[0]["instance_id"]
    for path in ("rollouts/validation.jsonl", "rollouts/validation_native.jsonl"):
        assert assert_rewarded_rows(tmp_path / path)["instance_id"] == first_validation_task
    agent_health, native_health = re.findall(r"Rollout health: [^\n]*", done.stdout)
    assert agent_health.startswith("Rollout health: 1 checked, 1 healthy, 0 unhealthy, 0 unobserved"), agent_health
    assert native_health.startswith("Rollout health: 1 checked, 0 healthy, 0 unhealthy, 1 unobserved"), native_health


def test_gym_venvs_reads_gyms_marker_and_names_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from nemo_polar.cli import main as polar

    assert venvs.gym_builds_its_venvs("3.13.14") and not venvs.gym_builds_its_venvs("3.11.7")
    assert venvs.gym_overrides(tmp_path, cwd=tmp_path) == ["++skip_venv_if_present=true"]
    assert venvs.gym_overrides(tmp_path / "v", cwd=tmp_path)[1] == f"++uv_venv_dir={(tmp_path / 'v').resolve()}"
    assert venvs.servers("polar_codex") == [
        ("responses_api_agents", "polar_agent"),
        ("environment_servers", "legacy_agent"),
        ("environment_servers", "polar_env"),
    ]
    with pytest.raises(SystemExit, match="polar gym-venvs: unknown environment 'polar_nope'") as exc:
        polar(["gym-venvs", "--environment", "polar_nope", "--venv-dir", str(tmp_path)])
    assert "Traceback" not in str(exc.value) and not any(tmp_path.iterdir())
