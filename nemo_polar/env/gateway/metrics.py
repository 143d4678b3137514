"""Prometheus metrics for one rollout gateway: stage queue depths, sessions entering each stage, time spent per
stage, outcomes by status and verdict kind, and rewards.

Each gateway owns its own registry (several gateways, or tests, in one process never collide); mount
``Gateway.metrics_app()`` in whatever server hosts the gateway to expose ``/metrics``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, make_asgi_app
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from nemo_polar.env.gateway.models import SessionOutcome

# From a queued session picked up at once to a harness run at the agent budget.
STAGE_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
REWARD_BUCKETS = (0.0, 0.25, 0.5, 0.75, 1.0)  # no negative bound: prometheus_client then drops _sum


class _Depths(Collector):
    def __init__(self, depths: Callable[[], dict[str, int]]) -> None:
        self.depths = depths

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily("polar_gateway_stage_depth", "Unfinished sessions in each stage", labels=["stage"])
        for stage, count in self.depths().items():
            family.add_metric([stage], count)
        yield family


class GatewayMetrics:
    def __init__(self, depths: Callable[[], dict[str, int]]) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.entered = Counter("polar_gateway_stage_entered", "Sessions that entered each stage", ["stage"], registry=r)
        self.stage_seconds = Histogram(
            "polar_gateway_stage_seconds",
            "Time sessions spent in each stage",
            ["stage"],
            buckets=STAGE_BUCKETS,
            registry=r,
        )
        self.outcomes = Counter(
            "polar_gateway_outcomes", "Finished sessions by status and verdict kind", ["status", "kind"], registry=r
        )
        self.rewards = Histogram(
            "polar_gateway_reward", "Rewards of graded sessions", buckets=REWARD_BUCKETS, registry=r
        )
        r.register(_Depths(depths))

    def enter(self, stage: str, previous: str, since: float | None) -> None:
        """A session moves from ``previous`` (entered at wall-clock ``since``, if ever entered) to ``stage``."""
        self.entered.labels(stage).inc()
        if since is not None:
            self.stage_seconds.labels(previous).observe(max(time.time() - since, 0.0))

    def finish(self, outcome: SessionOutcome) -> None:
        self.outcomes.labels(outcome.status, outcome.verdict.kind).inc()
        if outcome.reward is not None:
            self.rewards.observe(outcome.reward)

    def asgi_app(self) -> Callable[..., Any]:
        return make_asgi_app(self.registry)
