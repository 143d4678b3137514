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
    """Regenerate every environment's ``data/example.jsonl`` from the bundled instances."""
    from nemo_polar.env.gym.rows import example_rows

    written = []
    for env in ENVIRONMENTS:
        path = (root or gym_root()) / "environments" / env / "data" / "example.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(row) + "\n" for row in example_rows(agent_name(env))))
        written.append(path)
    return written
