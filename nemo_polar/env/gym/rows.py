"""Gym dataset rows <-> SWE instances.

A row is ``{"responses_create_params": {...}, "agent_ref": {...}, <SWE-bench instance fields>}``. The user text of
``responses_create_params`` is the instruction the CLI gets (it replaces ``problem_statement``); the instance
fields are SWE-bench's own (``FAIL_TO_PASS``/``PASS_TO_PASS`` may be JSON strings, as in the Hugging Face
datasets). The environment comes from the row's ``image`` (a SWE-bench 5 row), or ``repo_path`` (+ ``python_env``),
or, when the row has neither, from the bundled instance with the row's ``instance_id``. Nothing here imports
nemo-gym.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from nemo_polar.rewards.instance import SWEInstance, bundled_instances

INSTANCE_FIELDS = frozenset(SWEInstance.model_fields)
# What a row must say about the task itself; the environment may come from a bundled instance.
REQUIRED_WITHOUT_BUNDLE = ("repo", "problem_statement", "FAIL_TO_PASS")
PATH_FIELDS = ("repo_path", "python_env")


class RowError(ValueError):
    """A row the agent cannot run; the message names the problem (the agent answers it with a 422)."""


def instruction(params: Mapping[str, Any]) -> str:
    """The task text of ``responses_create_params``: ``input`` as a string, or the text of its user messages
    (``instructions``, if any, first)."""
    raw = params.get("input")
    texts: list[str] = []
    if isinstance(raw, str):
        texts.append(raw)
    elif isinstance(raw, list):
        for item in raw:
            if isinstance(item, Mapping) and item.get("role") == "user":
                texts.append(_content_text(item.get("content")))
    text = "\n\n".join(t for t in texts if t.strip())
    if not text.strip():
        raise RowError("responses_create_params.input has no user text: it must carry the task instruction")
    head = params.get("instructions")
    return f"{head}\n\n{text}" if isinstance(head, str) and head.strip() else text


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, Mapping) and part.get("type") in ("input_text", "text", "output_text")
        )
    return ""


def validation_message(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'row'}: {e['msg']}" for e in exc.errors())


def instance_from_row(row: Mapping[str, Any], task_text: str) -> SWEInstance:
    """The instance a row describes, with ``task_text`` as its problem statement. Raises :class:`RowError`."""
    fields = {k: v for k, v in row.items() if k in INSTANCE_FIELDS and v is not None}
    instance_id = fields.get("instance_id")
    if not isinstance(instance_id, str) or not instance_id:
        raise RowError("the row has no instance_id (a SWE-bench instance field)")
    for key in PATH_FIELDS:
        if key in fields:
            path = Path(str(fields[key]))
            if not path.is_absolute():
                raise RowError(f"{instance_id}: {key} must be an absolute path, got {fields[key]!r}")
            if not path.exists():
                raise RowError(f"{instance_id}: {key} {path} does not exist on the agent's host")
    base: dict[str, Any] = {}
    if "repo_path" not in fields and "image" not in fields:
        bundled = {i.instance_id: i for i in bundled_instances()}
        if instance_id not in bundled:
            raise RowError(
                f"{instance_id}: the row has no image, no repo_path and {instance_id!r} is not a bundled instance "
                f"(bundled: {', '.join(sorted(bundled))})"
            )
        base = bundled[instance_id].model_dump(exclude_none=True)
    else:
        missing = [k for k in REQUIRED_WITHOUT_BUNDLE if k not in fields]
        if missing:
            raise RowError(f"{instance_id}: missing SWE-bench instance field(s): {', '.join(missing)}")
    try:
        return SWEInstance.model_validate({**base, **fields, "problem_statement": task_text})
    except ValidationError as exc:
        raise RowError(f"{instance_id}: not a valid SWE-bench instance: {validation_message(exc)}") from None
    except ValueError as exc:  # e.g. a field validator's JSON error raised outside pydantic's wrapping
        raise RowError(f"{instance_id}: not a valid SWE-bench instance: {exc}") from None


def example_row(instance: SWEInstance, agent_name: str) -> dict[str, Any]:
    """A Gym row for a bundled instance, as SWE-bench ships it (list fields as JSON strings, no local paths)."""
    row: dict[str, Any] = {
        "responses_create_params": {"input": [{"role": "user", "content": instance.problem_statement}]},
        "agent_ref": {"type": "responses_api_agents", "name": agent_name},
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
    return {k: v for k, v in row.items() if v is not None}


def example_rows(agent_name: str) -> list[dict[str, Any]]:
    return [example_row(inst, agent_name) for inst in bundled_instances()]
