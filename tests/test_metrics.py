"""Prometheus metrics: the proxy's /metrics after real calls (counts, tokens, histograms, busy time, failures by
reason, admin token) and a gateway's metrics over real sessions (stage depths with a backlog, stage counts,
outcomes by status and reason kind, rewards)."""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.parser import text_string_to_metric_families

from nemo_polar.env.gateway import Gateway, GatewayConfig, SessionOutcome, SessionRequest
from nemo_polar.env.gateway.testing import ChatLoopGateway, InstantGrade
from nemo_polar.env.runtime.attempt import AttemptDir
from nemo_polar.env.runtime.session import SessionResult
from nemo_polar.proxy.http.metrics import LAG_BUCKETS, ProxyMetrics, failure_reason
from nemo_polar.proxy.store.records import STAGES
from nemo_polar.rewards import bundled_instances
from tests.conftest import ProxyHandle, make_proxy
from tests.helpers.clients import loopback, openai_client

HOLD_S = 0.6
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    """``(sample name, sorted labels) -> value`` for every sample of a Prometheus text exposition."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def scrape(proxy: ProxyHandle) -> Samples:
    resp = proxy.admin("GET", "/metrics")
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/plain")
    return parse(resp.text)


@pytest.fixture
def fresh(engine_url: str, tmp_path: Path) -> Iterator[tuple[ProxyHandle, float]]:
    """A proxy of its own (its own registry: the counts below are exactly this test's calls) and its start time."""
    t0 = time.monotonic()
    for handle in make_proxy(engine_url, tmp_path / "records"):
        yield handle, t0


@pytest.mark.engine
def test_proxy_metrics_match_the_calls_made(fresh: tuple[ProxyHandle, float]) -> None:
    proxy, t0 = fresh
    session = proxy.session(sampling_overrides={"max_tokens": 8})
    client = openai_client(proxy, session["api_key"], timeout=120)
    history: list[Any] = [{"role": "user", "content": "Say hi."}]
    reply = client.chat.completions.create(model="local-model", messages=history)
    history += [{"role": "assistant", "content": reply.choices[0].message.content}, {"role": "user", "content": "More"}]
    client.chat.completions.create(model="local-model", messages=history)
    stream = client.chat.completions.create(model="local-model", messages=history, stream=True)
    assert list(stream)
    client.responses.create(model="local-model", input="Say hi.")
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=history)
    bad_key = openai_client(proxy, "polar-wrong")
    with pytest.raises(openai.AuthenticationError):
        bad_key.chat.completions.create(model="local-model", messages=history)
    wall = time.monotonic() - t0

    m = scrape(proxy)
    records = proxy.records(session["session_id"])
    assert len(records) == 5  # four complete, one 404 (the bad key created nothing)
    done = {"api": "chat", "mode": "continuation", "outcome": "completed"}
    assert value(m, "polar_calls_total", **done) == 3
    assert value(m, "polar_calls_total", api="responses", mode="continuation", outcome="completed") == 1
    assert value(m, "polar_calls_total", api="chat", mode="continuation", outcome="failed") == 1
    assert value(m, "polar_calls_total", api="chat", mode="none", outcome="failed") == 1
    assert value(m, "polar_call_failures_total", api="chat", status="404", reason="model_not_found") == 1
    assert value(m, "polar_call_failures_total", api="chat", status="401", reason="invalid_api_key") == 1
    assert sum(v for (name, _), v in m.items() if name == "polar_call_failures_total") == 2
    finishes = sum(v for (name, _), v in m.items() if name == "polar_call_finish_total")
    assert finishes == 4

    for api in ("chat", "responses"):
        mine = [r for r in records if r["api"] == api]
        assert value(m, "polar_prompt_tokens_total", api=api) == sum(len(r["prompt_token_ids"]) for r in mine) > 0
        assert value(m, "polar_sampled_tokens_total", api=api) == sum(len(r["sampled_token_ids"]) for r in mine) > 0

    assert value(m, "polar_call_latency_seconds_count", api="chat", outcome="completed") == 3
    assert value(m, "polar_call_latency_seconds_count", api="chat", outcome="failed") == 1
    assert value(m, "polar_call_latency_seconds_count", api="responses", outcome="completed") == 1
    latencies = [r["finished_at"] - r["started_at"] for r in records if r["api"] == "chat" and r["complete"]]
    assert value(m, "polar_call_latency_seconds_sum", api="chat", outcome="completed") == pytest.approx(sum(latencies))
    assert value(m, "polar_call_latency_seconds_bucket", api="chat", outcome="completed", le="+Inf") == 3
    assert value(m, "polar_render_seconds_count", api="chat") == 3  # the 404 failed before rendering
    assert value(m, "polar_time_to_first_token_seconds_count", api="chat") == 1  # one streamed call
    streamed = records[2]
    ttft = value(m, "polar_time_to_first_token_seconds_sum", api="chat")
    assert 0 < ttft <= streamed["finished_at"] - streamed["started_at"]
    # Where each call's time went: the stages it reached, in order, each no later than the next. Only the streamed
    # call hands events over one by one (first_downstream); the 404 was refused before it was parsed.
    assert [tuple(r["stages"]) for r in records] == [STAGES[:-1], STAGES[:-1], STAGES, STAGES[:-1], ()]
    assert all(list(r["stages"].values()) == sorted(r["stages"].values()) for r in records)
    assert "first_downstream" in streamed["stages"] and streamed["stages"]["first_downstream"] <= ttft + 0.001
    for stage in STAGES:
        reached = [r for r in records if r["api"] == "chat" and stage in r["stages"]]
        assert value(m, "polar_call_stage_seconds_count", api="chat", stage=stage) == len(reached)
    assert value(m, "polar_event_loop_lag_seconds_count") > 0

    busy = value(m, "polar_engine_busy_seconds_total")
    assert 0 < busy <= wall
    assert 0 < value(m, "polar_engine_busy_fraction") <= 1
    assert value(m, "polar_in_flight") == 0 and value(m, "polar_paused") == 0
    assert value(m, "polar_sessions") == 1
    assert math.isnan(value(m, "polar_policy_version"))

    assert proxy.admin("POST", "/polar/pause", json={"timeout_s": 5}).json()["drained"]
    paused = scrape(proxy)
    assert value(paused, "polar_paused") == 1
    assert value(paused, "polar_engine_busy_seconds_total") == busy  # nothing in flight: busy time stands still
    proxy.admin("POST", "/polar/resume", json={"policy_version": 7}).raise_for_status()
    resumed = scrape(proxy)
    assert value(resumed, "polar_paused") == 0 and value(resumed, "polar_policy_version") == 7


@pytest.mark.engine
def test_a_client_that_leaves_mid_stream_is_counted_as_disconnected(fresh: tuple[ProxyHandle, float]) -> None:
    proxy, _ = fresh
    key = proxy.session(sampling_overrides={"max_tokens": 3000}, extra_body={"ignore_eos": True})["api_key"]
    body = {"model": "local-model", "messages": [{"role": "user", "content": "Write."}], "stream": True}
    with loopback.stream(
        "POST", f"{proxy.url}/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"}, timeout=60
    ) as resp:
        assert resp.status_code == 200
        next(line for line in resp.iter_lines() if _delta_text(line))  # generating: now hang up
    # The bound only ends a run in which it is never counted: under make test-loaded's busy loops it once took
    # more than 30 s to be.
    deadline = time.monotonic() + 300
    labels = {"api": "chat", "status": "499", "reason": "client_disconnected"}
    while value(m := scrape(proxy), "polar_call_failures_total", **labels) != 1:
        assert time.monotonic() < deadline, "the abandoned stream was never counted"
        time.sleep(0.1)
    assert value(m, "polar_calls_total", api="chat", mode="continuation", outcome="failed") == 1
    assert value(m, "polar_time_to_first_token_seconds_count", api="chat") == 1
    assert value(m, "polar_in_flight") == 0


def _delta_text(line: str) -> str:
    if not line.startswith("data: {"):
        return ""
    return "".join(c.get("delta", {}).get("content") or "" for c in json.loads(line[6:]).get("choices", []))


def test_metrics_are_on_the_admin_listener_behind_its_token(tmp_path: Path) -> None:
    # /metrics never touches the engine: an unreachable engine URL is enough here
    for proxy in make_proxy("http://127.0.0.1:9", tmp_path, admin_token="s3cret-token"):
        assert loopback.get(f"{proxy.admin_url}/metrics").status_code == 401
        assert loopback.get(f"{proxy.admin_url}/metrics", headers={"authorization": "Bearer wrong"}).status_code == 401
        m = scrape(proxy)
        assert value(m, "polar_sessions") == 0 and value(m, "polar_engine_busy_seconds_total") == 0
        # The model listener, the one sandboxes reach, serves no metrics with or without the token.
        for headers in ({}, {"authorization": "Bearer s3cret-token"}):
            assert loopback.get(f"{proxy.url}/metrics", headers=headers).status_code == 404


def test_the_event_loop_lag_histogram_sees_a_blocked_loop() -> None:
    """CPU work on the event loop (here a 300 ms blocking sleep) delays the watcher's next wake-up by at least that
    much less its 50 ms interval, and the histogram records it."""
    metrics = ProxyMetrics.__new__(ProxyMetrics)  # only the histogram is needed
    metrics.loop_lag = Histogram("lag", "lag", buckets=LAG_BUCKETS, registry=CollectorRegistry())

    async def run() -> None:
        watch = asyncio.create_task(metrics.watch_event_loop(0.05))
        await asyncio.sleep(0.12)  # let it wake up at least once
        time.sleep(0.3)  # a render holding the loop
        await asyncio.sleep(0.12)
        watch.cancel()

    asyncio.run(run())
    [family] = metrics.loop_lag.collect()
    buckets = {s.labels["le"]: s.value for s in family.samples if s.name.endswith("_bucket")}
    assert buckets["+Inf"] >= 2
    assert buckets["+Inf"] - buckets["0.1"] >= 1  # the blocked wake-up: at least 0.3 - 0.05 s late


def test_failure_reason_labels() -> None:
    assert failure_reason(404, "model_not_found") == "model_not_found"
    assert failure_reason(400, None) == "bad_request"
    assert failure_reason(499, None) == "status_499"


# -- gateway -----------------------------------------------------------------------------------------------------


class LightGateway(ChatLoopGateway):
    """Chat-loop sessions (two real calls, the second streamed) whose harness name injects a fault: ``broken`` fails
    in INIT, ``timeout`` reports a timed-out harness, ``gated`` holds its run slot until ``gate`` is set."""

    gate: threading.Event

    def prepare(self, request: SessionRequest, attempt: AttemptDir) -> InstantGrade:
        if request.harness == "broken":
            raise RuntimeError("no workspace")
        return super().prepare(request, attempt)

    def run_harness(
        self, request: SessionRequest, attempt: AttemptDir, budget: float, cancel: threading.Event
    ) -> SessionResult:
        if request.harness == "timeout":
            return SessionResult(
                session_id=request.request_id, harness="light", harness_version="0", runtime="none",
                instance_id="m", status="timeout", exit_code=None, session_dir=attempt.root,
            )  # fmt: skip
        result = super().run_harness(request, attempt, budget, cancel)
        if request.harness == "gated":
            assert self.gate.wait(60), "the test never opened the gate"
        return result


async def _scrape_app(gw: Gateway) -> Samples:
    transport = httpx.ASGITransport(app=gw.metrics_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
        resp = await client.get("/metrics")
    assert resp.status_code == 200
    return parse(resp.text)


def _depths(samples: Samples) -> dict[str, float]:
    return {dict(labels)["stage"]: v for (name, labels), v in samples.items() if name == "polar_gateway_stage_depth"}


@pytest.mark.engine
def test_gateway_metrics_over_real_sessions(fresh: tuple[ProxyHandle, float], tmp_path: Path) -> None:
    proxy, _ = fresh
    inst = bundled_instances()[0]
    harnesses = ["gated", "light", "timeout", "light", "broken"]  # r3 is cancelled while queued

    async def scenario() -> tuple[Samples, Samples, Samples, list[SessionOutcome]]:
        config = GatewayConfig(
            state_dir=tmp_path / "state", init_workers=1, run_slots=1, post_workers=1, ready_buffer=1
        )
        gw = LightGateway(config, proxy.client())
        gw.gate = threading.Event()
        async with gw:
            futures = [
                await gw.submit(SessionRequest(request_id=f"r{i}", harness=h, instance=inst))
                for i, h in enumerate(harnesses)
            ]
            # r0 holds the only run slot; r1 waits in the ready buffer, r2 is prepared but the buffer is full,
            # r3 and r4 wait for the init worker
            backlog = {"queued": 2, "init": 0, "ready": 2, "run": 1, "postrun": 0}
            deadline = time.monotonic() + 60
            while gw.depths() != backlog:
                assert time.monotonic() < deadline, gw.depths()
                await asyncio.sleep(0.02)
            busy = await _scrape_app(gw)
            assert gw.cancel("r3")
            after_cancel = await _scrape_app(gw)
            await asyncio.sleep(HOLD_S)
            gw.gate.set()
            outcomes = list(await asyncio.wait_for(asyncio.gather(*futures), 120))
            return busy, after_cancel, await _scrape_app(gw), outcomes

    busy, after_cancel, final, outcomes = asyncio.run(scenario())
    assert [o.verdict.kind for o in outcomes] == ["trainable", "trainable", "timeout", "cancelled", "init_failed"]
    assert _depths(busy) == {"queued": 2, "init": 0, "ready": 2, "run": 1, "postrun": 0}
    assert _depths(after_cancel)["queued"] == 1
    assert set(_depths(final).values()) == {0}

    def outcome_count(status: str, kind: str) -> float:
        return value(final, "polar_gateway_outcomes_total", status=status, kind=kind)

    assert outcome_count("published", "trainable") == 2
    assert outcome_count("published", "timeout") == 1
    assert outcome_count("cancelled", "cancelled") == 1
    assert outcome_count("failed", "init_failed") == 1
    entered = {"queued": 5, "init": 4, "ready": 3, "run": 3, "postrun": 3, "done": 5}
    left = {"queued": 5, "init": 4, "ready": 3, "run": 3, "postrun": 3, "done": 0}  # each stage a session moved on from
    for stage in entered:
        assert value(final, "polar_gateway_stage_entered_total", stage=stage) == entered[stage], stage
        assert value(final, "polar_gateway_stage_seconds_count", stage=stage) == left[stage], stage
    # r0 held the run slot at least HOLD_S after the backlog formed, and r1 waited in READY as long
    assert value(final, "polar_gateway_stage_seconds_bucket", stage="run", le="0.5") <= 2
    assert value(final, "polar_gateway_stage_seconds_bucket", stage="ready", le="0.5") <= 2
    assert value(final, "polar_gateway_reward_count") == 2 and value(final, "polar_gateway_reward_sum") == 2.0
    assert value(final, "polar_gateway_reward_bucket", le="0.75") == 0

    proxied = scrape(proxy)  # the proxy saw exactly the two trainable sessions' calls
    assert value(proxied, "polar_calls_total", api="chat", mode="continuation", outcome="completed") == 4
    assert value(proxied, "polar_time_to_first_token_seconds_count", api="chat") == 2
