"""The Polar environment server: each Polar env as a native NeMo Gym environment server (Gym 0.7.0
``nemo_gym/base_environment_server.py``; Gym PR #3482), beside the agent server behind a ``legacy_agent`` relay.

Rollout collection sends it materialized tasks (``{"task_id": {"taskset", "task_id"}, "task_input": <a Gym SWE row>}``,
routed by ``environment_server_routes``) as episode requests; Gym's base applies the episode limits
(``max_concurrent_episodes``, ``queue_timeout_seconds``, ``default_episode_timeout_seconds``), the rollout context
and the cleanup context, in which this server registers the stop of the episode's session (a deadline or a
cancelled collection stops the CLI and its grading, not only the wait). The episode is the agent's
(:mod:`.episodes`), so a row gets the same verdict through either path. The verdict becomes the response:

- a trainable episode, or one whose reward stands but whose tokens do not (``no_main_chain``,
  ``main_chain_broken``, ``cross_version``, ``reconstruction_failed``): a ``result``, the verify response the agent
  returns (reward, main chain, ``mask_sample`` with its reason);
- an episode that never produced a trustworthy outcome: an :class:`EpisodeFailure` with Gym's failure kind and
  stage; retryable (``terminal=False``) when the machinery failed (workspace, gateway, proxy, grader, budgets,
  timeouts), terminal when the harness itself failed or the row cannot run. Collection keeps failures out of
  training and retries the non-terminal ones.
"""

from __future__ import annotations

from typing import ClassVar

from fastapi import FastAPI
from pydantic import PositiveFloat

from nemo_polar.env.gym.compat import (
    AgentServerRef,
    AggregateMetrics,
    AggregateMetricsMixin,
    AggregateMetricsRequest,
    BaseEnvironmentServer,
    BaseEnvironmentServerConfig,
    BaseEpisodeRequest,
    BaseEpisodeResponse,
    CleanupContext,
    EpisodeFailure,
    HandledEpisodeError,
    compute_aggregate_metrics,
)
from nemo_polar.env.gym.episodes import (
    PolarEpisodes,
    PolarRunRequest,
    PolarSettings,
    PolarVerifyResponse,
    close_on_shutdown,
)
from nemo_polar.env.gym.rows import RowError
from nemo_polar.env.runtime.verdict import Verdict, VerdictKind

# Verdicts with no trustworthy outcome -> (terminal, stage). The rest are results (masked where the tokens are).
EPISODE_FAILURES: dict[VerdictKind, tuple[bool, str]] = {
    "cancelled": (False, "agent"),
    "init_failed": (False, "seed"),
    "run_failed": (False, "agent"),
    "budget_exceeded": (False, "agent"),
    "gateway_failed": (False, "agent"),
    "timeout": (False, "agent"),  # Gym's own rule: a timeout is retryable
    "proxy_unreachable": (False, "agent"),
    "harness_error": (True, "agent"),  # the CLI failed on its own: the same episode would fail again
    "evaluation_failed": (False, "verification"),
    "grade_tests_timeout": (False, "verification"),
    "grade_infra_failure": (False, "verification"),
}


def episode_failure(verdict: Verdict) -> EpisodeFailure | None:
    """The verdict as Gym's episode failure, or None when the episode has a result."""
    if verdict.kind not in EPISODE_FAILURES:
        return None
    terminal, stage = EPISODE_FAILURES[verdict.kind]
    reason = f"{verdict.kind}: {verdict.reason}" if verdict.reason else verdict.kind
    return EpisodeFailure.model_validate(
        {
            "failure_reason": reason[:2000],
            "terminal": terminal,
            "failure_kind": verdict.gym_failure_kind,
            "stage": stage,
        }
    )


class PolarEpisodeRequest(BaseEpisodeRequest[PolarRunRequest]):
    """An episode of one Gym SWE row (any of Gym's shapes, :mod:`nemo_polar.rewards.gym_rows`)."""


class PolarEpisodeResponse(BaseEpisodeResponse[PolarVerifyResponse]):
    """The verify response the Polar agent returns for the same row, or the failure."""


class PolarEnvironmentServerConfig(PolarSettings, BaseEnvironmentServerConfig):
    """The Polar settings over Gym's episode limits."""

    cleanup_timeout_seconds: PositiveFloat = 180.0
    # The agent whose episodes these are, set only by the native variant (environments/<env>/native.yaml): Gym routes
    # a declared taskset here only when the server names its declaring agent. The server itself never calls it.
    agent_server: AgentServerRef | None = None


class PolarEnvironmentServer(BaseEnvironmentServer[PolarEpisodeRequest, PolarEpisodeResponse], AggregateMetricsMixin):
    ray_enabled: ClassVar[bool | None] = False  # episodes run in threads; no Ray cluster for run_webserver to start
    config: PolarEnvironmentServerConfig
    request_model = PolarEpisodeRequest
    response_model = PolarEpisodeResponse

    _episodes: PolarEpisodes | None = None

    @property
    def episodes(self) -> PolarEpisodes:
        if self._episodes is None:
            self._episodes = PolarEpisodes(self.config, self.config.name)
        return self._episodes

    def setup_webserver(self) -> FastAPI:
        return close_on_shutdown(super().setup_webserver(), self.close)

    async def run(self, request: PolarEpisodeRequest, cleanup: CleanupContext) -> PolarEpisodeResponse:
        try:
            result, verdict = await self.episodes.episode(request.task.task_input, cleanup.register_cleanup)
        except RowError as exc:
            failure = EpisodeFailure(failure_reason=str(exc)[:2000], terminal=True, stage="seed")
            raise HandledEpisodeError(failure) from None
        failure = episode_failure(verdict)
        if failure is not None:
            raise HandledEpisodeError(failure)
        # The collector owns ng_trajectory on this path: a result that carries the key (even null) stops the whole
        # collection (nemo_gym/rollout_collection.py:331-376, nemo-gym 0.7.0).
        result.ng_trajectory = None
        return PolarEpisodeResponse(episode_id=request.episode_id, task_id=request.task.task_id, result=result)

    async def aggregate_metrics(self, body: AggregateMetricsRequest) -> AggregateMetrics:
        """Gym's own aggregation of the rollouts' rewards and metrics, as its agents do it."""
        return compute_aggregate_metrics(
            body.verify_responses,
            compute_metrics_fn=self.compute_metrics,
            get_key_metrics_fn=self.get_key_metrics,
            compute_repeat_metrics_fn=self.compute_repeat_metrics,
        )

    def close(self) -> None:
        if self._episodes is not None:
            self._episodes.close()
            self._episodes = None
