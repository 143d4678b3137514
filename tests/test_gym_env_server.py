"""Each Polar env as a native NeMo Gym environment server (nemo-gym 0.7.0 ``BaseEnvironmentServer``: Gym's own
``run_request`` with its episode limits, rollout context and cleanup context) and, as before, as an agent behind
Gym's own ``legacy_agent`` relay: the same row gets the same verdict through both. Verdicts with no trustworthy
outcome come back as Gym episode failures (retryable or terminal, with Gym's failure kinds and stages); a deadline
stops the episode's session through the cleanup context."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any
from unittest.mock import MagicMock

import httpx
import pytest

pytest.importorskip("nemo_gym", reason="nemo-gym is not installed (make gym)")

from fastapi.testclient import TestClient
from nemo_gym.episode_types import EpisodeFailure
from nemo_gym.server_utils import ServerClient

from nemo_polar.env.gym import ENVIRONMENTS, agent_name, gym_root
from nemo_polar.env.gym.environment_server import (
    EPISODE_FAILURES,
    PolarEnvironmentServer,
    PolarEnvironmentServerConfig,
    PolarEpisodeRequest,
    episode_failure,
)
from nemo_polar.env.gym.rows import example_row
from nemo_polar.env.runtime.episode import Episode
from nemo_polar.env.runtime.verdict import Verdict
from nemo_polar.rewards.instance import bundled_instances
from tests.conftest import ProxyHandle
from tests.helpers.gym import episode_request, make_agent

INSTANCE = next(i for i in bundled_instances() if i.instance_id == "polar__textstats-1")
NATIVE = "polar_pi_native"


def make_server(env: str = "polar_pi", **config: Any) -> PolarEnvironmentServer:
    cfg = PolarEnvironmentServerConfig(
        host="127.0.0.1", port=0, entrypoint="app.py", name=f"{env}_native", env=env, **config
    )
    return PolarEnvironmentServer(config=cfg, server_client=MagicMock(spec=ServerClient))


def proxy_config(proxy: ProxyHandle, tmp_path: Path) -> dict[str, Any]:
    return {
        "proxy_url": proxy.url,
        "proxy_admin_url": proxy.admin_url,
        "proxy_admin_token": proxy.admin_token,
        "work_dir": tmp_path,
        "scripted": True,
        "timeout": 300,
    }


class AgentAtASGI:
    """Gym's ``ServerClient.post`` for the relay, delivered to the agent's app in process (test transport)."""

    def __init__(self, app: Any) -> None:
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://agent", timeout=600)

    async def post(self, server_name: str, url_path: str, **kw: Any) -> Any:
        resp = await self.client.post(url_path, content=kw.get("data"), headers=kw.get("headers"))

        class Reply:
            status = resp.status_code
            headers = resp.headers

            @staticmethod
            async def read() -> bytes:
                return resp.content

        return Reply()


# -- configs, through Gym's own parser ---------------------------------------------------------------------------
@pytest.mark.parametrize("env", ENVIRONMENTS)
def test_gym_parses_each_native_environment_server(env: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from nemo_gym.global_config import GlobalConfigDictParser, get_first_server_config_dict
    from omegaconf import DictConfig, OmegaConf

    monkeypatch.setenv("NEMO_GYM_EXTRA_ROOTS", str(gym_root()))
    initial = {
        "config_paths": [str(gym_root() / "environments" / env / "config.yaml")],
        "policy_api_key": "x",
        "policy_base_url": "http://127.0.0.1:8000/v1",
        "policy_model_name": "tiny-qwen3",
        "error_on_agent_without_environment_server": True,
    }
    parsed = GlobalConfigDictParser().parse_no_environment(initial_global_config_dict=DictConfig(initial))
    names = {i.name for i in GlobalConfigDictParser().filter_for_server_instance_configs(parsed)}
    assert names == {agent_name(env), f"{env}_environment_server", f"{env}_native"}
    server = OmegaConf.to_container(get_first_server_config_dict(parsed, f"{env}_native"), resolve=True)
    cfg = PolarEnvironmentServerConfig.model_validate({**server, "host": "127.0.0.1", "port": 0, "name": "x"})
    assert (cfg.env, cfg.engine_urls(), cfg.max_concurrent_episodes) == (env, ["http://127.0.0.1:8000"], 8)
    from nemo_gym.cli.env import _resolve_server_dir

    server_dir = _resolve_server_dir(Path("environment_servers/polar_env"))  # as `gym env start` resolves it
    assert server_dir == gym_root() / "environment_servers" / "polar_env" and (server_dir / "app.py").is_file()


@pytest.mark.parametrize("env", ENVIRONMENTS)
def test_the_native_variant_routes_each_split_task_to_the_native_server(
    env: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--environment <env>/scripted --environment <env>/native`` as Gym composes them: the train and validation
    datasets become tasks of the taskset ``<env>`` (Gym's own materialize_task), Gym's resolve_dataset_agent routes
    them to the native server for the agent that declares them, and both servers take the scripted policy. Without
    the native variant, the agent's rows reach one environment server only (Gym's relay)."""
    from nemo_gym.global_config import GlobalConfigDictParser, get_first_server_config_dict, resolve_dataset_agent
    from nemo_gym.rollout_collection import (
        _environment_server_for_agent,
        _environment_servers_by_agent,
        _episode_request_body,
    )
    from nemo_gym.task_materialization import materialize_task
    from omegaconf import DictConfig, OmegaConf

    monkeypatch.setenv("NEMO_GYM_EXTRA_ROOTS", str(gym_root()))
    variants = [str(gym_root() / "environments" / env / f"{v}.yaml") for v in ("scripted", "native")]
    policy = {"policy_api_key": "x", "policy_base_url": "http://127.0.0.1:8000/v1", "policy_model_name": "m"}

    def parse(paths: list[str]) -> DictConfig:
        initial = DictConfig({"config_paths": paths, **policy})
        return GlobalConfigDictParser().parse_no_environment(initial_global_config_dict=initial)

    plain = parse([str(gym_root() / "environments" / env / "config.yaml")])
    assert _environment_server_for_agent(agent_name(env), _environment_servers_by_agent(plain)) == (
        f"{env}_environment_server"
    )
    parsed = parse(variants)
    assert OmegaConf.to_container(parsed.environment_server_routes) == {env: f"{env}_native"}
    agent = OmegaConf.to_container(get_first_server_config_dict(parsed, agent_name(env)), resolve=True)
    native = OmegaConf.to_container(get_first_server_config_dict(parsed, f"{env}_native"), resolve=True)
    cfg = PolarEnvironmentServerConfig.model_validate({**native, "host": "127.0.0.1", "port": 0, "name": "x"})
    assert cfg.scripted and agent["scripted"] and cfg.agent_server and cfg.agent_server.name == agent_name(env)
    splits = {d["type"]: d for d in agent["datasets"]}
    assert set(splits) == {"train", "validation", "example"}
    for split in ("train", "validation"):
        assert splits[split]["taskset"] == env and splits[split]["license"]
        assert resolve_dataset_agent(parsed, agent_name(env), taskset=env) == agent_name(env)
        rows = [json.loads(line) for line in (gym_root() / splits[split]["jsonl_fpath"]).read_text().splitlines()]
        tasks = [materialize_task(row, taskset=env) for row in rows]
        assert [t["task_id"] for t in tasks] == [{"taskset": env, "task_id": r["instance_id"]} for r in rows]
        for task in tasks:  # what Gym's collection posts to the native server, which takes it
            body = _episode_request_body({**task, "_ng_rollout_id": "r1", "_ng_attempt_index": 0})
            task_input = PolarEpisodeRequest.model_validate(body).task.task_input
            assert task_input.model_dump()["instance_id"] == task["task_id"]["task_id"]


def test_verdicts_map_to_gyms_episode_failures() -> None:
    """Every failure Gym's own model accepts (its failure-kind vocabulary, its stages); machinery retryable, a
    harness failure terminal; verdicts whose reward stands are results, not failures."""
    for kind, (terminal, stage) in EPISODE_FAILURES.items():
        failure = episode_failure(Verdict(kind=kind, reason="why"))
        assert isinstance(failure, EpisodeFailure) and (failure.terminal, failure.stage) == (terminal, stage)
        assert failure.failure_reason == f"{kind}: why"
    assert not episode_failure(Verdict(kind="timeout")).terminal  # type: ignore[union-attr]
    assert episode_failure(Verdict(kind="harness_error")).terminal  # type: ignore[union-attr]
    for kind in ("trainable", "no_main_chain", "main_chain_broken", "cross_version", "reconstruction_failed"):
        assert episode_failure(Verdict(kind=kind, reward=1.0)) is None  # type: ignore[arg-type]


def test_failures_through_gyms_run_request(tmp_path: Path) -> None:
    """An episode that raises: a retryable failure at the agent stage; a harness error: terminal; a bad row:
    terminal at seed. Each answered in Gym's episode response, its identity echoed."""
    server = make_server(proxy_url="http://127.0.0.1:1", proxy_admin_url="http://127.0.0.1:2", work_dir=tmp_path,
                         staging="direct", runtime="local")  # fmt: skip
    verdicts = iter(["raise", "harness_error"])

    def runner(*args: Any, **kw: Any) -> Episode:
        if next(verdicts) == "raise":
            raise RuntimeError("sandbox runtime unavailable")
        return Episode.failed("harness_error", "the CLI exited 2")

    server.episodes.episode_runner = runner
    row = example_row(INSTANCE, "polar_pi_native", "anyswe")
    with TestClient(server.setup_webserver()) as client:
        raised = client.post("/run", json=episode_request(row, "r1")).json()
        harness = client.post("/run", json=episode_request(row, "r2", attempt=1)).json()
        bad = client.post("/run", json=episode_request({**row, "polar_env": "polar_nope"}, "r3")).json()
    assert raised["episode_id"] == {"rollout_id": "r1", "attempt": 0} and raised["result"] is None
    assert raised["failure"] == {
        "failure_reason": "run_failed: RuntimeError: sandbox runtime unavailable",
        "terminal": False,
        "failure_kind": "polar:run_failed",
        "stage": "agent",
    }
    assert harness["episode_id"]["attempt"] == 1
    assert harness["failure"] == {"failure_reason": "harness_error: the CLI exited 2", "terminal": True,
                                  "failure_kind": "agent_run_error", "stage": "agent"}  # fmt: skip
    assert bad["failure"]["terminal"] and bad["failure"]["stage"] == "seed"
    assert "unknown Polar env 'polar_nope'" in bad["failure"]["failure_reason"]


@pytest.mark.engine
def test_the_native_server_and_the_relayed_agent_give_the_same_verdict(proxy: ProxyHandle, tmp_path: Path) -> None:
    """One Gym anyswe row of a bundled task: through Gym's legacy_agent relay to the agent, and as a materialized
    task through the native server, routed, posted and recorded by Gym's rollout-collection functions. Both resolve
    it, with the same trainable verdict and main-chain shape."""
    from environment_servers.legacy_agent.app import LegacyAgentEnvironmentServer, LegacyAgentEnvironmentServerConfig

    row = example_row(INSTANCE, agent_name("polar_pi"), "anyswe")
    agent = make_agent("polar_pi", **proxy_config(proxy, tmp_path / "agent"))
    relay_client = MagicMock(spec=ServerClient)
    relay_config = LegacyAgentEnvironmentServerConfig(
        host="127.0.0.1",
        port=0,
        entrypoint="app.py",
        name="polar_pi_environment_server",
        agent_server={"type": "responses_api_agents", "name": agent_name("polar_pi")},
    )
    relay = LegacyAgentEnvironmentServer(config=relay_config, server_client=relay_client)
    relay_client.post = AgentAtASGI(agent.setup_webserver()).post
    try:
        relayed = TestClient(relay.setup_webserver()).post("/run", json=row)
    finally:
        agent.close()
    assert relayed.status_code == 200, relayed.text
    via_relay = relayed.json()

    # The materialized task as Gym's rollout collection routes, posts and records it (its own functions).
    from nemo_gym.rollout_collection import (
        RolloutCollectionConfig,
        _environment_server_for_config_row,
        _episode_record,
        _episode_request_body,
        _is_episode_response,
    )

    task = {"task_id": {"taskset": "polar_pi", "task_id": INSTANCE.instance_id}, "task_input": row}
    task |= {"_ng_task_index": 3, "_ng_rollout_index": 1}
    collection = RolloutCollectionConfig(
        input_jsonl_fpath="in.jsonl", output_jsonl_fpath="out.jsonl", environment_server_routes={"polar_pi": NATIVE}
    )
    assert _environment_server_for_config_row(task, collection) == NATIVE
    body = _episode_request_body(task)
    server = make_server(**proxy_config(proxy, tmp_path / "native"))
    with TestClient(server.setup_webserver()) as client:
        native = client.post("/run", json=body).json()
    assert _is_episode_response(native) and native["episode_id"] == body["episode_id"], native
    assert native["failure"] is None
    result = native["result"]
    record = _episode_record(native)  # what the collector stores: the result, scored by its top-level reward
    assert record["reward"] == 1.0 and record["_ng_task_id"] == task["task_id"]
    for got in (via_relay, result):
        assert (got["reward"], got["mask_sample"], got["grade_status"]) == (1.0, False, "resolved"), got
        assert got["instance_id"] == INSTANCE.instance_id and got["main_segments"] == 1
    assert result["calls"] == via_relay["calls"] and len(result["response"]["output"]) == result["calls"]


@pytest.mark.engine
def test_a_deadline_stops_the_session_through_the_cleanup_context(proxy: ProxyHandle, tmp_path: Path) -> None:
    """Gym's episode deadline ends the wait with a retryable "Episode timed out"; the cleanup the server registered
    stops the session itself (its CLI killed in the gateway's RUN stage), which finishes as cancelled."""
    slow = [{"kind": "shell", "command": "sleep 120"}, {"kind": "final", "text": "done"}]
    row = {**example_row(INSTANCE, "polar_pi_native"), "script": slow}
    server = make_server(**proxy_config(proxy, tmp_path), default_episode_timeout_seconds=8)
    t0 = time.monotonic()
    with TestClient(server.setup_webserver()) as client:
        timed_out = client.post("/run", json=episode_request(row, "slow-1")).json()
        outcomes = list(tmp_path.glob("*/outcome.json"))
        deadline = time.monotonic() + 60
        while not outcomes and time.monotonic() < deadline:
            time.sleep(0.2)
            outcomes = list(tmp_path.glob("*/outcome.json"))
    assert timed_out["failure"] == {"failure_reason": "Episode timed out", "terminal": False}
    [outcome] = [json.loads(p.read_text()) for p in outcomes]
    assert outcome["status"] == "cancelled" and outcome["mask_sample"]
    assert time.monotonic() - t0 < 100  # stopped, not waited out (the command sleeps 120 s)
