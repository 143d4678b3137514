"""Prometheus metrics for one proxy: calls, tokens, latencies, failures by reason, and how busy the engine is.

Each proxy app owns its own registry, so several proxies (or test apps) in one process never collide. Call figures
come from the finished :class:`CallRecord` (one ``observe`` per record, complete or failed); live state (in-flight
generations, sessions, pause, policy version, engine busy time) is read at scrape time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from http import HTTPStatus

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from nemo_polar.proxy.errors import ProxyError
from nemo_polar.proxy.http.admission import Admission, Ticket
from nemo_polar.proxy.store.records import Api, CallRecord
from nemo_polar.proxy.store.sessions import SessionStore

# Agent calls run from milliseconds (a cached tool-call turn) to many minutes (long generations on a loaded engine).
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
RENDER_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5)


class MeteredAdmission(Admission):
    """Admission that also keeps the engine's busy time: the wall time during which at least one call held an
    admission ticket (from rendering its prompt until its generation was closed)."""

    def __init__(self, version: int | None = None) -> None:
        super().__init__(version)
        self.started = time.monotonic()
        self._busy_s = 0.0
        self._busy_since: float | None = None

    async def enter(self) -> Ticket:
        ticket = await super().enter()
        if self._busy_since is None:
            self._busy_since = time.monotonic()
        return ticket

    def _leave(self, ticket: Ticket) -> None:  # every ticket's single exit
        super()._leave(ticket)
        if self.in_flight == 0 and self._busy_since is not None:
            self._busy_s += time.monotonic() - self._busy_since
            self._busy_since = None

    def busy_seconds(self) -> float:
        """Busy time so far, including the current busy interval."""
        ongoing = time.monotonic() - self._busy_since if self._busy_since is not None else 0.0
        return self._busy_s + ongoing


def failure_reason(status: int, code: str | None) -> str:
    """A short label: the error's code, else the HTTP status phrase (``payload_too_large``), else ``status_NNN``."""
    if code:
        return code
    try:
        return HTTPStatus(status).phrase.lower().replace(" ", "_").replace("-", "_")
    except ValueError:
        return f"status_{status}"


class _State(Collector):
    """Figures read from the live proxy at scrape time."""

    def __init__(self, admission: MeteredAdmission, sessions: SessionStore) -> None:
        self.admission = admission
        self.sessions = sessions

    def collect(self) -> Iterator[Metric]:
        adm = self.admission
        busy = adm.busy_seconds()
        wall = max(time.monotonic() - adm.started, 1e-9)
        version = float("nan") if adm.version is None else float(adm.version)
        yield GaugeMetricFamily("polar_in_flight", "Calls holding an admission ticket right now", value=adm.in_flight)
        yield GaugeMetricFamily(
            "polar_sessions", "Sessions created on this proxy (as /health reports)", len(self.sessions)
        )
        yield GaugeMetricFamily(
            "polar_sessions_open", "Sessions created and not yet closed (held in memory)", self.sessions.live
        )
        yield GaugeMetricFamily("polar_paused", "1 while generations are paused for a weight sync", float(adm.paused))
        yield GaugeMetricFamily("polar_policy_version", "Policy version stamped on new records (NaN: none)", version)
        yield CounterMetricFamily(
            "polar_engine_busy_seconds",
            "Wall time with at least one generation in flight; rate() is the engine busy fraction",
            value=busy,
        )
        yield GaugeMetricFamily(
            "polar_engine_busy_fraction", "Engine busy time / wall time since the proxy started", busy / wall
        )


class ProxyMetrics:
    def __init__(self, admission: MeteredAdmission, sessions: SessionStore) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.calls = Counter(
            "polar_calls", "Model calls by API, session mode and outcome", ["api", "mode", "outcome"], registry=r
        )
        self.failures = Counter(
            "polar_call_failures",
            "Failed model calls by HTTP status and reason",
            ["api", "status", "reason"],
            registry=r,
        )
        self.finish = Counter(
            "polar_call_finish", "Completed calls by the engine's finish reason", ["finish_reason"], registry=r
        )
        self.prompt_tokens = Counter("polar_prompt_tokens", "Prompt token ids sent to the engine", ["api"], registry=r)
        self.sampled_tokens = Counter("polar_sampled_tokens", "Token ids sampled by the engine", ["api"], registry=r)
        self.latency = Histogram(
            "polar_call_latency_seconds",
            "Call wall time, request to record",
            ["api", "outcome"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "polar_time_to_first_token_seconds",
            "Streaming calls: request arrival to the first generated event sent to the harness",
            ["api"],
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.render = Histogram(
            "polar_render_seconds", "Time to build the engine request", ["api"], buckets=RENDER_BUCKETS, registry=r
        )
        self.stages = Histogram(
            "polar_call_stage_seconds",
            "Request arrival to each stage a call reached (parsed, admitted, rendered, engine_accepted, "
            "first_upstream, first_downstream)",
            ["api", "stage"],
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.loop_lag = Histogram(
            "polar_event_loop_lag_seconds",
            "How late the proxy's event loop ran a task due every 50 ms (CPU work holding the loop)",
            buckets=LAG_BUCKETS,
            registry=r,
        )
        r.register(_State(admission, sessions))
        self._streaming: set[str] = set()  # call ids whose first event has been seen

    def observe(self, record: CallRecord, reason: str | None = None) -> None:
        """Count one recorded call, complete or failed (``reason``: the failure's code, when it has one)."""
        outcome = "completed" if record.complete else "failed"
        api = record.api
        self.calls.labels(api, record.mode, outcome).inc()
        if not record.complete:
            self.failures.labels(api, str(record.status_code), failure_reason(record.status_code, reason)).inc()
        elif record.finish_reason:
            self.finish.labels(record.finish_reason).inc()
        self.prompt_tokens.labels(api).inc(record.prompt_view()[1])
        self.sampled_tokens.labels(api).inc(len(record.sampled_token_ids))
        if record.finished_at is not None:
            self.latency.labels(api, outcome).observe(max(record.finished_at - record.started_at, 0.0))
        if record.render_s is not None:
            self.render.labels(api).observe(record.render_s)
        for stage, seconds in record.stages.items():
            self.stages.labels(api, stage).observe(max(seconds, 0.0))
        self._streaming.discard(record.call_id)

    def first_event(self, record: CallRecord) -> None:
        """A streaming call sent its harness a generated event: the first one per call is its time to first token."""
        if record.call_id not in self._streaming:
            self._streaming.add(record.call_id)
            record.reached("first_downstream")
            self.ttft.labels(record.api).observe(max(time.time() - record.started_at, 0.0))

    async def watch_event_loop(self, interval_s: float = 0.05) -> None:
        """Until cancelled: how late the event loop wakes a task that sleeps ``interval_s``. Every session's requests
        and streams share this loop, so CPU work that holds it (a render, a large JSON) shows here as lag that
        delays every other session's bytes."""
        loop = asyncio.get_running_loop()
        while True:
            start = loop.time()
            await asyncio.sleep(interval_s)
            self.loop_lag.observe(max(loop.time() - start - interval_s, 0.0))

    def rejected(self, api: Api, err: ProxyError) -> None:
        """A call refused before it had a session (bad API key): nothing is recorded, but it is counted."""
        self.calls.labels(api, "none", "failed").inc()
        self.failures.labels(api, str(err.status), failure_reason(err.status, err.code)).inc()
