"""Gym dataset rows <-> SWE instances: reading any shape of Gym's SWE rows is
:mod:`nemo_polar.rewards.gym_rows` (also used by ``polar rollout``); here, the example rows the environments ship
(the bundled instances as SWE-bench publishes rows: list fields as JSON strings, no local paths). Nothing here
imports nemo-gym.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from nemo_polar.rewards.gym_rows import RowError, instance_from_row, instruction, validation_message
from nemo_polar.rewards.instance import SWEInstance, bundled_instances

__all__ = [
    "SHAPES",
    "RowError",
    "Shape",
    "example_row",
    "example_rows",
    "instance_from_row",
    "instruction",
    "split_rows",
    "validation_message",
]


Shape = Literal["polar", "swe_agents", "anyswe"]
SHAPES: tuple[Shape, ...] = ("polar", "swe_agents", "anyswe")


def example_row(
    instance: SWEInstance, agent_name: str, shape: Shape = "polar", dataset_name: str = "nemo-polar/bundled"
) -> dict[str, Any]:
    """A Gym row for an instance, as SWE-bench ships it (list fields as JSON strings, no local paths), in one of the
    shapes of :mod:`nemo_polar.rewards.gym_rows`: ours (fields at the top level, the task text as the user input),
    Gym's swe_agents (the same plus Gym's metadata, ``input: []``) or Gym's anyswe (everything in the metadata)."""
    fields: dict[str, Any] = {
        "instance_id": instance.instance_id,
        "repo": instance.repo,
        "base_commit": instance.base_commit,
        "version": instance.version,
        "problem_statement": instance.problem_statement,
        "patch": instance.patch,
        "test_patch": instance.test_patch,
        "FAIL_TO_PASS": json.dumps(instance.FAIL_TO_PASS),
        "PASS_TO_PASS": json.dumps(instance.PASS_TO_PASS),
    }
    fields = {k: v for k, v in fields.items() if v is not None}
    agent_ref = {"type": "responses_api_agents", "name": agent_name}
    if shape == "polar":
        params = {"input": [{"role": "user", "content": instance.problem_statement}]}
        return {"responses_create_params": params, "agent_ref": agent_ref, **fields}
    metadata = {
        "instance_id": instance.instance_id,
        "dataset_name": dataset_name,
        "split": "test",
        "problem_statement": instance.problem_statement,
        "instance_dict": json.dumps(fields),
    }
    if shape == "anyswe":
        return {"responses_create_params": {"input": [], "metadata": metadata}, "agent_ref": agent_ref}
    extra = {"base_commit": instance.base_commit, "golden_patch": instance.patch}
    metadata |= {k: v for k, v in extra.items() if v is not None}  # Gym's metadata holds strings only
    return {"responses_create_params": {"input": [], "metadata": metadata}, "agent_ref": agent_ref, **fields}


def example_rows(agent_name: str, shape: Shape = "polar") -> list[dict[str, Any]]:
    return [example_row(inst, agent_name, shape) for inst in bundled_instances()]


# The splits Gym's one-step collection accepts (``gym eval run --split``) for Gym's train and validation dataset types.
Split = Literal["train", "validation"]
SPLITS: tuple[Split, ...] = ("train", "validation")


def split_of(index: int) -> Split:
    """Every fourth bundled instance in id order is held out for validation (3 of 12), the rest train."""
    return "validation" if index % 4 == 3 else "train"


def split_rows(agent_name: str, split: Split) -> list[dict[str, Any]]:
    """The bundled instances of one split, as rows for the agent (disjoint splits; together the example rows)."""
    rows = sorted(example_rows(agent_name), key=lambda row: row["instance_id"])
    return [row for i, row in enumerate(rows) if split_of(i) == split]


def example_tasks(env: str, agent_name: str) -> list[dict[str, Any]]:
    """The example rows as materialized tasks of the taskset ``env``, the form Gym's rollout collection sends to a
    native environment server (``{"task_id": {"taskset", "task_id"}, "task_input": <row>}``; the route to the
    server is ``environment_server_routes``, not the row's)."""
    tasks = []
    for row in example_rows(agent_name):
        task_input = {k: v for k, v in row.items() if k != "agent_ref"}
        tasks.append({"task_id": {"taskset": env, "task_id": row["instance_id"]}, "task_input": task_input})
    return tasks
