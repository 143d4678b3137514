"""One episode on a SWE instance, as stage functions that the rollout gateway runs in its pools and
:func:`run_episode` runs in turn: :func:`prepare` (the task workspace and the grader's fresh sandbox, prewarmed),
:func:`run_harness` (the real CLI through a proxy session), :func:`grade` (swebench in that sandbox) and
:func:`conclude` (prefix merging, the :class:`~nemo_polar.env.runtime.verdict.Verdict`, the main chain as NeMo Gym
items).

Every stage writes into the attempt's :class:`~nemo_polar.env.runtime.attempt.AttemptDir`; an :class:`Episode` is what
they leave, the same whichever way the episode ran.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, Field

from nemo_polar.env.harness import Harness
from nemo_polar.env.harness.script import script_adapter
from nemo_polar.env.runtime.attempt import AttemptDir
from nemo_polar.env.runtime.session import SessionResult, run_session
from nemo_polar.env.runtime.verdict import Verdict, VerdictKind, VerdictPolicy, judge, policy_versions
from nemo_polar.proxy.http.client import ProxyClient
from nemo_polar.reconstruct.builders import BuildResult, prefix_merging
from nemo_polar.reconstruct.gym import check_contiguous, gym_output_items
from nemo_polar.reconstruct.io import write_traces
from nemo_polar.reconstruct.trace import Trace
from nemo_polar.rewards.grader import Evaluator, GradeResult
from nemo_polar.rewards.instance import SWEInstance
from nemo_polar.sandbox.workspace import prepare_workspace


class Grader(Protocol):
    """What the grade stage needs: :class:`~nemo_polar.rewards.grader.Evaluator`, or a stand-in for load tests."""

    def grade(self, patch: str) -> GradeResult: ...

    def close(self) -> None: ...


class Episode(BaseModel):
    verdict: Verdict
    session: SessionResult | None = Field(default=None, description="None when the harness never ran")
    grade: GradeResult | None = Field(default=None, description="None when the patch was not graded")
    output: list[dict[str, Any]] = Field(default_factory=list, description="main chain as NeMo Gym output items")
    metrics: dict[str, Any] = Field(default_factory=dict)
    traces: list[Trace] = Field(default_factory=list, exclude=True)

    @classmethod
    def failed(cls, kind: VerdictKind, reason: str, session: SessionResult | None = None) -> Episode:
        return cls(verdict=Verdict(kind=kind, reason=reason), session=session)

    @property
    def reward(self) -> float | None:
        """The reward to train on: None unless the verdict is trainable."""
        return self.verdict.reward if self.verdict.trainable else None


# -- the stages ---------------------------------------------------------------------------------------------------
def prepare(instance: SWEInstance, attempt: AttemptDir, runtime: str) -> Evaluator:
    """The task workspace, and the grader's fresh sandbox prepared ahead (it prewarms while the agent runs)."""
    prepare_workspace(instance.task(runtime), attempt.workspace)
    return Evaluator(instance, runtime, work_dir=attempt.eval).prepare()


def run_harness(
    harness: Harness,
    instance: SWEInstance,
    runtime: str,
    proxy: ProxyClient,
    attempt: AttemptDir,
    *,
    scripted: bool = False,
    session_config: dict[str, Any] | None = None,
    timeout: float = 600.0,
    cancel: threading.Event | None = None,
) -> SessionResult:
    """The CLI in its sandbox on the prepared workspace, with the instance's Python for its tools."""
    script = script_adapter.validate_python(instance.script) if scripted and instance.script else None
    environment = instance.environment()
    mounts, env = environment.tool_mounts()
    return run_session(
        harness,
        environment.task(instance.problem_statement, runtime),
        environment.runtime(runtime),
        proxy,
        attempt.root,
        script=script,
        session_config=session_config,
        timeout=timeout,
        mounts=mounts,
        env=env,
        workspace_ready=True,
        cancel=cancel,
    )


def grade(
    evaluator: Grader, session: SessionResult, attempt: AttemptDir, policy: VerdictPolicy
) -> tuple[GradeResult | None, str | None]:
    """``(grade, None)``, or ``(None, why)`` when grading raised; a session is graded when the policy
    :meth:`~nemo_polar.env.runtime.verdict.VerdictPolicy.grades` it."""
    if not policy.grades(session):
        return None, None
    try:
        graded = evaluator.grade(session.patch)
    except Exception as exc:  # an evaluation failure is a verdict (evaluation_failed), never the caller's crash
        return None, f"evaluation failed: {exc}"
    attempt.grade.write_text(graded.model_dump_json(indent=2))
    return graded, None


def conclude(
    session: SessionResult,
    graded: GradeResult | None,
    policy: VerdictPolicy,
    attempt: AttemptDir,
    *,
    grade_error: str | None = None,
) -> Episode:
    """Reconstruct the session's calls (prefix merging), judge it, and keep the main chain as Gym items."""
    t0 = time.monotonic()
    try:
        build = prefix_merging(session.records)
        main = sorted((t for t in build.traces if t.role == "main"), key=lambda t: t.segment)
        by_id = {r.call_id: r for r in session.records}
        output = gym_output_items(main[0], by_id) if main else []
        check_contiguous(output)  # true by construction; a violation must fail loudly, not reach the trainer
        write_traces(build.traces, attempt.traces)
    except Exception as exc:  # a reconstruction bug masks this episode; it must not take the caller down
        verdict = Verdict(
            kind="reconstruction_failed", reason=f"reconstruction failed: {exc!r}", reward=_reward(graded)
        )
        return Episode(verdict=verdict, session=session, grade=graded, metrics=_grade_metrics(session, graded))
    if grade_error is not None and policy.grades(session):
        verdict = Verdict(kind="evaluation_failed", reason=grade_error)
    else:
        verdict = judge(session, graded, build, main, policy)
    metrics = episode_metrics(session, graded, build, main)
    metrics["timings"]["reconstruct_s"] = time.monotonic() - t0
    return Episode(verdict=verdict, session=session, grade=graded, output=output, metrics=metrics, traces=build.traces)


def run_episode(
    harness: Harness,
    instance: SWEInstance,
    proxy: ProxyClient,
    session_dir: Path,
    *,
    runtime: str = "bwrap",
    scripted: bool = False,
    timeout: float = 600.0,
    session_config: dict[str, Any] | None = None,
    policy: VerdictPolicy | None = None,
) -> Episode:
    """The stages in turn, in this thread. A stage that raises ends the episode with its verdict, never an
    exception: the caller gets the same :class:`Episode` shape whatever happened."""
    attempt = AttemptDir(session_dir)
    attempt.root.mkdir(parents=True, exist_ok=True)
    policy = policy or VerdictPolicy()
    try:
        evaluator = prepare(instance, attempt, runtime)
    except Exception as exc:
        return Episode.failed("init_failed", f"init failed: {exc}")
    try:
        try:
            session = run_harness(
                harness,
                instance,
                runtime,
                proxy,
                attempt,
                scripted=scripted,
                session_config=session_config,
                timeout=timeout,
            )
        except Exception as exc:
            return Episode.failed("run_failed", f"harness run failed: {exc}")
        graded, error = grade(evaluator, session, attempt, policy)
    finally:
        evaluator.close()
    return conclude(session, graded, policy, attempt, grade_error=error)


# -- what an episode reports --------------------------------------------------------------------------------------
def _reward(graded: GradeResult | None) -> float | None:
    return graded.reward if graded is not None else None


def _grade_metrics(session: SessionResult, graded: GradeResult | None) -> dict[str, Any]:
    return {
        "session_id": session.session_id,
        "session_status": session.status,
        "grade_status": graded.status if graded else None,
        "resolved": graded.resolved if graded else None,
        "fail_to_pass": graded.fail_to_pass if graded else None,
        "pass_to_pass": graded.pass_to_pass if graded else None,
        "calls": session.calls,
        "egress_refused": len(session.egress),
        "timings": {
            **{f"session_{k}": v for k, v in session.timings.items()},
            **({f"grade_{k}": v for k, v in graded.timings.items()} if graded else {}),
        },
    }


def episode_metrics(
    session: SessionResult, graded: GradeResult | None, build: BuildResult, main: list[Trace]
) -> dict[str, Any]:
    """Per-episode figures (flat, so that NeMo Gym's aggregate metrics see them): the session, the grade, and what
    reconstruction made of the calls — chains by role, breaks, and how much of the agent's work the delivered main
    chain (the first main segment) covers."""
    delivered = main[0] if main else None
    roles = Counter(t.role for t in build.traces)
    agent_calls = sum(len(t.spans) for t in build.traces if t.role != "side")
    delivered_calls = len(delivered.spans) if delivered else 0
    return {
        **_grade_metrics(session, graded),
        "failed_calls": len(build.failed_call_ids),
        "traces": len(build.traces),
        "roles": dict(roles),
        "main_segments": len(main),
        "subagent_chains": roles["subagent"],
        "compaction_chains": roles["compaction"],
        "side_chains": roles["side"],
        "break_reasons": dict(build.break_reasons),
        "delivered_calls": delivered_calls,
        "delivered_fraction": delivered_calls / agent_calls if agent_calls else 0.0,
        "trainable_tokens": delivered.trainable_tokens if delivered else 0,
        "policy_versions": policy_versions(build),
    }
