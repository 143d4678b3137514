"""``PolarEnv(config).collect(instances, n_samples)``, ``polar rollout dataset=… n_samples=…`` and ``polar generate``:
real Pi sessions through the gateway on bundled tasks (scripted), graded by swebench, reconstructed, grouped for
GRPO; SFT data by rejection sampling with acceptance statistics; finished attempts are never run twice."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import datasets
import pytest

from nemo_polar.cli import main
from nemo_polar.env.frontends.generate import generate
from nemo_polar.env.frontends.rollout import compose
from nemo_polar.env.frontends.rollout import env_config as rollout_env_config
from nemo_polar.env.gym.rows import Shape, example_row
from nemo_polar.env.polar_env import Group, PolarEnv, PolarEnvConfig, Sample
from nemo_polar.env.specs import EnvOverrides, resolve_env
from nemo_polar.proxy.http.client import ProxyClient
from nemo_polar.rewards import bundled_instances
from nemo_polar.rewards.instance import SWEInstance
from tests.conftest import ProxyHandle

pytestmark = pytest.mark.engine
SOLVED = next(i for i in bundled_instances() if i.instance_id == "polar__csvlite-1")
# The same task with a script that looks around and gives up: graded, not resolved (reward 0, still trainable).
UNSOLVED = SOLVED.model_copy(
    update={
        "instance_id": "polar__csvlite-1-nofix",
        "script": [{"kind": "shell", "command": "ls csvlite"}, {"kind": "final", "text": "I could not fix it."}],
    }
)


def sessions_made(proxy: ProxyHandle) -> int:
    return proxy.admin("GET", "/health").json()["sessions"]


def env_config(proxy: ProxyHandle, state_dir: Path, **kw: Any) -> PolarEnvConfig:
    fields: dict[str, Any] = {"env": "polar_pi", "scripted": True, "gateway": {"run_slots": 2, "init_workers": 2}}
    return PolarEnvConfig(proxy=proxy.client(), state_dir=state_dir, **{**fields, **kw})


@pytest.fixture(scope="module")
def collected(proxy: ProxyHandle, tmp_path_factory: pytest.TempPathFactory) -> tuple[PolarEnv, list[Group]]:
    env = PolarEnv(env_config(proxy, tmp_path_factory.mktemp("collect") / "state"))
    return env, env.collect([SOLVED, UNSOLVED], n_samples=2)


def test_collect_returns_rewarded_groups_with_traces(collected: tuple[PolarEnv, list[Group]]) -> None:
    env, groups = collected
    assert [g.instance_id for g in groups] == [SOLVED.instance_id, UNSOLVED.instance_id]
    assert [[s.reward for s in g.samples] for g in groups] == [[1.0, 1.0], [0.0, 0.0]]
    assert [g.mean_reward for g in groups] == [1.0, 0.0]
    for group in groups:
        assert [s.index for s in group.samples] == [0, 1]
        for s in group.samples:
            assert s.trainable and s.outcome.status == "published" and s.advantage == 0.0  # no spread in the group
            main = [t for t in s.traces if t.role == "main"]
            assert len(main) == 1 and main[0].break_reason is None  # one continuation chain, zero breaks
            assert all(t.reward == s.reward and t.advantage == 0.0 for t in s.traces)
            assert (env.config.state_dir / s.request_id / "outcome.json").exists()
    solved_calls = groups[0].samples[0].outcome.metrics["calls"]
    assert solved_calls == len(SOLVED.script or []) and len(groups[0].samples[0].traces[0].spans) == solved_calls


def test_advantages_are_per_session_and_reach_every_trace(collected: tuple[PolarEnv, list[Group]]) -> None:
    env, groups = collected
    passed, failed = (g.samples[0].model_copy(deep=True) for g in groups)
    env._advantages([passed, failed])  # as if both attempts were one GRPO group
    assert (passed.advantage, failed.advantage) == (0.5, -0.5)
    for s in (passed, failed):
        assert s.traces and all(t.advantage == s.advantage and t.reward == s.reward for t in s.traces)
        assert sum(t.weight for t in s.traces) == pytest.approx(1.0)  # one unit of gradient per session


def test_collect_again_returns_finished_attempts_without_running_them(
    collected: tuple[PolarEnv, list[Group]], proxy: ProxyHandle
) -> None:
    env, groups = collected
    before = sessions_made(proxy)
    again = PolarEnv(env.config).collect([SOLVED, UNSOLVED], n_samples=2)
    assert sessions_made(proxy) == before
    assert [[s.outcome for s in g.samples] for g in again] == [[s.outcome for s in g.samples] for g in groups]


def test_bad_collect_input_is_refused(proxy: ProxyHandle, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"unknown Polar env 'polar_nope'.*polar_pi"):
        env_config(proxy, tmp_path, env="polar_nope")
    with pytest.raises(ValueError, match="run_slots"):
        PolarEnvConfig(env="polar_pi", proxy=proxy.client(), state_dir=tmp_path, gateway={"run_slots": 0})
    env = PolarEnv(env_config(proxy, tmp_path))
    with pytest.raises(ValueError, match="n_samples must be at least 1"):
        env.collect([SOLVED], n_samples=0)
    with pytest.raises(ValueError, match="needs an instance with a script"):
        env.collect([SOLVED.model_copy(update={"script": None})], n_samples=1)
    assert not any(tmp_path.iterdir())  # nothing ran


def test_rollout_composes_builder_and_dataset_groups() -> None:
    cfg = compose(["env=polar_codex", "dataset=bundled", "n_samples=4", "builder=per_request"])
    assert (cfg.env.harness, cfg.dataset.path, cfg.n_samples) == ("codex", "bundled", 4)
    assert cfg.builder.name == "per_request"
    assert compose([]).get("dataset") is None and compose([]).builder.name == "prefix_merging"


def test_the_composed_rollout_config_is_a_polar_env_config(tmp_path: Path) -> None:
    """conf/rollout.yaml is shaped like PolarEnvConfig: validated as composed, with no mapping by hand, and env
    overrides merge through the one resolver (as the Gym agent's and PolarEnvConfig's own do)."""
    proxy = ProxyClient(url="http://127.0.0.1:1", admin_url="http://127.0.0.1:2")
    overrides = [
        "env=polar_codex", "dataset=bundled", "builder=per_request", "builder.mask_truncated=true", "timeout=42",
        "runtime=docker", "early_stop=2", "+harness_options.reasoning_effort=low", "+session.metadata.tag=x",
        "env.session.mode=chat", "gateway.cross_version=mask",
    ]  # fmt: skip
    config = rollout_env_config(compose(overrides), proxy, tmp_path)
    spec = config.spec()
    assert (spec.name, config.runtime, config.scripted, config.early_stop) == ("polar_codex", "docker", True, 2)
    assert config.builder == "per_request" and config.builder_config.mask_truncated
    gateway = config.gateway_config()
    assert (gateway.agent_budget_s, gateway.cross_version, gateway.runtime) == (42.0, "mask", "docker")
    assert spec.harness == "codex" and spec.harness_options["reasoning_effort"] == "low"
    assert spec.session["mode"] == "chat" and spec.session["metadata"] == {"tag": "x"}
    assert spec == resolve_env(
        "polar_codex",
        EnvOverrides(harness_options={"reasoning_effort": "low"}, session={"mode": "chat", "metadata": {"tag": "x"}}),
    )
    with pytest.raises(ValueError, match="unknown harness 'vim'"):
        resolve_env("polar_codex", EnvOverrides(harness="vim"))
    with pytest.raises(ValueError, match="invalid session config"):
        resolve_env("polar_codex", EnvOverrides(session={"mode": "telepathy"}))


def test_polar_rollout_runs_a_dataset(proxy: ProxyHandle, engine_url: str, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """A dataset of NeMo Gym's rows of the bundled tasks as Gym ships them, anyswe's (everything in the metadata) and
    swe_agents' (the SWE-bench fields at the top level) in turn: every row read, one run."""
    rows = tmp_path.parent / f"{tmp_path.name}-gym_rows.jsonl"
    shapes: tuple[Shape, ...] = ("anyswe", "swe_agents")
    gym_rows = [example_row(i, "polar_pi_agent", shapes[n % 2]) for n, i in enumerate(bundled_instances())]
    rows.write_text("".join(json.dumps(r) + "\n" for r in gym_rows))
    argv = [
        "rollout",
        "env=polar_pi",
        "dataset=gym",
        f"dataset.path={rows}",
        "dataset.scripted=true",
        f"dataset.instance_ids=[{SOLVED.instance_id}]",
        "n_samples=1",
        f"proxy.url={proxy.url}",
        f"proxy.admin_url={proxy.admin_url}",
        f"proxy.admin_token={proxy.admin_token}",
        f"engine.url={engine_url}",
        f"out={tmp_path}",
    ]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["attempts"] == 1 and summary["trainable"] == 1 and summary["resolved"] == 1
    assert summary["per_instance"] == {SOLVED.instance_id: 1.0}
    [result] = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert result["request_id"] == f"{SOLVED.instance_id}.s0" and result["reward"] == 1.0
    traces = [json.loads(x) for x in (tmp_path / "traces.jsonl").read_text().splitlines()]
    assert len(traces) == summary["traces"] >= 1 and all(t["reward"] == 1.0 for t in traces)
    with pytest.raises(SystemExit, match="unknown instance ids"):
        main(["rollout", "dataset=bundled", "dataset.instance_ids=[nope]", *proxy_args(proxy)])
    with pytest.raises(SystemExit, match="give a task file"):
        main(["rollout", *proxy_args(proxy), f"engine.url={engine_url}"])


def proxy_args(proxy: ProxyHandle) -> list[str]:
    return [f"proxy.url={proxy.url}", f"proxy.admin_url={proxy.admin_url}", f"proxy.admin_token={proxy.admin_token}"]


# -- polar generate -----------------------------------------------------------------------------------------------
def write_instances(path: Path, instances: list[SWEInstance]) -> Path:
    path.write_text("".join(i.model_dump_json() + "\n" for i in instances))
    return path


def test_generate_keeps_only_resolved_sessions(proxy: ProxyHandle, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    instances = write_instances(tmp_path / "instances.jsonl", [SOLVED, UNSOLVED])
    out = tmp_path / "out"
    argv = ["generate", "--instances", str(instances), "--attempts", "1", "-o", str(out), "--proxy-url", proxy.url]
    argv += ["--proxy-admin-url", proxy.admin_url, "--proxy-admin-token", proxy.admin_token]
    assert main([*argv, "--scripted"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert (stats["attempted"], stats["accepted"], stats["rejected"], stats["masked"]) == (2, 1, 1, 0)
    assert stats["acceptance_rate"] == 0.5
    assert stats["per_instance"] == {
        SOLVED.instance_id: {"attempted": 1, "accepted": 1, "masked": 0},
        UNSOLVED.instance_id: {"attempted": 1, "accepted": 0, "masked": 0},
    }
    assert json.loads((out / "acceptance.json").read_text()) == stats
    rows = [json.loads(x) for x in (out / "sft.jsonl").read_text().splitlines()]
    assert len(rows) == stats["rows"] >= 1
    for row in rows:
        meta = json.loads(row["metadata"])
        assert meta["instance_id"] == SOLVED.instance_id and meta["harness"] == "pi" and row["reward"] == 1.0
        assert len(row["response_ids"]) == len(row["loss_mask"]) == len(row["logprobs"]) and any(row["loss_mask"])
        assert row["messages"][0]["role"] == "system" and row["messages"][-1]["role"] == "assistant"
    parquet = datasets.Dataset.from_parquet(str(out / "sft.parquet"))
    assert parquet.to_list() == rows

    before = sessions_made(proxy)  # re-running skips both finished attempts and rebuilds the same dataset
    assert main([*argv, "--scripted"]) == 0
    assert json.loads(capsys.readouterr().out) == stats and sessions_made(proxy) == before


class Interrupted(Exception):
    pass


def test_interrupted_generate_keeps_finished_attempts(proxy: ProxyHandle, tmp_path: Path) -> None:
    config = env_config(proxy, tmp_path / "sessions", gateway={"run_slots": 1})

    def stop_after_first(sample: Sample) -> None:
        raise Interrupted(sample.request_id)

    class Progress:
        def start(self, total: int) -> None:
            pass

        __call__ = staticmethod(stop_after_first)

    with pytest.raises(Interrupted) as first:
        generate(config, [SOLVED], 2, tmp_path, Progress())  # type: ignore[arg-type]
    finished = first.value.args[0]
    assert (tmp_path / "sessions" / finished / "outcome.json").exists()
    before = sessions_made(proxy)
    stats = generate(config, [SOLVED], 2, tmp_path)
    assert sessions_made(proxy) == before + 1  # only the attempt cut off by the interruption ran again
    assert (stats.attempted, stats.accepted) == (2, 2)


def test_generate_bad_input_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"instance_id": "x"}\n')
    with pytest.raises(SystemExit, match=r"bad\.jsonl:1"):
        main(["generate", "--instances", str(bad), "--engine-url", "http://127.0.0.1:9", "-o", str(tmp_path / "o")])
    with pytest.raises(SystemExit, match=r"not reachable.*polar engine up"):
        main(["generate", "--instances", "bundled", "--engine-url", "http://127.0.0.1:9", "-o", str(tmp_path / "o")])
    with pytest.raises(SystemExit, match=r"Could not find .env/nope."):
        main(
            [
                "generate",
                "--env",
                "nope",
                "--instances",
                "bundled",
                "--proxy-url",
                "http://x",
                "--proxy-admin-url",
                "http://y",
                "-o",
                str(tmp_path),
            ]
        )
    assert not (tmp_path / "o" / "sessions").exists()
