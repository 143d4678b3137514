"""The demo's runs, without its console: each Polar environment's CLI on its harness's bundled task, through
:class:`~nemo_polar.env.polar_env.PolarEnv`, summarised as one row each (``make demo`` prints them; ``bench.families``
runs them for every model family)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from pydantic import BaseModel

from nemo_polar.env.harness import HARNESSES
from nemo_polar.env.polar_env import Group, PolarEnv, PolarEnvConfig
from nemo_polar.proxy.http.client import ProxyClient
from nemo_polar.reconstruct.audit import audit
from nemo_polar.rewards.instance import SWEInstance


def demo_tasks() -> dict[str, str]:
    """Each environment's bundled task (its harness's ``demo_task``: a different bug for each CLI), in ``order``."""
    return {h.env_name(): h.demo_task for h in HARNESSES.values()}


def __getattr__(name: str) -> dict[str, str]:
    # TASKS, read when asked: a harness registered after this import (a test's toy) has its task there.
    if name == "TASKS":
        return demo_tasks()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class DemoRow(BaseModel):
    env: str
    harness: str
    instance_id: str
    status: str
    calls: int
    traces: int
    trainable_tokens: int
    context_tokens: int
    breaks: int
    audit_ok: bool
    reward: float | None
    wall_s: float


def summarise(env: PolarEnv, group: Group, wall_s: float) -> DemoRow:
    [sample] = group.samples
    records = sample.records
    report = audit(sample.traces, records)
    trainable = sum(t.trainable_tokens for t in sample.traces)
    total = sum(len(t.prompt_ids) + len(t.response_ids) for t in sample.traces)
    return DemoRow(
        env=env.spec.name,
        harness=env.spec.harness,
        instance_id=group.instance_id,
        status=sample.outcome.session_status or sample.outcome.status,
        calls=len(records),
        traces=len(sample.traces),
        trainable_tokens=trainable,
        context_tokens=total - trainable,
        breaks=sum(1 for t in sample.traces if t.break_reason),
        audit_ok=report.ok,
        reward=sample.reward,
        wall_s=wall_s,
    )


async def run_all(proxy: ProxyClient, out: Path, instances: dict[str, SWEInstance]) -> list[DemoRow]:
    """Each environment's task, all at once, in the order of ``instances``."""

    async def one(name: str) -> DemoRow:
        config = PolarEnvConfig(
            env=name,
            proxy=proxy,
            state_dir=out / name,
            scripted=True,
            gateway={"run_slots": 1, "init_workers": 1, "post_workers": 1},
        )
        env = PolarEnv(config)
        t0 = time.monotonic()
        [group] = await env.acollect([instances[name]], 1)
        return summarise(env, group, time.monotonic() - t0)

    return list(await asyncio.gather(*(one(name) for name in instances)))
