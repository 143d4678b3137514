"""A SWE-bench predictions file against its instances: the rows read, each paired with its instance, the graded
results summed up. What ``polar grade`` runs around :func:`~nemo_polar.rewards.grader.grade_many`."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from nemo_polar.rewards.grader import GradeResult, Prediction
from nemo_polar.rewards.instance import SWEInstance


def read_predictions(path: Path) -> list[Prediction]:
    """``{instance_id, model_patch}`` rows from a JSON array or JSONL."""
    text = path.read_text()
    if text.lstrip().startswith("["):
        rows = json.loads(text)
    else:
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    return [Prediction.model_validate(r) for r in rows]


def pair_predictions(
    instances: Iterable[SWEInstance], predictions: list[Prediction]
) -> list[tuple[SWEInstance, str | None]]:
    """Each prediction with its instance, in the predictions' order; a ValueError names (up to ten) unknown ids."""
    by_id = {inst.instance_id: inst for inst in instances}
    if unknown := [p.instance_id for p in predictions if p.instance_id not in by_id]:
        raise ValueError(f"predictions for unknown instances: {', '.join(unknown[:10])}")
    return [(by_id[p.instance_id], p.model_patch) for p in predictions]


def grade_summary(results: list[GradeResult]) -> dict[str, Any]:
    """Instances graded, resolved and masked, and how many ended in each status."""
    statuses: dict[str, int] = {}
    for r in results:
        statuses[r.status] = statuses.get(r.status, 0) + 1
    return {
        "instances": len(results),
        "resolved": sum(r.resolved for r in results),
        "masked": sum(r.mask_sample for r in results),
        "by_status": statuses,
    }
