"""The direct Python API for users outside NeMo Gym: ``PolarEnv(config).collect(instances, n_samples)``.

Every instance is attempted ``n_samples`` times through a rollout gateway (staged INIT/READY/RUN/POSTRUN pools,
graded by swebench in a prewarmed fresh sandbox). The attempts of one instance form a GRPO group: rewards of the
unmasked attempts give each session one advantage (the session, not the trace, is the unit), carried to every trace
its records reconstruct into. Masked attempts (infrastructure failures, timeouts, cancelled stragglers) keep their
traces for inspection but get neither reward nor advantage.

Attempts are durable: the gateway's state directory keeps each finished attempt's outcome, so calling ``collect``
again with the same ``state_dir`` returns finished attempts without running them again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, computed_field, field_validator, model_validator

from nemo_polar.env.gateway import Gateway, GatewayConfig, SessionOutcome, SessionRequest
from nemo_polar.env.runtime.attempt import AttemptDir
from nemo_polar.env.specs import EnvOverrides, PolarEnvSpec, resolve_env
from nemo_polar.proxy.http.client import ProxyClient
from nemo_polar.proxy.http.pool import ProxyPool
from nemo_polar.proxy.store.records import CallRecord
from nemo_polar.reconstruct.builders import BuilderConfig, per_request, prefix_merging
from nemo_polar.reconstruct.trace import Trace
from nemo_polar.rewards.advantages import assign, group_advantages
from nemo_polar.rewards.instance import SWEInstance

BUILDERS = {"prefix_merging": prefix_merging, "per_request": per_request}


class PolarEnvConfig(BaseModel):
    """Validated as given in Python, or straight from ``polar rollout``'s composed Hydra config (``conf/rollout.yaml``
    has the same keys): there ``env`` is the composed env group, ``runtime`` and ``builder`` their groups."""

    env: str | PolarEnvSpec = Field(
        default="polar_pi", description="a Polar env (conf/env/<name>.yaml, or as composed): harness and session"
    )
    proxy: ProxyClient | ProxyPool = Field(
        description="the proxy in front of the policy engine, or a pool of proxy workers (`polar proxy --workers`)"
    )
    state_dir: Path = Field(description="gateway state: one directory per attempt (records, patch, outcome)")
    runtime: Literal["bwrap", "docker", "local"] = "bwrap"
    scripted: bool = Field(default=False, description="drive the CLI with each instance's scripted policy turns")
    builder: Literal["prefix_merging", "per_request"] = "prefix_merging"
    builder_config: BuilderConfig = Field(default_factory=BuilderConfig)
    gateway: dict[str, Any] = Field(
        default_factory=dict, description="GatewayConfig fields: pools, budgets, cross_version, callback_url"
    )
    early_stop: int | None = Field(
        default=None, ge=1, description="stop an instance's stragglers once this many trainable attempts finished"
    )
    scale_by_std: bool = Field(default=False, description="divide group advantages by the group's std (GRPO)")
    harness_options: dict[str, Any] = Field(default_factory=dict, description="merged over the env's")
    session: dict[str, Any] = Field(default_factory=dict, description="proxy SessionConfig fields over the env's")

    @model_validator(mode="before")
    @classmethod
    def _hydra_groups(cls, data: Any) -> Any:
        """Hydra's groups are mappings with a ``name``: ``runtime: {name: bwrap}``, ``builder: {name, <config>}``."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if isinstance(data.get("runtime"), dict):
            data["runtime"] = data["runtime"].get("name")
        if isinstance(data.get("builder"), dict):
            builder = dict(data["builder"])
            data["builder"] = builder.pop("name", "prefix_merging")
            data["builder_config"] = {**builder, **(data.get("builder_config") or {})}
        return data

    @field_validator("env")
    @classmethod
    def _known_env(cls, env: str | PolarEnvSpec) -> str | PolarEnvSpec:
        resolve_env(env)  # an unknown env name fails here, naming the known ones
        return env

    def model_post_init(self, context: Any) -> None:
        self.spec()  # bad overrides fail here
        self.gateway_config()  # bad gateway fields too

    def spec(self) -> PolarEnvSpec:
        """The env with this config's overrides."""
        overrides = EnvOverrides(harness_options=self.harness_options, session=self.session)
        return resolve_env(self.env, overrides)

    def gateway_config(self) -> GatewayConfig:
        return GatewayConfig(state_dir=self.state_dir, runtime=self.runtime, **self.gateway)


class Sample(BaseModel):
    """One attempt: the gateway's outcome, the traces its records reconstruct into, reward and advantage."""

    request_id: str
    instance_id: str
    index: int
    outcome: SessionOutcome
    traces: list[Trace] = Field(default_factory=list)
    records: list[CallRecord] = Field(default_factory=list, exclude=True, description="the calls the traces cover")
    advantage: float | None = None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def trainable(self) -> bool:
        return self.outcome.status == "published" and self.outcome.verdict.trainable

    @computed_field  # type: ignore[prop-decorator]
    @property
    def reward(self) -> float | None:
        return self.outcome.reward if self.trainable else None


class Group(BaseModel):
    """The attempts of one instance: a GRPO group."""

    instance_id: str
    samples: list[Sample]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def mean_reward(self) -> float | None:
        rewards = [s.reward for s in self.samples if s.reward is not None]
        return sum(rewards) / len(rewards) if rewards else None


def request_id(instance_id: str, index: int) -> str:
    return f"{instance_id}.s{index}"


class PolarEnv:
    """Collect rewarded, reconstructed rollouts of a real coding CLI on SWE instances."""

    def __init__(self, config: PolarEnvConfig) -> None:
        self.config = config
        self.spec = config.spec()

    def requests(self, instances: Iterable[SWEInstance], n_samples: int) -> list[SessionRequest]:
        if n_samples < 1:
            raise ValueError(f"n_samples must be at least 1, got {n_samples}")
        c, spec = self.config, self.spec
        out = []
        for inst in instances:
            if c.scripted and not inst.script:
                raise ValueError(f"{inst.instance_id}: scripted collection needs an instance with a script")
            for k in range(n_samples):
                out.append(
                    SessionRequest(
                        request_id=request_id(inst.instance_id, k),
                        harness=spec.harness,
                        harness_options=spec.harness_options,
                        instance=inst,
                        scripted=c.scripted,
                        session_config=spec.session,
                        group_id=inst.instance_id,
                        group_needed=c.early_stop,
                    )
                )
        ids = [r.request_id for r in out]
        if len(set(ids)) != len(ids):
            raise ValueError("instance ids must be unique within one collection")
        return out

    async def acollect(
        self,
        instances: Iterable[SWEInstance],
        n_samples: int = 1,
        on_sample: Callable[[Sample], None] | None = None,
    ) -> list[Group]:
        instances = list(instances)
        requests = self.requests(instances, n_samples)
        indices = [k for _ in instances for k in range(n_samples)]  # the order requests() makes them in
        samples: dict[str, Sample] = {}
        async with Gateway(self.config.gateway_config(), self.config.proxy) as gateway:

            async def one(req: SessionRequest, index: int) -> None:
                outcome = await (await gateway.submit(req))
                sample = self._sample(req, index, outcome)
                samples[req.request_id] = sample
                if on_sample is not None:
                    on_sample(sample)

            await asyncio.gather(*(one(r, k) for r, k in zip(requests, indices, strict=True)))
        groups = []
        for inst in instances:
            members = [samples[request_id(inst.instance_id, k)] for k in range(n_samples)]
            self._advantages(members)
            groups.append(Group(instance_id=inst.instance_id, samples=members))
        return groups

    def collect(self, instances: Iterable[SWEInstance], n_samples: int = 1, **kw: Any) -> list[Group]:
        return asyncio.run(self.acollect(instances, n_samples, **kw))

    def _sample(self, req: SessionRequest, index: int, outcome: SessionOutcome) -> Sample:
        records = AttemptDir(self.config.state_dir / req.request_id).read_records()
        traces = BUILDERS[self.config.builder](records, self.config.builder_config).traces if records else []
        return Sample(
            request_id=req.request_id,
            instance_id=req.instance.instance_id,
            index=index,
            outcome=outcome,
            traces=traces,
            records=records,
        )

    def _advantages(self, members: list[Sample]) -> None:
        """One GRPO group: advantages over its trainable attempts, each carried to all of that attempt's traces."""
        rewards = {s.request_id: s.reward for s in members if s.reward is not None}
        advantages = group_advantages(rewards, scale_by_std=self.config.scale_by_std)  # type: ignore[arg-type]
        for s in members:
            if s.reward is None:
                continue
            s.advantage = advantages[s.request_id]
            sessions = {t.session_id for t in s.traces}
            assign(s.traces, dict.fromkeys(sessions, s.reward), dict.fromkeys(sessions, s.advantage))
