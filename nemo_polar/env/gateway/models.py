"""What goes in and out of a rollout gateway: its config, a session request, the outcome it publishes, and the
report of a restart."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, computed_field, field_validator

from nemo_polar.env.runtime.verdict import Verdict, VerdictPolicy
from nemo_polar.proxy.http.client import ProxyClient
from nemo_polar.rewards.grader import GradeResult
from nemo_polar.rewards.instance import SWEInstance

Stage = Literal["queued", "init", "ready", "run", "postrun", "done"]
LIVE_STAGES: tuple[Stage, ...] = ("queued", "init", "ready", "run", "postrun")
REQUEST_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class GatewayConfig(VerdictPolicy):
    """Pools, budgets and delivery; the :class:`VerdictPolicy` fields decide what is trainable."""

    state_dir: Path
    runtime: str = "bwrap"
    init_workers: int = Field(default=2, ge=1)
    run_slots: int = Field(default=4, ge=1)
    post_workers: int = Field(default=2, ge=1)
    ready_buffer: int = Field(default=4, ge=1)
    session_budget_s: float = Field(default=3600.0, gt=0)
    agent_budget_s: float = Field(default=1800.0, gt=0)
    callback_url: str | None = None
    callback_attempts: int = Field(default=5, ge=1)
    results_buffer: int = Field(
        default=1024,
        ge=1,
        description="outcomes kept in Gateway.results until taken; past that the oldest is dropped (it stays in its "
        "future, in outcome.json and with the callback)",
    )

    @property
    def policy(self) -> VerdictPolicy:
        return VerdictPolicy.model_validate(self.model_dump(include=set(VerdictPolicy.model_fields)))


class SessionRequest(BaseModel):
    request_id: str = Field(description="idempotency key; also names the session directory")
    harness: str
    harness_options: dict[str, Any] = Field(default_factory=dict)
    instance: SWEInstance
    scripted: bool = False
    session_config: dict[str, Any] = Field(default_factory=dict)
    group_id: str | None = None
    group_needed: int | None = Field(default=None, description="results that complete the group: stop stragglers")
    proxy: ProxyClient | None = Field(
        default=None, exclude=True, description="the proxy this session's CLI talks to; default: the gateway's"
    )

    @field_validator("request_id")
    @classmethod
    def _safe_id(cls, value: str) -> str:
        if not REQUEST_ID.match(value):
            raise ValueError(f"request_id {value!r} must match {REQUEST_ID.pattern}")
        return value


class SessionOutcome(BaseModel):
    """A finished request. ``status`` says how far the gateway took it (``published``: through its stages, whatever
    the verdict); the :class:`Verdict` says whether it is trained on and why."""

    request_id: str
    status: Literal["published", "cancelled", "failed"]
    verdict: Verdict
    session_status: str | None = None
    grade: GradeResult | None = None
    output: list[dict[str, Any]] = Field(default_factory=list, description="main chain as NeMo Gym output items")
    metrics: dict[str, Any] = Field(default_factory=dict)
    stage_times: dict[str, float] = Field(default_factory=dict, description="stage -> wall-clock time entered")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def reward(self) -> float | None:
        """The grade's reward (also of a masked episode that was graded); None when nothing was graded."""
        return self.verdict.reward

    @computed_field  # type: ignore[prop-decorator]
    @property
    def mask_sample(self) -> bool:
        return self.verdict.mask_sample

    @computed_field  # type: ignore[prop-decorator]
    @property
    def reason(self) -> str | None:
        return self.verdict.reason


class RecoveryReport(BaseModel):
    finished: list[str] = Field(default_factory=list)
    redelivered: list[str] = Field(default_factory=list)
    unfinished: dict[str, str] = Field(default_factory=dict, description="request id -> the stage it was in")
