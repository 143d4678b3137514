"""The files of each Gym environment under ``root/environments/<env>/`` that follow from its harness's declaration
(``config.yaml``, ``README.md``), and :func:`regenerate`, which rewrites every derived file of the Gym root and of
``conf/env`` from the registry: ``python -m nemo_polar.env.gym.files`` (``make generate``). Gym and Hydra read these
files from disk, so they are checked in; tests/test_harness_registry.py checks them equal to what this writes."""

from __future__ import annotations

from pathlib import Path

import yaml

from nemo_polar.env.gym import agent_name, datasets, gym_root, write_data, write_variants
from nemo_polar.env.harness import HARNESSES, Harness
from nemo_polar.env.specs import write_env_files


def config_yaml(harness: type[Harness]) -> str:
    """``config.yaml``: the environment's Polar agent, its ``legacy_agent`` relay and its native environment server,
    with the values the harness's ``gym`` declares."""
    env, g = harness.env_name(), harness.gym
    agent, native = agent_name(env), f"{env}_native"
    declared = yaml.safe_dump(datasets(env), sort_keys=False)
    serving = (
        f"      env: {env}\n"
        "      model: ${policy_model_name}\n"
        "      openai_base_url: ${policy_base_url}\n"
        f"      runtime: {g.runtime}\n"
        "      scripted: false\n"
        f"      timeout: {g.timeout}\n"
        f"      concurrency: {g.concurrency}\n"
    )
    return (
        f"# {g.title}, unchanged, on SWE-bench-style tasks through the Polar proxy (exact token ids), graded by "
        "swebench in\n# a fresh sandbox. `${policy_base_url}` is the policy engine (vLLM); the agent starts a Polar "
        "proxy in front of it.\n"
        f"# The harness and the proxy session config come from the Polar env `{env}` (conf/env/{env}.yaml).\n"
        f"{agent}:\n  responses_api_agents:\n    polar_agent:\n      entrypoint: app.py\n      domain: coding\n"
        f"      description: {g.title} on SWE tasks through the Polar token-recording proxy\n"
        f"{serving}      datasets:\n" + "".join(f"      {line}\n" for line in declared.splitlines()) + "\n"
        "# Rollout collection reaches an agent through an environment server (nemo-gym 0.7.0); legacy_agent relays "
        "/run.\n"
        f"{env}_environment_server:\n  environment_servers:\n    legacy_agent:\n      entrypoint: app.py\n"
        f"      agent_server:\n        type: responses_api_agents\n        name: {agent}\n\n"
        "# The same episodes as a native environment server (nemo-gym 0.7.0 BaseEnvironmentServer), for "
        "materialized tasks\n# ({task_id: {taskset, task_id}, task_input: <a row of data/example.jsonl>}) routed by "
        f"taskset:\n# `environment_server_routes: {{{env}: {native}}}`. Failures come back as episode failures "
        "(retryable or terminal).\n"
        f"{native}:\n  environment_servers:\n    polar_env:\n      entrypoint: app.py\n{serving}"
        f"      max_concurrent_episodes: {g.max_concurrent_episodes}\n"
        f"      queue_timeout_seconds: {g.queue_timeout_seconds}\n"
        f"      default_episode_timeout_seconds: {g.default_episode_timeout_seconds}\n"
        f"      cleanup_timeout_seconds: {g.cleanup_timeout_seconds}\n"
    )


def readme(harness: type[Harness]) -> str:
    """``README.md``: what the environment runs and how Gym finds it, its rows and its agent's settings."""
    env, g = harness.env_name(), harness.gym
    return (
        f"# {env}\n\n{g.agent} (harness `{harness.name}`, {g.api}) runs unchanged on a SWE task in a sandbox. Its "
        "model calls go\nthrough the Polar proxy, which records the exact prompt and sampled token ids; the patch it "
        "leaves is graded by\nswebench in a fresh sandbox (reward 1.0 if resolved, else 0.0). `/run` returns the main "
        "chain of model calls as\nprefix-contiguous token-bearing output items, with `mask_sample` set for timeouts, "
        "harness or infrastructure\nfailures and broken chains.\n\n"
        "Make the environment resolvable by name (nemo-gym 0.7.0):\n\n```bash\n"
        "export NEMO_GYM_EXTRA_ROOTS=$(polar gym-root)\ngym list environments\n```\n\n"
        "Rows (`data/example.jsonl`, built from the bundled instances) carry `responses_create_params` (the user text "
        "is\nthe instruction the CLI gets) and the SWE-bench instance fields (`instance_id, repo, base_commit,\n"
        "problem_statement, patch, test_patch, FAIL_TO_PASS, PASS_TO_PASS, version`). The environment comes from\n"
        "`repo_path` (+ `python_env`), absolute paths on the agent's host, or from the bundled instance with that\n"
        "`instance_id`. An optional `polar_env` runs a row in another Polar env.\n\n"
        "Agent settings (`config.yaml`): `runtime` (bwrap, docker, local), `scripted` (the instance's scripted "
        "policy, for\nthe tiny test models), `timeout`, `session` (proxy session config over the env's), `proxy_url` "
        "and\n`proxy_admin_url`/`proxy_admin_token` (a running `polar proxy`'s model and admin APIs instead of the "
        "in-process one), `work_dir`, `keep_sessions`, `concurrency`,\n`mask_main_chain_breaks`.\n"
    )


FILES = {"config.yaml": config_yaml, "README.md": readme}


def write_files(root: Path | None = None) -> list[Path]:
    """Regenerate every registered harness's ``config.yaml`` and ``README.md`` under the Gym root."""
    written = []
    for harness in HARNESSES.values():
        folder = (root or gym_root()) / "environments" / harness.env_name()
        folder.mkdir(parents=True, exist_ok=True)
        for name, render in FILES.items():
            (folder / name).write_text(render(harness))
            written.append(folder / name)
    return written


def regenerate() -> list[Path]:
    """Every file the registry derives: the Polar envs, and each Gym environment's files, variants and data."""
    return [*write_env_files(), *write_files(), *write_variants(), *write_data()]


if __name__ == "__main__":
    print(f"{len(regenerate())} files written")
