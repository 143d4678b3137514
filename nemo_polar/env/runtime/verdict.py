"""Whether an episode is trained on, decided once for every way an episode runs (the gateway's stages, a direct
episode, the Gym agent, ``PolarEnv.collect``): one :class:`Verdict` with a typed ``kind``, so that metrics, NeMo Gym
``failure_kind`` and callers group by the kind and never by the wording of a reason.

The order of :func:`judge` is the order of trust: a session that did not complete, an ungraded or untrustworthy
grade, then the reconstruction (a main chain to train on, in one piece if asked), then the policy versions.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from nemo_polar.env.runtime.session import SessionResult
from nemo_polar.reconstruct.builders import BuildResult
from nemo_polar.reconstruct.trace import Trace
from nemo_polar.rewards.grader import GradeResult

VerdictKind = Literal[
    "trainable",
    # the attempt did not finish its stages
    "cancelled",  # by the caller or a GRPO group that had enough results
    "init_failed",  # the workspace or the grader's sandbox could not be prepared
    "run_failed",  # running the harness raised (not the CLI failing: the machinery around it)
    "budget_exceeded",  # the session budget ran out between stages
    "gateway_failed",  # the gateway running it died (past re-dispatch) or raised
    # the harness session did not complete
    "timeout",
    "harness_error",
    "proxy_unreachable",
    # the grade cannot be trusted
    "evaluation_failed",
    "grade_tests_timeout",
    "grade_infra_failure",
    # the tokens cannot be trained on as they are
    "reconstruction_failed",
    "no_main_chain",
    "main_chain_broken",
    "cross_version",
]

# NeMo Gym's failure vocabulary (nemo_gym/failure_kinds.py, nemo-gym 0.7.0): its registered names where one fits,
# else the "<server>:<kind>" form it asks environments to use.
GYM_FAILURE_KINDS: dict[VerdictKind, str] = {
    "cancelled": "cancelled",
    "timeout": "agent_timeout",
    "harness_error": "agent_run_error",
    "proxy_unreachable": "transport_unreachable",
    "evaluation_failed": "verifier_error",
}


class Verdict(BaseModel):
    kind: VerdictKind
    reason: str | None = Field(default=None, description="for people: what happened, with the details")
    reward: float | None = Field(default=None, description="the grade's reward; None when nothing was graded")

    @property
    def trainable(self) -> bool:
        return self.kind == "trainable"

    @property
    def mask_sample(self) -> bool:
        return not self.trainable

    @property
    def gym_failure_kind(self) -> str | None:
        if self.trainable:
            return None
        return GYM_FAILURE_KINDS.get(self.kind, f"polar:{self.kind}")


class VerdictPolicy(BaseModel):
    """The choices a user makes about what is trainable."""

    cross_version: Literal["keep", "mask"] = Field(
        default="keep", description="sessions whose calls span policy versions: keep (importance-correct) or mask"
    )
    on_timeout: Literal["mask", "grade"] = Field(
        default="mask",
        description="a session that ran out of its time: mask it, or grade the workspace it left and train on that "
        "(the patch is the patch; SWE-agent autosubmits the same way when an agent exceeds its total execution time: "
        "sweagent/agent/agents.py attempt_autosubmission_after_error, commit 3ea751c0)",
    )
    mask_main_chain_breaks: bool = Field(
        default=False,
        description="mask an episode whose main chain broke into segments: a consumer that takes only the first "
        "segment (a NeMo Gym result) does not cover the trajectory the reward grades",
    )

    def grades(self, session: SessionResult) -> bool:
        """Whether the session's workspace is graded: it completed, or it timed out under ``on_timeout: grade``."""
        return session.status == "completed" or (session.status == "timeout" and self.on_timeout == "grade")


def judge(
    session: SessionResult, grade: GradeResult | None, build: BuildResult, main: list[Trace], policy: VerdictPolicy
) -> Verdict:
    """The verdict on a session that ran: ``main`` are its main-chain traces in segment order."""
    if not policy.grades(session):
        reason = f"harness session {session.status}: {session.error or session.status}"
        return Verdict(kind=session.status, reason=reason)
    if grade is None:
        return Verdict(kind="evaluation_failed", reason="the session completed but its patch was not graded")
    if grade.mask_sample:
        status = grade.status if grade.status in ("tests_timeout", "infra_failure") else "infra_failure"
        kind = "grade_tests_timeout" if status == "tests_timeout" else "grade_infra_failure"
        return Verdict(kind=kind, reason=grade.reason or grade.status, reward=grade.reward)
    if not main or not main[0].trainable_tokens:
        failed = len(build.failed_call_ids)
        reason = f"no completed model call to train on ({session.calls} calls, {failed} failed)"
        return Verdict(kind="no_main_chain", reason=reason, reward=grade.reward)
    if policy.mask_main_chain_breaks and len(main) > 1:
        reasons = ", ".join(sorted({t.break_reason or "unknown" for t in main[1:]}))
        reason = f"the main chain broke into {len(main)} segments ({reasons})"
        return Verdict(kind="main_chain_broken", reason=reason, reward=grade.reward)
    spanning = cross_version(build, policy, grade.reward)
    reason = grade.reason
    if session.status == "timeout":  # graded as it was left (on_timeout: grade)
        reason = "; ".join(filter(None, [f"timed out, graded as left: {session.error or 'timeout'}", reason]))
    return spanning or Verdict(kind="trainable", reason=reason, reward=grade.reward)


def cross_version(build: BuildResult, policy: VerdictPolicy, reward: float | None) -> Verdict | None:
    """The cross-version rule: a session whose calls span policy versions is masked when the policy says so."""
    versions = policy_versions(build)
    if policy.cross_version == "mask" and len(versions) > 1:
        return Verdict(kind="cross_version", reason=f"calls span policy versions {versions}", reward=reward)
    return None


def policy_versions(build: BuildResult) -> list[int]:
    return sorted({v for t in build.traces for v in t.policy_versions if v is not None})
