"""NeMo Gym integration: the Polar agent server (:mod:`.agent`, needs ``nemo-gym``) and the Gym root shipped with
it, ``root/`` (``environments/polar_*`` and ``responses_api_agents/polar_agent``). Point Gym at it with
``NEMO_GYM_EXTRA_ROOTS=$(polar gym-root)`` and the environments resolve by name through Gym's own discovery."""

from __future__ import annotations

import json
from pathlib import Path

from nemo_polar.env.harness import HARNESSES


def environments() -> tuple[str, ...]:
    """The Gym environments, one per registered harness and of its Polar env's name (conf/env/<name>.yaml), sorted."""
    return tuple(sorted(h.env_name() for h in HARNESSES.values()))


def __getattr__(name: str) -> tuple[str, ...]:
    # ENVIRONMENTS, read when asked: a harness registered after this import (a test's toy) is among them.
    if name == "ENVIRONMENTS":
        return environments()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def gym_root() -> Path:
    return Path(__file__).resolve().with_name("root")


def agent_name(env: str) -> str:
    """The agent server instance an environment's config defines (what ``agent_ref.name`` routes to)."""
    return f"{env}_agent"


def write_data(root: Path | None = None) -> list[Path]:
    """Regenerate every environment's data from the bundled instances: ``data/example.jsonl`` (rows for its agent),
    ``data/example_tasks.jsonl`` (the same as materialized tasks, for its native server) and the disjoint
    ``data/train.jsonl`` and ``data/validation.jsonl`` (Gym's one-step ``gym eval run --split``)."""
    from nemo_polar.env.gym.rows import SPLITS, example_rows, example_tasks, split_rows

    written = []
    for env in environments():
        data = (root or gym_root()) / "environments" / env / "data"
        data.mkdir(parents=True, exist_ok=True)
        for name, rows in (
            ("example", example_rows(agent_name(env))),
            ("example_tasks", example_tasks(env, agent_name(env))),
            *((split, split_rows(agent_name(env), split)) for split in SPLITS),
        ):
            path = data / f"{name}.jsonl"
            path.write_text("".join(json.dumps(row) + "\n" for row in rows))
            written.append(path)
    return written


def scripted_variant(env: str) -> str:
    """``environments/<env>/scripted.yaml``: the environment with the instances' scripted policy turns, for the tiny
    random-weight models (``gym env start --environment <env>/scripted``): the engine samples the script's tokens, so
    ids and logprobs are real and the CLI solves the task."""
    agent, native = agent_name(env), f"{env}_native"
    return (
        f"# {env} with the scripted policy: each instance's written turns are what the engine samples (real ids\n"
        "# and logprobs; the tiny models of `make setup` solve the bundled tasks this way). The rest is config.yaml.\n"
        f"config_paths: [environments/{env}/config.yaml]\n"
        f"{agent}: {{responses_api_agents: {{polar_agent: {{scripted: true}}}}}}\n"
        f"{native}: {{environment_servers: {{polar_env: {{scripted: true}}}}}}\n"
    )


def datasets(env: str, taskset: str | None = None) -> list[dict[str, object]]:
    """The datasets an environment's agent declares (``config.yaml``): Gym's train and validation splits (Gym requires
    their license: the bundled tasks are the project's own) and the example rows. With ``taskset``, Gym's data
    preparation materializes the split rows as tasks of that taskset (the native variant)."""
    declared: list[dict[str, object]] = []
    for split in ("train", "validation", "example"):
        dataset: dict[str, object] = {
            "name": split,
            "type": split,
            "jsonl_fpath": f"environments/{env}/data/{split}.jsonl",
        }
        if split != "example":
            dataset["license"] = "Apache 2.0"
            if taskset:
                dataset["taskset"] = taskset
        declared.append(dataset)
    return declared


def native_variant(env: str) -> str:
    """``environments/<env>/native.yaml``: the environment's train and validation splits through its native
    environment server in one step (``gym eval run --environment <env>/native --split validation``). Gym's data
    preparation materializes each row as a task of the taskset ``<env>`` (the datasets' ``taskset``), collection
    routes the taskset to ``<env>_native`` (``environment_server_routes``), and the server names the agent its
    episodes are the agent's (``agent_server``: Gym's ``resolve_dataset_agent`` requires the declaring agent there,
    ``nemo_gym/global_config.py``). Only here: beside the agent's ``legacy_agent`` relay, a second server fronting
    the agent would leave Gym's agent-routed rows two servers to choose from."""
    import yaml

    agent, native = agent_name(env), f"{env}_native"
    agent_ref = {"type": "responses_api_agents", "name": agent}
    config = {
        "config_paths": [f"environments/{env}/config.yaml"],
        "environment_server_routes": {env: native},
        agent: {"responses_api_agents": {"polar_agent": {"datasets": datasets(env, taskset=env)}}},
        native: {"environment_servers": {"polar_env": {"agent_server": agent_ref}}},
    }
    return (
        f"# {env}'s train and validation splits through its native environment server: Gym materializes each row as\n"
        f"# a task of the taskset {env} and routes it to {native}. The rest is config.yaml.\n"
    ) + yaml.safe_dump(config, sort_keys=False)


VARIANTS = {"scripted": scripted_variant, "native": native_variant}


def write_variants(root: Path | None = None) -> list[Path]:
    """Regenerate every environment's variant configs (``scripted.yaml``, ``native.yaml``)."""
    written = []
    for env in environments():
        for name, variant in VARIANTS.items():
            path = (root or gym_root()) / "environments" / env / f"{name}.yaml"
            path.write_text(variant(env))
            written.append(path)
    return written
