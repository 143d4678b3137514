"""Datasets of instances, whatever form they come in: ``'bundled'``, a SWE-bench 5 task repo or task directory,
SWE-bench 5 rows (JSONL, local Hugging Face dataset files), or NeMo Gym's rows in any of its SWE shapes
(:mod:`nemo_polar.rewards.gym_rows`). What ``polar rollout``, ``polar generate`` and ``polar grade`` read."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from nemo_polar.rewards.gym_rows import instance_from_row, is_gym_row
from nemo_polar.rewards.instance import (
    SWEInstance,
    bundled_instances,
    is_task_dir,
    load_task_repo,
    read_rows,
    validate_row,
)


def load_rows(path: Path, split: str = "test", container_formatter: str | list[str] | None = None) -> list[SWEInstance]:
    """Instances from :func:`read_rows`; ``repo_path`` may be relative to the file. Errors name file and row. NeMo
    Gym's rows (any of its SWE shapes, :mod:`nemo_polar.rewards.gym_rows`) are read as Gym's agents read them,
    ``container_formatter`` naming the images of those that name none."""
    return [
        instance_from_row(row, container_formatter=container_formatter, where=where)
        if is_gym_row(row)
        else validate_row(where, row, path.parent)
        for where, row in read_rows(path, split)
    ]


def load_instances(path: Path, container_formatter: str | list[str] | None = None) -> list[SWEInstance]:
    if path.is_dir() and is_task_dir(path):
        return load_task_repo(path)
    return load_rows(path, container_formatter=container_formatter)


def select_instances(
    source: str | Path,
    instance_ids: Sequence[str] | None = None,
    limit: int | None = None,
    container_formatter: str | list[str] | None = None,
) -> list[SWEInstance]:
    """``"bundled"`` or anything :func:`load_instances` reads; then only ``instance_ids`` (in that order) and/or the
    first ``limit``. Unknown ids and an empty selection are errors naming the problem."""
    bundled = str(source) == "bundled"
    instances = bundled_instances() if bundled else load_instances(Path(source), container_formatter)
    if instance_ids:
        by_id = {i.instance_id: i for i in instances}
        unknown = [i for i in instance_ids if i not in by_id]
        if unknown:
            raise ValueError(f"{source}: unknown instance ids: {', '.join(unknown)}")
        instances = [by_id[i] for i in instance_ids]
    instances = instances[:limit] if limit else instances
    if not instances:
        raise ValueError(f"{source} holds no instances")
    return instances
