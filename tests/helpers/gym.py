"""The Polar agent as Gym builds it (its server class over a mocked ServerClient) and the episode request Gym's
rollout collection posts to an environment server."""

from __future__ import annotations

from typing import Any
from unittest.mock import MagicMock

from nemo_gym.server_utils import ServerClient

from nemo_polar.env.gym import agent_name
from nemo_polar.env.gym.agent import PolarAgent, PolarAgentConfig


def make_agent(env: str = "polar_pi", **config: Any) -> PolarAgent:
    cfg = PolarAgentConfig(host="127.0.0.1", port=0, entrypoint="app.py", name=agent_name(env), env=env, **config)
    return PolarAgent(config=cfg, server_client=MagicMock(spec=ServerClient))


def episode_request(row: dict[str, Any], rollout_id: str = "r1", attempt: int = 0) -> dict[str, Any]:
    """What Gym's rollout collection posts for a materialized task: its own ``_episode_request_body``."""
    from nemo_gym.rollout_collection import _episode_request_body

    task_id = {"taskset": "polar_pi", "task_id": row.get("instance_id", "t")}
    task = {"task_id": task_id, "task_input": row, "_ng_rollout_id": rollout_id, "_ng_attempt_index": attempt}
    return _episode_request_body(task)
