"""nemo_polar installed for real: non-editable from a wheel, and into the venv NeMo Gym builds for the Polar agent.

Gym builds every server's venv itself; ``nemo_gym/cli/setup_command.py::setup_env_command`` (NeMo-RL's Gym, commit
c3bac963, package 0.5.1, and nemo-gym 0.7.0 alike) takes its non-editable branch for our root, which has no
``../../pyproject.toml``: ``uv venv --python <the parent's Python>``, then ``(echo 'nemo-gym==<the parent's version>'
&& grep -v -F '../..' requirements.txt) | uv pip install -r /dev/stdin <head_server_deps>``. The tests here run that
function unchanged on the shipped root, from the installed nemo-gym (0.7.0) and from a venv holding NeMo-RL's
(nemo-gym 0.5.1, NeMo-RL's ray and openai), and serve the agent from the venv it builds as each version launches it.

Python: nemo-gym (and NeMo-RL) require Python >= 3.13.14, this machine has 3.11, and uv will not even resolve
nemo-gym for 3.11. ``tests/gym_uv_shim.py`` goes first on PATH as ``uv``, as a cluster node's own uv would be: it
resolves Gym's ``uv pip install`` with ``--python-version 3.13.14`` (a 3.13.14 node's resolution), then swaps the
compiled wheels that resolution picked for builds this Python loads. Everything else is Gym's own commands.

Marked ``gym_venv``: needs ``uv`` (``make setup``) and PyPI on the first run; uv's cache is ``$POLAR_CACHE/uv``, so
later runs download nothing. The non-editable install test needs setuptools from the index once (pip's build
isolation, cached by pip) and takes nemo_polar's dependencies from the project venv.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from nemo_polar.engine.launcher import free_port
from nemo_polar.env.gym import agent_name, gym_root
from nemo_polar.env.gym.wheel import build_wheel, checkout_version, requirement
from nemo_polar.paths import cache_dir, source_dir
from tests.helpers.clients import loopback
from tests.helpers.lanes import FULL

ROOT = Path(__file__).resolve().parents[1]
AGENT = "polar_pi_agent"
INSTANCE = "polar__textstats-1"  # solved by its script in every harness (tests/test_gym.py)
# What a fresh clone has, without local state: what `pip install .` sees on a cluster.
CLONE_SKIP = shutil.ignore_patterns(
    ".git", ".venv*", "build", "dist", "runs", "records", "cache", "*.egg-info", "__pycache__", ".*_cache"
)


def real_uv() -> str | None:
    return shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")


def tail(path: Path, n: int = 60) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:]) if path.exists() else ""


# -- the requirements line Gym keeps --------------------------------------------------------------------------------
def test_the_agent_requirements_survive_gyms_filter_and_pin_nemo_polar() -> None:
    """No `nemo-gym` pin (Gym adds its parent's own), no line Gym's `../..` filter would drop, and nemo_polar by name
    at exactly the checkout's version."""
    src = source_dir()
    assert src is not None
    lines = [
        line.strip()
        for line in (gym_root() / "responses_api_agents" / "polar_agent" / "requirements.txt").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert lines == [requirement(checkout_version(src))]
    assert not any("../.." in line or line.lower().startswith(("nemo-gym", "nemo_gym")) for line in lines)


# -- item: a non-editable install ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def installed_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`pip install .` of a clean copy of the checkout into a fresh venv. Its dependencies come from the project venv
    (a .pth line, like --system-site-packages), so none is downloaded; nemo_polar itself is only the wheel's."""
    tmp = tmp_path_factory.mktemp("installed")
    clone = tmp / "clone"
    shutil.copytree(ROOT, clone, symlinks=True, ignore=CLONE_SKIP)
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    site = next(venv.glob("lib/python3*/site-packages"))
    # A plain path line: the project venv's own .pth files (the editable install's finder) are not processed.
    (site / "project_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-deps", "."]
    subprocess.run(pip, cwd=clone, check=True)
    shutil.rmtree(clone)  # nothing may read the sources any more
    return venv


def polar(venv: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(venv / "bin" / "polar"), *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_a_non_editable_install_reads_configs_and_tasks_from_package_data(installed_venv: Path, tmp_path: Path) -> None:
    site = next(installed_venv.glob("lib/python3*/site-packages"))
    py = [str(installed_venv / "bin" / "python"), "-c"]
    where = subprocess.run(
        [*py, "import nemo_polar.paths as p; print(p.__file__, p.conf_dir(), p.bundled_tasks_dir(), p.source_dir())"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert where == [
        str(site / "nemo_polar" / "paths.py"),
        *(str(site / "nemo_polar" / "data" / d) for d in ("conf", "swe_tasks")),
        "None",
    ]

    assert polar(installed_venv, "--help", cwd=tmp_path).returncode == 0

    out = polar(installed_venv, "gym-root", cwd=tmp_path)
    root = Path(out.stdout.strip())
    assert out.returncode == 0 and root == site / "nemo_polar" / "env" / "gym" / "root"
    assert (root / "environments" / "polar_pi" / "config.yaml").is_file()
    assert (root / "responses_api_agents" / "polar_agent" / "requirements.txt").is_file()
    wheel = polar(installed_venv, "gym-root", "--wheel", cwd=tmp_path)  # no checkout to build from: says what to do
    assert wheel.returncode != 0 and "UV_FIND_LINKS" in wheel.stderr

    cfg = polar(installed_venv, "rollout", "--cfg", "env=polar_codex", "dataset=bundled", cwd=tmp_path)
    assert cfg.returncode == 0, cfg.stderr
    assert "harness: codex" in cfg.stdout and "name: bundled" in cfg.stdout

    ids = ["polar__csvlite-1", INSTANCE]
    tasks = site / "nemo_polar" / "data" / "swe_tasks" / "tasks"
    preds = tmp_path / "preds.jsonl"
    preds.write_text(
        "".join(
            json.dumps({"instance_id": i, "model_patch": (tasks / i / "gold.patch").read_text()}) + "\n" for i in ids
        )
    )
    graded = polar(
        installed_venv,
        "grade",
        "--instances",
        "bundled",
        "--predictions",
        str(preds),
        "-o",
        "report.json",
        cwd=tmp_path,
    )
    assert graded.returncode == 0, graded.stderr
    assert json.loads(graded.stdout)["resolved"] == len(ids)


# -- item: the agent's venv, built by Gym ----------------------------------------------------------------------------
@pytest.fixture
def gym_uv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """PATH and find-links as on a cluster node: `uv` (the shim), and nemo_polar's wheel where uv finds it."""
    uv = real_uv()
    if uv is None:
        pytest.skip("uv is not installed (make setup)")
    shim = tmp_path / "bin" / "uv"
    shim.parent.mkdir()
    shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} {ROOT / "tests" / "gym_uv_shim.py"} "$@"\n')
    shim.chmod(0o755)
    monkeypatch.setenv("PATH", f"{shim.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("POLAR_SHIM_REAL_UV", uv)
    # What a user runs: UV_FIND_LINKS=$(polar gym-root --wheel). NeMo-RL hands its environment to Gym's actor, and
    # Gym's run_command copies it into every server's setup.
    monkeypatch.setenv("UV_FIND_LINKS", str(build_wheel(tmp_path / "dist").parent))
    monkeypatch.setenv("NEMO_GYM_EXTRA_ROOTS", str(gym_root()))
    return shim


def stop_tree(proc: subprocess.Popen[Any]) -> None:
    """Gym's server process is a bash running setup && python app.py: stop the whole tree it started."""
    try:
        procs = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        p.terminate()
    _, alive = psutil.wait_procs(procs, timeout=30)
    for p in alive:
        p.kill()


@pytest.fixture
def launched() -> Iterator[list[subprocess.Popen[Any]]]:
    procs: list[subprocess.Popen[Any]] = []
    yield procs
    for proc in procs:
        stop_tree(proc)


def gym_initial_config(engine_url: str, port: int, tmp_path: Path) -> dict[str, Any]:
    """What NeMo-RL hands Gym (`env.nemo_gym` plus the policy), with the agent on a known port and scripted."""
    agent = {"host": "127.0.0.1", "port": port, "scripted": True, "runtime": "bwrap", "timeout": 300}
    return {
        "config_paths": [str(gym_root() / "environments" / "polar_pi" / "config.yaml")],
        "policy_base_url": f"{engine_url}/v1",
        "policy_model_name": "tiny-qwen3",
        "policy_api_key": "x",
        "head_server": {"host": "127.0.0.1", "port": free_port()},
        "uv_cache_dir": str(cache_dir() / "uv"),  # PyPI once; every later build is a cache hit
        "uv_venv_dir": str(tmp_path / "venvs"),
        AGENT: {"responses_api_agents": {"polar_agent": {**agent, "work_dir": str(tmp_path / "sessions")}}},
    }


def wait_up(proc: subprocess.Popen[Any], port: int, log: Path) -> str:
    """The URL of the server Gym launched, once it answers (its venv is built first)."""
    url, started = f"http://127.0.0.1:{port}", time.monotonic()
    while True:
        assert proc.poll() is None, f"the server exited:\n{tail(log)}"
        assert time.monotonic() - started < 1500, f"the server did not come up:\n{tail(log)}"
        try:  # Gym's own readiness check (ServerClient.poll_for_status): any HTTP answer at the server's URL
            loopback.get(url, timeout=5)
            print(f"venv built and server up in {time.monotonic() - started:.0f}s")
            return url
        except httpx.HTTPError:
            time.sleep(1)


def gym_launch(
    initial: dict[str, Any], server: str, instance: str, log: Any
) -> tuple[subprocess.Popen[Any], Path, str]:
    """A server as the installed nemo-gym (0.7.0) launches it: its config parsed from ``initial``, the server's
    directory resolved as `gym env start` resolves it, its venv set up by Gym's setup_env_command, then its
    entrypoint run as RunHelper._start builds the launch (nemo_gym/cli/env.py, _server_launch_command): the setup,
    then the venv's own interpreter on app.py, with the merged config and the instance name in the environment
    (run_command's extra_env). Returns the process, the venv and the setup command."""
    from nemo_gym.cli.env import _resolve_server_dir
    from nemo_gym.cli.setup_command import get_venv_path, run_command, setup_env_command
    from nemo_gym.global_config import GlobalConfigDictParser
    from omegaconf import DictConfig, OmegaConf

    config = GlobalConfigDictParser().parse_no_environment(initial_global_config_dict=DictConfig(initial))
    server_dir = _resolve_server_dir(Path(server))
    assert server_dir == gym_root() / server
    setup = setup_env_command(server_dir, config, instance)
    venv = get_venv_path(server_dir, config)
    command = f"{setup} \\\n    && {shlex.quote(str(venv / 'bin' / 'python'))} app.py"
    env = {"NEMO_GYM_CONFIG_DICT": OmegaConf.to_yaml(config), "NEMO_GYM_CONFIG_PATH": instance}
    proc = run_command(
        command, server_dir, instance, global_config_dict=config, extra_env=env, stdout_target=log, stderr_target=log
    )
    return proc, venv, setup


def serve_and_run(proc: subprocess.Popen[Any], port: int, venv: Path, log: Path, gym_version: str) -> dict[str, Any]:
    """Wait for the agent Gym launched (its venv is built first), check what it runs on, `/run` one bundled row."""
    url = wait_up(proc, port, log)

    # Gym's venv: nemo_polar is the wheel's, nemo-gym the version Gym pinned (probed with the server's interpreter,
    # working directory and PYTHONPATH, as Gym's run_command sets them).
    agent_dir = gym_root() / "responses_api_agents" / "polar_agent"
    probe = "import nemo_gym, nemo_polar; print(nemo_gym.__version__, nemo_polar.__file__)"
    found = subprocess.run(
        [str(venv / "bin" / "python"), "-c", probe],
        cwd=agent_dir,
        env={**os.environ, "PYTHONPATH": str(agent_dir)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert found[0] == gym_version and Path(found[1]).is_relative_to(venv), found

    rows = (gym_root() / "environments" / "polar_pi" / "data" / "example.jsonl").read_text().splitlines()
    row = next(r for r in map(json.loads, rows) if r["instance_id"] == INSTANCE)
    assert row["agent_ref"]["name"] == agent_name("polar_pi")
    started = time.monotonic()
    resp = loopback.post(f"{url}/run", json=row, timeout=600)
    print(f"/run in {time.monotonic() - started:.0f}s")
    assert resp.status_code == 200, f"{resp.text}\n{tail(log)}"
    result = resp.json()
    # Rewarded and not flagged, wherever this Gym carries the flag: nemo-gym 0.7.0's BaseVerifyResponse has
    # `mask_sample`; 0.5.1's has no such field (pydantic drops it), and NeMo-RL 7ea279ab reads
    # `instance_config.mask_sample` (nemo_rl/experience/rollouts.py, _extract_mask_sample_flags).
    assert result["reward"] == 1.0, result
    assert not result.get("mask_sample") and not (result.get("instance_config") or {}).get("mask_sample"), result
    assert result["response"]["output"] and all("generation_token_ids" in o for o in result["response"]["output"])
    return result


@pytest.mark.engine
@pytest.mark.gym_venv
@pytest.mark.timeout(1800)
def test_gym_builds_the_agent_venv_from_the_shipped_root_and_it_solves_a_task(
    engine_url: str, gym_uv: Path, tmp_path: Path, launched: list[subprocess.Popen[Any]]
) -> None:
    """The installed nemo-gym (0.7.0): its own setup_env_command, run_command and launch."""
    nemo_gym = pytest.importorskip("nemo_gym", reason="nemo-gym is not installed (make gym)")

    port = free_port()
    log_path = tmp_path / "agent.log"
    with log_path.open("w") as log:
        proc, venv, setup = gym_launch(
            gym_initial_config(engine_url, port, tmp_path), "responses_api_agents/polar_agent", AGENT, log
        )
        launched.append(proc)
        # Gym's non-editable branch: its own nemo-gym, our requirements.txt through its `../..` filter.
        assert f"nemo-gym=={nemo_gym.__version__}" in setup and "grep -v -F" in setup and "requirements.txt" in setup
        serve_and_run(launched[0], port, venv, log_path, nemo_gym.__version__)


NATIVE = "polar_pi_native"


# make test-full: the same requirements as the agent's venv above (make test), served by the native server
@FULL
@pytest.mark.engine
@pytest.mark.gym_venv
@pytest.mark.timeout(1800)
def test_gym_builds_the_native_environment_servers_venv_and_it_runs_an_episode(
    engine_url: str, gym_uv: Path, tmp_path: Path, launched: list[subprocess.Popen[Any]]
) -> None:
    """The native environment server (``environment_servers/polar_env``) as the installed nemo-gym (0.7.0) builds
    and launches it from the shipped root: its own venv, then ``/run`` of one materialized task (an anyswe row of a
    bundled task, routed by taskset) as Gym's rollout collection posts it; the episode resolves the task."""
    nemo_gym = pytest.importorskip("nemo_gym", reason="nemo-gym is not installed (make gym)")
    from nemo_polar.env.gym.rows import example_row
    from nemo_polar.rewards import bundled_instances
    from tests.helpers.gym import episode_request

    port = free_port()
    initial = gym_initial_config(engine_url, port, tmp_path)
    native = {"host": "127.0.0.1", "port": port, "scripted": True, "runtime": "bwrap", "timeout": 300}
    initial[AGENT]["responses_api_agents"]["polar_agent"]["port"] = free_port()
    initial[NATIVE] = {"environment_servers": {"polar_env": {**native, "work_dir": str(tmp_path / "sessions")}}}
    log_path = tmp_path / "native.log"
    with log_path.open("w") as log:
        proc, _, setup = gym_launch(initial, "environment_servers/polar_env", NATIVE, log)
        launched.append(proc)
        assert f"nemo-gym=={nemo_gym.__version__}" in setup and "requirements.txt" in setup
        url = wait_up(proc, port, log_path)
        inst = next(i for i in bundled_instances() if i.instance_id == INSTANCE)
        body = episode_request(example_row(inst, NATIVE, "anyswe"), "r-7")  # as Gym's rollout collection posts it
        resp = loopback.post(f"{url}/run", json=body, timeout=600)
    assert resp.status_code == 200, f"{resp.text}\n{tail(log_path)}"
    episode = resp.json()
    assert episode["failure"] is None and episode["episode_id"] == {"rollout_id": "r-7", "attempt": 0}, episode
    result = episode["result"]
    assert (result["reward"], result["mask_sample"], result["grade_status"]) == (1.0, False, "resolved"), result
    assert result["response"]["output"] and all("generation_token_ids" in o for o in result["response"]["output"])


# NeMo-RL main 7ea279ab: Gym is the submodule 3rdparty/Gym-workspace/Gym at c3bac963 (package 0.5.1, a uv workspace
# member, so Gym pins `nemo-gym==0.5.1` from PyPI into server venvs), and its uv.lock has ray 2.56.1 and openai 2.6.1,
# which Gym pins into them too (head_server_deps).
NEMO_RL_GYM = ("nemo-gym==0.5.1", "ray[default]==2.56.1", "openai==2.6.1")
# In NeMo-RL's Gym: the config Gym parses and the command setup_env_command gives, printed as JSON.
NEMO_RL_SETUP = """
import json, sys
from pathlib import Path
from omegaconf import DictConfig, OmegaConf
from nemo_gym.cli.env import _resolve_server_dir
from nemo_gym.cli.setup_command import setup_env_command
from nemo_gym.global_config import GlobalConfigDictParser
config = GlobalConfigDictParser().parse_no_environment(initial_global_config_dict=DictConfig(json.loads(sys.argv[1])))
agent_dir = _resolve_server_dir(Path("responses_api_agents/polar_agent"))
setup = setup_env_command(agent_dir, config, sys.argv[2])
print(json.dumps({"agent_dir": str(agent_dir), "setup": setup, "config": OmegaConf.to_yaml(config)}))
"""


# make test-full: Gym's build on NeMo-RL's pinned nemo-gym; make test builds with the installed one (above)
@FULL
@pytest.mark.engine
@pytest.mark.gym_venv
@pytest.mark.timeout(1800)
def test_nemo_rls_gym_builds_the_agent_venv_and_it_solves_a_task(
    engine_url: str, gym_uv: Path, tmp_path: Path, launched: list[subprocess.Popen[Any]]
) -> None:
    """NeMo-RL's Gym: nemo-gym 0.5.1 with NeMo-RL's ray and openai is the parent. PyPI's 0.5.1 has c3bac963's
    setup_env_command (c3bac963 only moves the venv path into get_venv_path); the launch is c3bac963's
    RunHelper.start (nemo_gym/cli/env.py): `NEMO_GYM_CONFIG_DICT=<yaml> NEMO_GYM_CONFIG_PATH=<name> python app.py`
    after the setup, in bash with the server dir on PYTHONPATH and UV_CACHE_DIR from the config (run_command)."""
    parent = tmp_path / "nemo-rl-gym"
    uv_env = {**os.environ, "UV_CACHE_DIR": str(cache_dir() / "uv"), "VIRTUAL_ENV": str(parent)}
    subprocess.run([str(gym_uv), "venv", "--quiet", "--python", sys.executable, str(parent)], env=uv_env, check=True)
    subprocess.run([str(gym_uv), "pip", "install", "--quiet", *NEMO_RL_GYM], env=uv_env, check=True)

    port = free_port()
    initial = json.dumps(gym_initial_config(engine_url, port, tmp_path))
    out = subprocess.run(
        [str(parent / "bin" / "python"), "-c", NEMO_RL_SETUP, initial, AGENT], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    gym = json.loads(out.stdout.splitlines()[-1])
    agent_dir = Path(gym["agent_dir"])
    assert agent_dir == gym_root() / "responses_api_agents" / "polar_agent"
    assert "nemo-gym==0.5.1" in gym["setup"] and "ray[default]==2.56.1 openai==2.6.1" in gym["setup"]

    command = (
        f"{gym['setup']} \\\n    && NEMO_GYM_CONFIG_DICT={shlex.quote(gym['config'])} \\\n"
        f"    NEMO_GYM_CONFIG_PATH={shlex.quote(AGENT)} \\\n    python app.py"
    )
    env = {**os.environ, "PYTHONPATH": str(agent_dir), "UV_CACHE_DIR": str(cache_dir() / "uv")}
    log_path = tmp_path / "agent.log"
    with log_path.open("w") as log:
        launched.append(subprocess.Popen(command, shell=True, executable="/bin/bash", env=env, stdout=log, stderr=log))
        venv = tmp_path / "venvs" / "responses_api_agents" / "polar_agent" / ".venv"  # uv_venv_dir/<type>/<name>
        serve_and_run(launched[0], port, venv, log_path, "0.5.1")
