"""The NeMo Gym environment on the real nemo-gym 0.7.0: Gym's own discovery finds the shipped environments, its
config parser accepts them, and ``/run`` of the Polar agent (Gym's server class, Gym's pydantic types, FastAPI
``TestClient`` as in Gym's server tests) runs a real CLI episode whose result passes NeMo-RL's post-processing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("nemo_gym", reason="nemo-gym is not installed (make gym)")

from fastapi.testclient import TestClient
from nemo_gym.base_resources_server import BaseRunRequest, BaseVerifyResponse
from nemo_gym.openai_utils import NeMoGymResponseOutputMessageForTraining

from nemo_polar.env.gym import ENVIRONMENTS, VARIANTS, agent_name, gym_root
from nemo_polar.env.gym.agent import PolarAgentConfig
from nemo_polar.env.gym.nemo_rl import nemo_rl_sample
from nemo_polar.env.gym.rows import (
    SHAPES,
    SPLITS,
    Shape,
    example_row,
    example_rows,
    example_tasks,
    instance_from_row,
    split_rows,
)
from nemo_polar.env.runtime.episode import Episode
from nemo_polar.env.runtime.verdict import Verdict
from nemo_polar.rewards.instance import bundled_instances
from tests.conftest import ProxyHandle, free_port, make_proxy
from tests.helpers.clients import loopback
from tests.helpers.demo import DIALECT_ENVS
from tests.helpers.gym import make_agent
from tests.helpers.lanes import lane

UNREACHABLE_ENGINE = "http://127.0.0.1:9/v1"  # discard port: nothing listens


@pytest.fixture
def agent_client(tmp_path: Path) -> Iterator[TestClient]:
    agent = make_agent(openai_base_url=UNREACHABLE_ENGINE, work_dir=tmp_path, scripted=True)
    yield TestClient(agent.setup_webserver())
    agent.close()


def row_for(env: str, instance_id: str, shape: Shape = "polar") -> dict[str, Any]:
    [inst] = [i for i in bundled_instances() if i.instance_id == instance_id]
    return example_row(inst, agent_name(env), shape)


def test_the_restated_nemo_rl_check_rejects_what_nemo_rl_rejects() -> None:
    def item(prompt: list[int], gen: list[int]) -> dict[str, Any]:
        return {"prompt_token_ids": prompt, "generation_token_ids": gen, "generation_log_probs": [0.0] * len(gen)}

    ok = {"reward": 1.0, "response": {"output": [item([1, 2], [3]), {"type": "x"}, item([1, 2, 3, 4], [5])]}}
    assert [m["token_ids"] for m in nemo_rl_sample(ok)["message_log"]] == [[1, 2], [3], [4], [5]]
    with pytest.raises(AssertionError, match="Non-contiguous"):
        nemo_rl_sample({"reward": 1.0, "response": {"output": [item([1, 2], [3]), item([1, 9, 3], [5])]}})
    with pytest.raises(ValueError, match="no generation data"):
        nemo_rl_sample({"reward": 0.0, "mask_sample": True, "response": {"output": [item([1], [])]}})
    with pytest.raises(AssertionError):
        nemo_rl_sample({**ok, "reward_components": {"a": 0.5, "b": 0.25}})
    assert nemo_rl_sample({**ok, "mask_sample": True})["loss_multiplier"] == 1.0  # top level: NeMo-RL never looks
    assert nemo_rl_sample({**ok, "instance_config": {"mask_sample": True}})["loss_multiplier"] == 0.0


# -- discovery and configs, through nemo-gym's own code ---------------------------------------------------------------
def test_polar_gym_root_prints_the_root(capsys: pytest.CaptureFixture[str]) -> None:
    from nemo_polar.cli import main

    assert main(["gym-root"]) == 0
    assert capsys.readouterr().out.strip() == str(gym_root())


def test_gym_discovers_the_polar_environments_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    from nemo_gym import _resolve_under_cwd_or_install
    from nemo_gym.registry import discover_environments

    monkeypatch.delenv("NEMO_GYM_EXTRA_ROOTS", raising=False)
    assert not set(ENVIRONMENTS) & set(discover_environments())  # the variable is what makes them visible

    monkeypatch.setenv("NEMO_GYM_EXTRA_ROOTS", str(gym_root()))
    found = discover_environments()
    assert set(ENVIRONMENTS) <= set(found)
    for env in ENVIRONMENTS:
        entry = found[env]
        assert entry.config_path == gym_root() / "environments" / env / "config.yaml"
        assert entry.domain == "coding" and "Polar" in (entry.description or "")
    # The agent's server directory resolves the way `gym env start` resolves an entrypoint's directory.
    agent_dir = _resolve_under_cwd_or_install(
        "responses_api_agents/polar_agent", validator=lambda p: (p / "requirements.txt").is_file()
    )
    assert agent_dir == gym_root() / "responses_api_agents" / "polar_agent" and (agent_dir / "app.py").is_file()


@pytest.mark.parametrize("env", ENVIRONMENTS)
def test_gym_parses_each_environment_config_into_a_polar_agent(env: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from nemo_gym.config_types import DatasetConfig
    from nemo_gym.global_config import GlobalConfigDictParser, get_first_server_config_dict
    from omegaconf import DictConfig, OmegaConf

    monkeypatch.setenv("NEMO_GYM_EXTRA_ROOTS", str(gym_root()))
    policy = {"policy_base_url": "http://127.0.0.1:8000/v1", "policy_model_name": "tiny-qwen3"}
    config_path = gym_root() / "environments" / env / "config.yaml"
    initial = {
        "config_paths": [str(config_path)],
        "policy_api_key": "x",
        "error_on_agent_without_environment_server": True,  # 0.7.0 deprecates agents without one
        **policy,
    }
    parsed = GlobalConfigDictParser().parse_no_environment(initial_global_config_dict=DictConfig(initial))
    instances = GlobalConfigDictParser().filter_for_server_instance_configs(parsed)
    assert {i.name for i in instances} == {agent_name(env), f"{env}_environment_server", f"{env}_native"}
    server = OmegaConf.to_container(get_first_server_config_dict(parsed, agent_name(env)), resolve=True)
    cfg = PolarAgentConfig.model_validate({**server, "host": "127.0.0.1", "port": 0, "name": agent_name(env)})
    assert (cfg.env, cfg.model, cfg.engine_urls()) == (env, "tiny-qwen3", ["http://127.0.0.1:8000"])
    # Gym's split types, each with the license Gym requires of train and validation, each file shipped
    datasets = {d["type"]: d for d in server["datasets"]}
    assert set(datasets) == {"train", "validation", "example"} and datasets["train"]["license"] == "Apache 2.0"
    assert [d for d in server["datasets"] if "taskset" in d] == []  # flat rows, to the agent (not the native variant's)
    assert all((gym_root() / d["jsonl_fpath"]).is_file() for d in datasets.values())
    for d in server["datasets"]:
        DatasetConfig.model_validate(d)


def test_app_py_serves_the_agent_the_way_gym_launches_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """`gym env start` runs each server's app.py with the merged config in NEMO_GYM_CONFIG_DICT and the instance
    name in NEMO_GYM_CONFIG_PATH; Gym's own run_webserver then builds and serves the agent."""
    from nemo_gym.global_config import GlobalConfigDictParser
    from omegaconf import DictConfig, OmegaConf

    monkeypatch.setenv("NEMO_GYM_EXTRA_ROOTS", str(gym_root()))
    port = free_port()
    initial = {
        "config_paths": [str(gym_root() / "environments" / "polar_pi" / "config.yaml")],
        "policy_base_url": UNREACHABLE_ENGINE,
        "policy_model_name": "tiny-qwen3",
        "policy_api_key": "x",
        "head_server": {"host": "127.0.0.1", "port": free_port()},
        "polar_pi_agent": {"responses_api_agents": {"polar_agent": {"host": "127.0.0.1", "port": port}}},
    }
    config = GlobalConfigDictParser().parse_no_environment(initial_global_config_dict=DictConfig(initial))
    env = {**os.environ, "NEMO_GYM_CONFIG_DICT": OmegaConf.to_yaml(config), "NEMO_GYM_CONFIG_PATH": "polar_pi_agent"}
    agent_dir = gym_root() / "responses_api_agents" / "polar_agent"
    proc = subprocess.Popen(
        [sys.executable, "app.py"], cwd=agent_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else "app.py exited"
            assert time.monotonic() < deadline, "the agent did not come up"
            try:
                if loopback.get(f"{url}/health").status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        assert loopback.post(f"{url}/v1/responses", json={"input": "x"}).status_code == 501
        resp = loopback.post(f"{url}/run", json={"responses_create_params": {"input": "fix it"}})
        assert resp.status_code == 422 and "no instance_id" in resp.text
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert b"Ray" not in (proc.stdout.read() if proc.stdout else b"")  # the agent needs no Ray cluster


@pytest.mark.parametrize("env", ENVIRONMENTS)
def test_shipped_example_data_are_the_bundled_instances(env: str) -> None:
    path = gym_root() / "environments" / env / "data" / "example.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows == example_rows(agent_name(env))  # regenerate with nemo_polar.env.gym.write_data()
    tasks = [json.loads(line) for line in (path.parent / "example_tasks.jsonl").read_text().splitlines()]
    assert tasks == example_tasks(env, agent_name(env))
    assert [t["task_input"] for t in tasks] == [{k: v for k, v in r.items() if k != "agent_ref"} for r in rows]
    # Gym's train and validation splits: disjoint, together the example rows, the validation split every fourth
    splits = {s: [json.loads(line) for line in (path.parent / f"{s}.jsonl").read_text().splitlines()] for s in SPLITS}
    assert splits == {s: split_rows(agent_name(env), s) for s in SPLITS}
    ids = {s: [r["instance_id"] for r in rows] for s, rows in splits.items()}
    assert sorted(ids["train"] + ids["validation"]) == sorted(r["instance_id"] for r in rows)
    assert ids["validation"] == sorted(r["instance_id"] for r in rows)[3::4] and not set(ids["train"]) & set(
        ids["validation"]
    )
    # the variants (`--environment <env>/scripted`, `<env>/native`); regenerate with nemo_polar.env.gym.write_variants()
    for name, variant in VARIANTS.items():
        assert (path.parents[1] / f"{name}.yaml").read_text() == variant(env)
    by_id = {i.instance_id: i for i in bundled_instances()}
    for row in rows:
        BaseRunRequest.model_validate(row)  # Gym accepts the row
        inst = instance_from_row(row, row["responses_create_params"]["input"][0]["content"])
        assert inst.FAIL_TO_PASS == by_id[inst.instance_id].FAIL_TO_PASS and inst.repo_path is not None


# -- bad input ----------------------------------------------------------------------------------------------------
def _bad(row: dict[str, Any], **update: Any) -> dict[str, Any]:
    return {**row, **update}


BASE = row_for("polar_pi", "polar__textstats-1")
BAD_ROWS = {
    "no_params": ({k: v for k, v in BASE.items() if k != "responses_create_params"}, "responses_create_params"),
    "unknown_param": (_bad(BASE, responses_create_params={"input": "fix it", "bogus": 1}), "bogus"),
    "no_task_text": (
        {
            "responses_create_params": {"input": []},
            "instance_id": "x__y-1",
            "image": "i",
            "repo": "x/y",
            "FAIL_TO_PASS": [],
        },
        "x__y-1: no task text",
    ),
    "instance_dict_not_json": (
        {"responses_create_params": {"input": [], "metadata": {"instance_id": "x", "instance_dict": "{"}}},
        "metadata.instance_dict is not JSON",
    ),
    "two_instances": (
        _bad(BASE, responses_create_params={"input": [], "metadata": {"instance_id": "polar__money-1"}}),
        "the row names two instances",
    ),
    "no_instance_id": ({k: v for k, v in BASE.items() if k != "instance_id"}, "no instance_id"),
    "unknown_instance": (_bad(BASE, instance_id="nope__nope-1"), "'nope__nope-1' is not a bundled instance"),
    "bad_f2p_json": (_bad(BASE, FAIL_TO_PASS="[not json"), "FAIL_TO_PASS"),
    "relative_repo_path": (_bad(BASE, repo_path="repo"), "repo_path must be an absolute path"),
    "missing_repo_path": (_bad(BASE, repo_path="/nonexistent/polar-repo"), "does not exist"),
    "unknown_env": (_bad(BASE, polar_env="polar_nope"), "unknown Polar env 'polar_nope'"),
    "bad_rollout_id": (_bad(BASE, _ng_rollout_id="-bad id"), "_ng_rollout_id"),
    "bad_script": (_bad(BASE, script=[{"kind": "teleport"}]), "invalid script"),
}


@pytest.mark.parametrize("case", BAD_ROWS)
def test_bad_rows_are_a_422_naming_the_problem(agent_client: TestClient, case: str) -> None:
    row, needle = BAD_ROWS[case]
    resp = agent_client.post("/run", json=row)
    assert resp.status_code == 422, resp.text
    assert needle in resp.text


def test_a_row_with_its_own_repo_must_carry_the_instance_fields(agent_client: TestClient, tmp_path: Path) -> None:
    row = {"responses_create_params": {"input": "fix it"}, "instance_id": "x__y-1", "repo_path": str(tmp_path)}
    resp = agent_client.post("/run", json=row)
    assert resp.status_code == 422
    assert "missing SWE-bench instance field(s): repo, FAIL_TO_PASS" in resp.text
    full = {**row, "repo": "x/y", "problem_statement": "p", "FAIL_TO_PASS": '["t::a"]'}
    resp = agent_client.post("/run", json=full)  # valid instance, but the scripted agent needs a script
    assert resp.status_code == 422 and "has no script" in resp.text


def test_responses_route_explains_the_agent_only_runs(agent_client: TestClient) -> None:
    resp = agent_client.post("/v1/responses", json={"input": "hello"})
    assert resp.status_code == 501
    assert "only POST /run" in resp.json()["detail"]


def test_bad_agent_configs_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown Polar env 'polar_nope'"):
        make_agent("polar_nope", proxy_url="http://127.0.0.1:1", proxy_admin_url="http://127.0.0.1:2")
    with pytest.raises(ValueError, match=r"proxy_url .* or openai_base_url"):
        make_agent()
    with pytest.raises(ValueError, match="unknown harness 'vim'"):
        make_agent(harness="vim", proxy_url="http://127.0.0.1:1", proxy_admin_url="http://127.0.0.1:2")


# -- masked samples -----------------------------------------------------------------------------------------------
def test_an_episode_that_raises_is_a_masked_sample_not_a_500(tmp_path: Path) -> None:
    seen: dict[str, Any] = {}

    def broken_runner(harness: Any, instance: Any, proxy: Any, session_dir: Path, **kw: Any) -> Episode:
        seen.update(harness=harness.name, instance=instance.instance_id, **kw)
        raise RuntimeError("sandbox runtime unavailable")

    agent = make_agent(
        "polar_codex",
        proxy_url="http://127.0.0.1:1",
        proxy_admin_url="http://127.0.0.1:2",
        work_dir=tmp_path,
        runtime="local",
        staging="direct",
    )
    agent.episode_runner = broken_runner
    resp = TestClient(agent.setup_webserver()).post("/run", json=row_for("polar_codex", "polar__lrucache-1"))
    assert resp.status_code == 200, resp.text
    result = resp.json()
    assert (result["mask_sample"], result["reward"], result["failure_kind"]) == (True, 0.0, "polar:run_failed")
    assert result["failure_reason"] == "RuntimeError: sandbox runtime unavailable"
    assert result["response"]["output"] == []
    assert seen["harness"] == "codex" and seen["instance"] == "polar__lrucache-1"
    assert (seen["runtime"], seen["scripted"], seen["session_config"]["mode"]) == ("local", False, "continuation")
    assert seen["session_config"]["metadata"]["gym_agent"] == "polar_codex_agent"

    row = {**row_for("polar_codex", "polar__lrucache-1"), "polar_env": "polar_pi", "_ng_rollout_id": "task7-r2"}
    assert TestClient(agent.setup_webserver()).post("/run", json=row).status_code == 200
    assert seen["harness"] == "pi" and seen["session_config"]["metadata"]["rollout_id"] == "task7-r2"


def test_a_harness_timeout_is_masked_with_its_reason(tmp_path: Path) -> None:
    """A real CLI in bwrap, killed by a tiny timeout, against an in-process proxy started by the agent."""
    agent = make_agent("polar_pi", openai_base_url=UNREACHABLE_ENGINE, work_dir=tmp_path, scripted=True, timeout=0.5)
    try:
        resp = TestClient(agent.setup_webserver()).post("/run", json=row_for("polar_pi", "polar__textstats-1"))
    finally:
        agent.close()
    assert resp.status_code == 200, resp.text
    result = BaseVerifyResponse.model_validate(resp.json()).model_dump()
    assert result["mask_sample"] is True and result["reward"] == 0.0
    assert result["failure_kind"] == "agent_timeout" and "exceeded" in result["failure_reason"]
    assert resp.json()["session_status"] == "timeout" and resp.json()["trainable_tokens"] == 0
    assert not any("generation_token_ids" in item for item in result["response"]["output"])


def test_on_timeout_grade_grades_what_the_killed_session_left(tmp_path: Path) -> None:
    """The same killed CLI under ``on_timeout: grade``: swebench grades the untouched workspace (reward 0), and with
    no model call answered there is still nothing to train on."""
    agent = make_agent(
        "polar_pi",
        openai_base_url=UNREACHABLE_ENGINE,
        work_dir=tmp_path,
        scripted=True,
        timeout=0.5,
        gateway={"on_timeout": "grade"},
    )
    try:
        resp = TestClient(agent.setup_webserver()).post("/run", json=row_for("polar_pi", "polar__textstats-1"))
    finally:
        agent.close()
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["session_status"] == "timeout" and body["failure_kind"] == "polar:no_main_chain"
    assert body["mask_sample"] is True and body["reward"] == 0.0
    assert (Path(body["session_dir"]) / "grade.json").is_file()  # the workspace was graded


# -- the real loop: engine, proxy, CLI, grader --------------------------------------------------------------------
@pytest.fixture
def records_proxy(engine_url: str, tmp_path: Path) -> Iterator[ProxyHandle]:
    yield from make_proxy(engine_url, tmp_path / "records")


def _run(proxy: ProxyHandle, env: str, row: dict[str, Any], tmp_path: Path, **config: Any) -> dict[str, Any]:
    agent = make_agent(
        env,
        proxy_url=proxy.url,
        proxy_admin_url=proxy.admin_url,
        proxy_admin_token=proxy.admin_token,
        work_dir=tmp_path / "sessions",
        scripted=True,
        timeout=300,
        **config,
    )
    with TestClient(agent.setup_webserver()) as client:  # the lifespan closes the agent's gateway and proxies
        resp = client.post("/run", json=row)
    assert resp.status_code == 200, resp.text
    return resp.json()


SOLVED = [
    ("polar_pi", "polar__textstats-1"),
    ("polar_codex", "polar__lrucache-1"),
    ("polar_claude_code", "polar__money-1"),
    ("polar_qwen_code", "polar__semverlite-1"),
    ("polar_gemini_cli", "polar__humanfmt-1"),
    ("polar_mini_swe_agent", "polar__taskgraph-1"),
    ("polar_hermes", "polar__intervals-1"),
    ("polar_copilot", "polar__confmerge-1"),
    ("polar_cline", "polar__csvlite-1"),
    ("polar_opencode", "polar__globmatch-1"),
    ("polar_openhands_sdk", "polar__taskgraph-1"),
]


@pytest.mark.engine
@pytest.mark.parametrize(
    ("env", "instance_id", "shape"),
    lane(
        [(*s, SHAPES[n % 3]) for n, s in enumerate(SOLVED)],
        [(*s, SHAPES[n % 3]) for n, s in enumerate(SOLVED) if s[0] in DIALECT_ENVS],
        ids=lambda c: "-".join(c),
    ),
)
def test_run_solves_a_bundled_task_and_returns_a_trainable_sample(
    records_proxy: ProxyHandle, env: str, instance_id: str, shape: Shape, tmp_path: Path
) -> None:
    """Each harness on a bundled task, the row in one of Gym's shapes (ours, swe_agents', anyswe's) in turn: one
    harness per dialect in make test (each shape among them), every harness in make test-full."""
    result = _run(records_proxy, env, row_for(env, instance_id, shape), tmp_path)
    assert result["session_status"] == "completed" and result["grade_status"] == "resolved", result
    assert (result["reward"], result["mask_sample"], result["failure_kind"]) == (1.0, False, None)
    assert result["fail_to_pass"] == 1.0 and result["pass_to_pass"] == 1.0

    parsed = BaseVerifyResponse.model_validate(result)  # Gym's own model, ForTraining items and all
    assert parsed.response.output and all(
        isinstance(o, NeMoGymResponseOutputMessageForTraining) for o in parsed.response.output
    )
    sample = nemo_rl_sample(result)
    assert sample["loss_multiplier"] == 1.0 and sample["reward"] == 1.0

    # The generations are exactly what the engine sampled, as the proxy recorded them.
    records = {r["call_id"]: r for r in records_proxy.disk_records(result["session_id"])}
    items = result["response"]["output"]
    assert [i["generation_token_ids"] for i in items] == [
        records[i["id"].removeprefix("msg_")]["sampled_token_ids"] for i in items
    ]
    assert [i["generation_log_probs"] for i in items] == [
        records[i["id"].removeprefix("msg_")]["sampled_logprobs"] for i in items
    ]
    assert items[0]["prompt_token_ids"] == records[items[0]["id"].removeprefix("msg_")]["prompt_token_ids"]
    assert result["delivered_calls"] == len(items) == result["calls"] == len(records)
    assert result["trainable_tokens"] == sum(len(i["generation_token_ids"]) for i in items)
    assert result["main_segments"] == 1 and result["delivered_fraction"] == 1.0
    assert {"session_run_s", "episode_s", "reconstruct_s"} <= set(result["timings"])


@pytest.mark.engine
def test_all_traces_delivers_every_trace_of_a_subagent_session(records_proxy: ProxyHandle, tmp_path: Path) -> None:
    """``delivery: all_traces``: beside the unchanged main chain, the ``training_traces`` envelope holds the main
    chain and the subagent's, every call the proxy recorded owned by exactly one trace, by the envelope's rules."""
    from nemo_polar.reconstruct.envelope import TrainingTraces

    inst = next(i for i in bundled_instances() if i.instance_id == "polar__money-1")
    edit = next(a for a in inst.script or [] if a["kind"] == "edit_file")
    script = [
        {"kind": "subagent", "description": "Find the default", "prompt": f"Read {edit['path']} and report."},
        {"kind": "read_file", "path": edit["path"]},
        {"kind": "final", "text": "Unlisted currencies default to 0 minor digits."},
        edit,
        {"kind": "final", "text": "Unlisted currencies now default to 2 minor digits."},
    ]
    row = {**row_for("polar_claude_code", inst.instance_id, "anyswe"), "script": script, "_ng_rollout_id": "r7"}
    result = _run(records_proxy, "polar_claude_code", row, tmp_path, delivery="all_traces")
    assert (result["reward"], result["mask_sample"], result["subagent_chains"]) == (1.0, False, 1), result
    envelope = TrainingTraces.model_validate(result["training_traces"])  # the restated rules, again on the wire
    assert envelope.rollout_id == "r7" and envelope.builder == "prefix_merging" and len(envelope.traces) == 2
    recorded = [r["call_id"] for r in records_proxy.disk_records(result["session_id"])]
    owned = [s.model_call_id for t in envelope.traces for s in t.sampled_spans]
    assert sorted(owned) == sorted(recorded) and result["training_traces_masked"] == {}
    main = [i["id"].removeprefix("msg_") for i in result["response"]["output"]]
    assert main in [t.model_call_ids for t in envelope.traces]  # the main chain is one of them, as delivered
    with pytest.raises(ValueError, match="builder per_request needs delivery all_traces"):
        make_agent(proxy_url="http://127.0.0.1:1", proxy_admin_url="http://127.0.0.1:2", builder="per_request")


@pytest.mark.engine
def test_a_grading_timeout_is_masked_but_still_well_formed(records_proxy: ProxyHandle, tmp_path: Path) -> None:
    """The scripted CLI leaves a patch whose tests hang: the grade times out, the sample is masked (the trainer
    drops it), and the result still passes NeMo-RL's post-processing."""
    row = row_for("polar_pi", "polar__textstats-1")
    inst = next(i for i in bundled_instances() if i.instance_id == "polar__textstats-1")
    edit = next(a for a in inst.script or [] if a["kind"] == "edit_file")
    hang = {**edit, "new": "    import time\n\n    time.sleep(60)\n" + edit["new"]}
    row = {**row, "test_timeout_s": 3, "script": [hang, {"kind": "final", "text": "done"}]}
    result = _run(records_proxy, "polar_pi", row, tmp_path)
    assert result["grade_status"] == "tests_timeout"
    assert (result["mask_sample"], result["reward"], result["failure_kind"]) == (True, 0.0, "polar:grade_tests_timeout")
    assert "3 s" in result["failure_reason"]
    assert nemo_rl_sample(result)["loss_multiplier"] == 0.0
    assert nemo_rl_sample(result, mask_flagged_samples=False)["loss_multiplier"] == 1.0


@pytest.mark.engine
def test_concurrent_runs_share_one_gateway_and_overlap_stages(records_proxy: ProxyHandle, tmp_path: Path) -> None:
    """Two /run calls on one agent with one run slot: the second is prepared while the first runs, the first is
    graded while the second runs, and both are rewarded."""
    agent = make_agent(
        "polar_pi",
        proxy_url=records_proxy.url,
        proxy_admin_url=records_proxy.admin_url,
        proxy_admin_token=records_proxy.admin_token,
        work_dir=tmp_path,
        scripted=True,
        timeout=300,
        concurrency=1,
    )
    rows = [row_for("polar_pi", "polar__textstats-1"), row_for("polar_pi", "polar__intervals-1")]
    with TestClient(agent.setup_webserver()) as client, ThreadPoolExecutor(2) as pool:
        first, second = (r.json() for r in pool.map(lambda row: client.post("/run", json=row), rows))
        gateway = agent.episodes._gateway_host.gateway  # type: ignore[union-attr]
        # One gateway ran both; finished jobs leave its memory, their outcomes stay in its state_dir.
        assert len(list(gateway.config.state_dir.glob("*/outcome.json"))) == 2 and gateway.jobs == {}
    assert agent.episodes._gateway_host is None  # closed with the server
    assert (first["reward"], second["reward"], first["mask_sample"], second["mask_sample"]) == (1.0, 1.0, False, False)
    a, b = sorted((first["stage_times"], second["stage_times"]), key=lambda t: t["run"])
    assert b["ready"] < a["postrun"]  # INIT of the later session overlapped the earlier RUN
    assert b["run"] < a["done"]  # the earlier POSTRUN overlapped the later RUN


def unpreparable_row(tmp_path: Path) -> dict[str, Any]:
    """A row whose base commit is not in its repository: the gateway's INIT fails before any model call."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "a.py").write_text("x = 1\n")
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "a"]):
        subprocess.run(["git", *args], cwd=repo, check=True)
    return {
        "responses_create_params": {"input": "fix it"},
        "instance_id": "x__y-1",
        "repo": "x/y",
        "repo_path": str(repo),
        "base_commit": "0" * 40,
        "problem_statement": "p",
        "FAIL_TO_PASS": '["t::a"]',
        "script": [{"kind": "final", "text": "done"}],
    }


def test_a_session_that_cannot_be_prepared_is_masked_with_the_reason(tmp_path: Path) -> None:
    """INIT fails: a masked sample, never a 500. With no engine reachable there is no generation data to send."""
    row = unpreparable_row(tmp_path)
    agent = make_agent("polar_pi", openai_base_url=UNREACHABLE_ENGINE, work_dir=tmp_path / "s", scripted=True)
    with TestClient(agent.setup_webserver()) as client:
        resp = client.post("/run", json=row)
    assert resp.status_code == 200, resp.text
    result = resp.json()
    assert (result["mask_sample"], result["reward"], result["failure_kind"]) == (True, 0.0, "polar:init_failed")
    assert result["failure_reason"].startswith("init failed") and "0000000" in result["failure_reason"]
    assert result["response"]["output"] == [] and "run" not in result["stage_times"]
    assert result["instance_config"] == {
        "mask_sample": True,
        "failure_kind": "polar:init_failed",
        "failure_reason": result["failure_reason"],
    }


@pytest.mark.engine
def test_a_batch_with_a_masked_row_goes_through_nemo_rls_post_processing(engine_url: str, tmp_path: Path) -> None:
    """Three rewarded rows and one whose INIT fails, on the agent's own in-process proxy in front of the real engine:
    the masked row still carries a token-bearing item the engine really produced (one minimal call for its prompt,
    as no call was made), so NeMo-RL masks it instead of raising and ending the batch."""
    agent = make_agent("polar_pi", openai_base_url=engine_url, work_dir=tmp_path / "s", scripted=True, concurrency=3)
    good = [row_for("polar_pi", i) for i in ("polar__textstats-1", "polar__intervals-1", "polar__money-1")]
    rows = [unpreparable_row(tmp_path), *good]
    with TestClient(agent.setup_webserver()) as client, ThreadPoolExecutor(4) as pool:
        results = [r.json() for r in pool.map(lambda row: client.post("/run", json=row), rows)]
    samples = [nemo_rl_sample(r) for r in results]  # raises on a result without generation data
    assert [s["loss_multiplier"] for s in samples] == [0.0, 1.0, 1.0, 1.0]
    assert [r["reward"] for r in results] == [0.0, 1.0, 1.0, 1.0]
    masked = results[0]
    assert masked["instance_config"]["mask_sample"] and masked["mask_sample"]
    assert masked["failure_kind"] == "polar:init_failed" and masked["failure_reason"].startswith("init failed")
    [item] = [i for i in masked["response"]["output"] if i.get("generation_token_ids")]
    assert len(item["generation_token_ids"]) == len(item["generation_log_probs"]) == 1
    assert item["prompt_token_ids"]  # the row's prompt as the engine saw it
    assert all(not r["instance_config"]["mask_sample"] for r in results[1:])


@pytest.mark.engine
def test_the_gateways_own_mask_reaches_the_result(
    records_proxy: ProxyHandle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mask only the gateway decides (here its cross_version policy, as if a weight update fell inside the
    session) is the result's mask too, though the session, the grade and the main chain are all fine."""
    from nemo_polar.env.gateway import Gateway

    conclude = Gateway.conclude

    def spanning(self, *args):  # type: ignore[no-untyped-def]
        episode = conclude(self, *args)
        assert episode.verdict.trainable  # only the gateway's own policy masks it
        episode.verdict = Verdict(kind="cross_version", reason="calls span policy versions [1, 2]", reward=1.0)
        return episode

    monkeypatch.setattr(Gateway, "conclude", spanning)
    result = _run(records_proxy, "polar_pi", row_for("polar_pi", "polar__textstats-1"), tmp_path)
    assert result["grade_status"] == "resolved" and result["response"]["output"]
    assert result["instance_config"]["mask_sample"] and result["failure_kind"] == "polar:cross_version"
    assert result["failure_reason"] == "calls span policy versions [1, 2]"
    assert nemo_rl_sample(result)["loss_multiplier"] == 0.0
