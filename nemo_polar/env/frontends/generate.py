"""Offline SFT data by rejection sampling (``polar generate``): a harness attempts every instance N times through
the rollout gateway, swebench grades each final patch in a fresh sandbox, and only sessions that resolve the
instance (FAIL_TO_PASS and PASS_TO_PASS all pass) are kept. The kept sessions' traces (main chain and subagents;
side calls such as title generation are left out) are exported as SFT rows — chat messages beside the exact token
ids, loss masks and logprobs — to JSONL and Parquet, with acceptance statistics like the Polar paper's (504 of
1,638 attempts accepted, 30.8%).

Attempts are durable in ``OUT/sessions``: re-running the same command skips every finished attempt and rebuilds
the dataset from all of them, so an interrupted run loses only the attempts that were still in flight.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from omegaconf import DictConfig
from pydantic import BaseModel, Field

from nemo_polar.env.frontends.rollout import dataset_instances, engine_url, env_config, output_dir, proxy_client
from nemo_polar.env.polar_env import Group, PolarEnv, PolarEnvConfig, Sample
from nemo_polar.progress import AttemptsProgress
from nemo_polar.reconstruct.export import sft_rows, write_jsonl, write_parquet
from nemo_polar.rewards.instance import SWEInstance

KEPT_ROLES = ("main", "subagent")


class InstanceStats(BaseModel):
    attempted: int = 0
    accepted: int = 0
    masked: int = 0


class AcceptanceStats(BaseModel):
    env: str
    harness: str
    attempted: int
    accepted: int
    rejected: int = Field(description="graded and not resolved")
    masked: int = Field(description="no trustworthy grade: infrastructure failure, timeout, cancelled")
    acceptance_rate: float = Field(description="accepted / attempted")
    rows: int = Field(description="SFT rows exported (traces of the accepted sessions)")
    per_instance: dict[str, InstanceStats]
    outputs: dict[str, Path]


def accepted(sample: Sample) -> bool:
    grade = sample.outcome.grade
    return sample.trainable and grade is not None and grade.resolved


def generate(
    config: PolarEnvConfig,
    instances: list[SWEInstance],
    attempts: int,
    out: Path,
    progress: AttemptsProgress | None = None,
) -> AcceptanceStats:
    """Attempt, grade, keep what resolves, export. ``config.state_dir`` should be ``out / "sessions"``."""
    env = PolarEnv(config)
    if progress is not None:
        progress.start(len(instances) * attempts)
    groups = env.collect(instances, attempts, on_sample=progress)
    return export_accepted(env, groups, out)


def export_accepted(env: PolarEnv, groups: list[Group], out: Path) -> AcceptanceStats:
    per_instance: dict[str, InstanceStats] = {}
    rows = []
    for group in groups:
        stats = per_instance.setdefault(group.instance_id, InstanceStats())
        for sample in group.samples:
            stats.attempted += 1
            stats.masked += sample.reward is None
            if not accepted(sample):
                continue
            stats.accepted += 1
            meta = {
                "env": env.spec.name,
                "harness": env.spec.harness,
                "instance_id": sample.instance_id,
                "request_id": sample.request_id,
                "attempt": sample.index,
            }
            kept = [t for t in sample.traces if t.role in KEPT_ROLES]
            rows += sft_rows(kept, sample.records, dict.fromkeys({t.session_id for t in kept}, meta))
    totals = Counter[str]()
    for s in per_instance.values():
        totals.update(s.model_dump())
    outputs = {"jsonl": out / "sft.jsonl", "parquet": out / "sft.parquet", "stats": out / "acceptance.json"}
    write_jsonl(rows, outputs["jsonl"])
    write_parquet(rows, outputs["parquet"])
    report = AcceptanceStats(
        env=env.spec.name,
        harness=env.spec.harness,
        attempted=totals["attempted"],
        accepted=totals["accepted"],
        rejected=totals["attempted"] - totals["accepted"] - totals["masked"],
        masked=totals["masked"],
        acceptance_rate=totals["accepted"] / totals["attempted"] if totals["attempted"] else 0.0,
        rows=len(rows),
        per_instance=per_instance,
        outputs=outputs,
    )
    outputs["stats"].write_text(json.dumps(report.model_dump(mode="json"), indent=2))
    return report


def dataset_of(cfg: DictConfig) -> list[SWEInstance]:
    """The composed config's dataset, read (before anything starts: a bad row stops the run here)."""
    if cfg.get("dataset") is None:
        raise ValueError("give a dataset: dataset=bundled, or dataset=swebench dataset.path=FILE")
    return dataset_instances(cfg.dataset)


def generate_dataset(
    cfg: DictConfig, instances: list[SWEInstance], progress: AttemptsProgress | None = None
) -> AcceptanceStats:
    """``polar generate``'s composed config (``conf/generate.yaml``: rollout.yaml's keys) run: ``n_samples``
    attempts of each instance, through the engine or running proxy the config names."""
    out = output_dir(cfg, cfg.dataset.name)
    with engine_url(cfg) as engine, proxy_client(cfg, engine, out / "proxy") as proxy:
        return generate(env_config(cfg, proxy, out / "sessions"), instances, int(cfg.n_samples), out, progress)
