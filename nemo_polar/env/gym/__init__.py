"""NeMo Gym integration: the Polar agent server (:mod:`.agent`, needs ``nemo-gym``) and the Gym root shipped with
it, ``root/`` (``environments/polar_*`` and ``responses_api_agents/polar_agent``). Point Gym at it with
``NEMO_GYM_EXTRA_ROOTS=$(polar gym-root)`` and the environments resolve by name through Gym's own discovery."""

from __future__ import annotations

import json
from pathlib import Path

# The Gym environments, one per Polar env (conf/env/<name>.yaml) of the same name.
ENVIRONMENTS = (
    "polar_claude_code",
    "polar_cline",
    "polar_codex",
    "polar_copilot",
    "polar_gemini_cli",
    "polar_hermes",
    "polar_mini_swe_agent",
    "polar_opencode",
    "polar_openhands_sdk",
    "polar_pi",
    "polar_qwen_code",
)


def gym_root() -> Path:
    return Path(__file__).resolve().with_name("root")


def agent_name(env: str) -> str:
    """The agent server instance an environment's config defines (what ``agent_ref.name`` routes to)."""
    return f"{env}_agent"


def write_example_data(root: Path | None = None) -> list[Path]:
    """Regenerate every environment's ``data/example.jsonl`` (rows for its agent) and ``data/example_tasks.jsonl``
    (the same as materialized tasks, for its native server) from the bundled instances."""
    from nemo_polar.env.gym.rows import example_rows, example_tasks

    written = []
    for env in ENVIRONMENTS:
        data = (root or gym_root()) / "environments" / env / "data"
        data.mkdir(parents=True, exist_ok=True)
        for name, rows in (
            ("example", example_rows(agent_name(env))),
            ("example_tasks", example_tasks(env, agent_name(env))),
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


def write_variants(root: Path | None = None) -> list[Path]:
    """Regenerate every environment's ``scripted.yaml``."""
    written = []
    for env in ENVIRONMENTS:
        path = (root or gym_root()) / "environments" / env / "scripted.yaml"
        path.write_text(scripted_variant(env))
        written.append(path)
    return written
