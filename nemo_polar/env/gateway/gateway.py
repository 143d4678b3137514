"""Rollout gateway: sessions staged INIT -> READY -> RUN -> POSTRUN with separate worker pools, so that preparing
later sessions and grading earlier ones overlap the harness runs that keep the engine busy.

- INIT (``init_workers``): session directory, the task workspace, and the evaluator's fresh sandbox (prewarm).
- READY: a bounded buffer of prepared sessions (``ready_buffer``), so INIT runs ahead but not unboundedly.
- RUN (``run_slots``): the real CLI through a proxy session, under the agent budget.
- POSTRUN (``post_workers``): grade in the prewarmed sandbox, reconstruct (prefix merging), judge, publish.

The stage bodies are :mod:`nemo_polar.env.runtime.episode`'s stage functions, behind public hooks
(:meth:`Gateway.prepare`, :meth:`Gateway.run_harness`, :meth:`Gateway.conclude`) that a load test or a simulation
overrides (:mod:`.testing`).

Budgets: ``session_budget_s`` from INIT, ``agent_budget_s`` from RUN. Cancellation works at every stage (a running
harness is killed) and a cancelled session never publishes a trainable result. State lives on disk under
``state_dir/<request_id>/`` (an :class:`~nemo_polar.env.runtime.attempt.AttemptDir`): a restart loses no finished
result, re-delivers undelivered ones and reports what it could not finish. Results go to a local queue and/or a callback
URL, at least once, with the request id as the idempotency key. Memory holds unfinished sessions only (a training
run submits without end): a finished job leaves ``jobs`` and answers from its ``outcome.json``, a group leaves with
its last live job, and stage depths are counters kept on every stage change rather than scans.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal, TypeVar

import httpx

from nemo_polar.env.gateway.metrics import GatewayMetrics
from nemo_polar.env.gateway.models import (
    LIVE_STAGES,
    GatewayConfig,
    RecoveryReport,
    SessionOutcome,
    SessionRequest,
    Stage,
)
from nemo_polar.env.harness import get_harness
from nemo_polar.env.runtime import episode
from nemo_polar.env.runtime.attempt import AttemptDir
from nemo_polar.env.runtime.episode import Episode, Grader
from nemo_polar.env.runtime.session import SessionResult
from nemo_polar.env.runtime.verdict import Verdict
from nemo_polar.paths import atomic_write
from nemo_polar.proxy.http.client import ProxyClient
from nemo_polar.proxy.http.pool import ProxyPool, admission, session_proxy, unreachable
from nemo_polar.rewards.grader import GradeResult

T = TypeVar("T")


log = logging.getLogger("nemo_polar.gateway")


class _Job:
    def __init__(self, request: SessionRequest, attempt: AttemptDir) -> None:
        self.request = request
        self.attempt = attempt
        self.cancel = threading.Event()
        self.stage: Stage = "queued"
        self.stage_times: dict[str, float] = {}
        self.started = time.monotonic()
        self.grader: Grader | None = None
        self.session: SessionResult | None = None
        self.done: asyncio.Future[SessionOutcome] = asyncio.get_running_loop().create_future()

    def remaining(self, budget: float) -> float:
        return budget - (time.monotonic() - self.started)


class Gateway:
    """``proxy``: one proxy, or a pool of proxy workers (each session pinned to one by its request id; a weight sync
    pauses and resumes them all at once)."""

    def __init__(self, config: GatewayConfig, proxy: ProxyClient | ProxyPool) -> None:
        self.config = config
        self.proxy = proxy
        self.results: asyncio.Queue[SessionOutcome] = asyncio.Queue(maxsize=config.results_buffer)
        # Unfinished jobs only: a finished one leaves memory, its outcome.json answers for it (see submit).
        self.jobs: dict[str, _Job] = {}
        self._depths: dict[Stage, int] = dict.fromkeys(LIVE_STAGES, 0)  # kept by _enter, read at every scrape
        self._init_q: asyncio.Queue[_Job] = asyncio.Queue()
        self._ready_q: asyncio.Queue[_Job] = asyncio.Queue(maxsize=config.ready_buffer)
        self._post_q: asyncio.Queue[_Job] = asyncio.Queue()
        self._workers: list[asyncio.Task[None]] = []
        self._deliveries: set[asyncio.Task[None]] = set()  # the loop keeps only weak references to tasks
        # One callback client for every delivery: building one loads the CA bundle (~50 ms of CPU, on the loop).
        # No pooled connections: each delivery opens its own, so a restarted receiver is never sent on a dead one.
        self._callback_http: httpx.AsyncClient | None = None
        # GRPO groups with a live job: trainable results so far, and the live jobs' request ids.
        self._groups: dict[str, int] = {}
        self._group_jobs: dict[str, set[str]] = {}
        self.metrics = GatewayMetrics(self.depths)
        # Stage bodies block (subprocesses, sandboxes, HTTP): one thread per worker, so a busy pool never starves
        # another (asyncio's default executor has only cpu_count + 4 threads).
        self._threads = ThreadPoolExecutor(max_workers=config.init_workers + config.run_slots + config.post_workers)
        config.state_dir.mkdir(parents=True, exist_ok=True)

    def attempt(self, request_id: str) -> AttemptDir:
        return AttemptDir(self.config.state_dir / request_id)

    # -- the stage hooks: what one session does in each stage (blocking; they run in the stage's worker thread) ----
    def prepare(self, request: SessionRequest, attempt: AttemptDir) -> Grader:
        """INIT: the workspace and the grader's prewarmed sandbox."""
        return episode.prepare(request.instance, attempt, self.config.runtime)

    def run_harness(
        self, request: SessionRequest, attempt: AttemptDir, budget: float, cancel: threading.Event
    ) -> SessionResult:
        """RUN: the CLI through ``request.proxy`` (else the gateway's), within ``budget`` seconds."""
        metadata = {"request_id": request.request_id, "group_id": request.group_id}
        return episode.run_harness(
            get_harness(request.harness, **request.harness_options),
            request.instance,
            self.config.runtime,
            request.proxy or session_proxy(self.proxy, request.request_id),
            attempt,
            scripted=request.scripted,
            session_config={**request.session_config, "metadata": metadata},
            timeout=max(budget, 1.0),
            cancel=cancel,
        )

    def conclude(
        self,
        request: SessionRequest,
        attempt: AttemptDir,
        session: SessionResult,
        grade: GradeResult | None,
        grade_error: str | None,
    ) -> Episode:
        """POSTRUN, after grading: reconstruct and judge under the gateway's verdict policy."""
        return episode.conclude(session, grade, self.config.policy, attempt, grade_error=grade_error)

    def finished(self, request: SessionRequest, outcome: SessionOutcome) -> None:
        """Called on the gateway's loop once an outcome is on disk and in its future, before it is delivered."""

    # -- lifecycle ---------------------------------------------------------------------------------------------
    async def start(self) -> RecoveryReport:
        report = await self.recover()
        c = self.config
        for n, stage in ((c.init_workers, self._init), (c.run_slots, self._run), (c.post_workers, self._post)):
            self._workers += [asyncio.create_task(self._loop(stage)) for _ in range(n)]
        return report

    async def stop(self) -> None:
        for job in self.jobs.values():
            job.cancel.set()
        for task in self._workers:
            task.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._workers.clear()
        # Wait for stage bodies still running: cancelled harnesses are killed at once, and a stage body must not
        # write into a session directory that a restarted gateway is already reusing.
        await asyncio.to_thread(self._threads.shutdown, wait=True, cancel_futures=True)
        if self._callback_http is not None:
            await self._callback_http.aclose()
            self._callback_http = None

    async def __aenter__(self) -> Gateway:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- API ---------------------------------------------------------------------------------------------------
    async def submit(self, request: SessionRequest) -> asyncio.Future[SessionOutcome]:
        if request.request_id in self.jobs:
            return self.jobs[request.request_id].done  # idempotent
        attempt = self.attempt(request.request_id)
        if attempt.outcome.exists():  # finished before a restart: never run twice
            fut: asyncio.Future[SessionOutcome] = asyncio.get_running_loop().create_future()
            fut.set_result(SessionOutcome.model_validate_json(attempt.outcome.read_text()))
            return fut
        if attempt.root.exists():  # interrupted before a restart: the attempt starts over from a clean directory
            shutil.rmtree(attempt.root)
        job = _Job(request, attempt)
        self.jobs[request.request_id] = job
        if request.group_id is not None:
            self._group_jobs.setdefault(request.group_id, set()).add(request.request_id)
        attempt.root.mkdir(parents=True, exist_ok=True)
        attempt.request.write_text(request.model_dump_json(indent=2))
        self._enter(job, "queued")
        await self._init_q.put(job)
        return job.done

    def cancel(self, request_id: str) -> bool:
        job = self.jobs.get(request_id)
        if job is None or job.done.done():
            return False
        job.cancel.set()
        if job.stage in ("queued", "ready"):  # not being worked on: finish now, the worker will skip it
            self._finish(job, "cancelled", Episode.failed("cancelled", "cancelled"))
        return True

    async def pause(self, timeout_s: float = 60.0) -> dict[str, Any]:
        """Weight sync: the proxy stops admitting generations and drains in-flight ones (bounded)."""
        return admission(await asyncio.to_thread(self.proxy.pause, timeout_s))

    async def resume(self, policy_version: int | None = None) -> dict[str, Any]:
        return admission(await asyncio.to_thread(self.proxy.resume, policy_version))

    def metrics_app(self) -> Callable[..., Any]:
        """An ASGI app serving this gateway's Prometheus metrics, to mount at ``/metrics`` in the hosting server."""
        return self.metrics.asgi_app()

    def depths(self) -> dict[str, int]:
        """Unfinished sessions per stage."""
        return dict(self._depths)

    async def _blocking(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._threads, fn, *args)

    # -- stages ------------------------------------------------------------------------------------------------
    async def _loop(self, stage: Any) -> None:
        while True:
            await stage()

    async def _init(self) -> None:
        job = await self._init_q.get()
        if self._stopped(job):
            return
        self._enter(job, "init")
        try:
            job.grader = await self._blocking(self.prepare, job.request, job.attempt)
        except Exception as exc:  # a broken instance or runtime: reported, never trained on
            self._finish(job, "failed", Episode.failed("init_failed", f"init failed: {exc}"))
            return
        self._enter(job, "ready")
        await self._ready_q.put(job)

    async def _run_failure(self, request: SessionRequest, exc: Exception) -> Episode:
        """Why a harness run raised: its proxy worker died (a pool's worker that no longer answers: every session on
        it is masked with that reason; what it answered stays in the record directory), else the run's own error."""
        if request.proxy is None and isinstance(self.proxy, ProxyPool):
            worker = session_proxy(self.proxy, request.request_id)
            if why := await asyncio.to_thread(unreachable, worker):
                return Episode.failed("proxy_unreachable", f"proxy worker at {worker.url} died ({why}): {exc}")
        return Episode.failed("run_failed", f"harness run failed: {exc}")

    async def _run(self) -> None:
        job = await self._ready_q.get()
        if self._stopped(job):
            return
        self._enter(job, "run")
        budget = min(self.config.agent_budget_s, job.remaining(self.config.session_budget_s))
        try:
            job.session = await self._blocking(self.run_harness, job.request, job.attempt, budget, job.cancel)
        except Exception as exc:
            log.warning("%s: the harness run raised", job.request.request_id, exc_info=True)
            self._finish(job, "failed", await self._run_failure(job.request, exc))
            return
        if self._stopped(job):
            return
        self._enter(job, "postrun")
        await self._post_q.put(job)

    async def _post(self) -> None:
        job = await self._post_q.get()
        if self._stopped(job):
            return
        session, grader = job.session, job.grader
        assert session is not None and grader is not None
        grade, error = await self._blocking(episode.grade, grader, session, job.attempt, self.config.policy)
        try:
            result = await self._blocking(self.conclude, job.request, job.attempt, session, grade, error)
        except Exception as exc:  # a reconstruction bug must not kill the POSTRUN worker or strand the job
            verdict = Verdict(kind="reconstruction_failed", reason=f"reconstruction failed: {exc!r}")
            result = Episode(verdict=verdict, session=session, grade=grade)
        self._finish(job, "published", result)

    # -- outcome -----------------------------------------------------------------------------------------------
    def _stopped(self, job: _Job) -> bool:
        """Finished already, cancelled, or over its session budget: finish it without a trainable result."""
        if job.done.done():
            return True
        if job.cancel.is_set():
            self._finish(job, "cancelled", Episode.failed("cancelled", "cancelled"))
            return True
        if job.remaining(self.config.session_budget_s) <= 0:
            reason = f"session budget of {self.config.session_budget_s:.0f} s exceeded"
            self._finish(job, "published", Episode.failed("budget_exceeded", reason))
            return True
        return False

    def _enter(self, job: _Job, stage: Stage) -> None:
        since = job.stage_times.get(job.stage)
        self.metrics.enter(stage, job.stage, since)
        if since is not None:  # a job starts out "queued" before it has entered any stage
            self._depths[job.stage] -= 1
        if stage != "done":
            self._depths[stage] += 1
        job.stage = stage
        job.stage_times[stage] = time.time()
        job.attempt.state.write_text(json.dumps({"stage": stage, "stage_times": job.stage_times}))

    def _finish(self, job: _Job, status: Literal["published", "cancelled", "failed"], result: Episode) -> None:
        if job.done.done():
            return
        if job.cancel.is_set():  # a cancel that raced with the run still wins: nothing trainable is published
            reason = result.verdict.reason if result.verdict.kind == "cancelled" else "cancelled"
            status, result = "cancelled", Episode.failed("cancelled", reason or "cancelled")
        session = job.session
        outcome = SessionOutcome(
            request_id=job.request.request_id,
            status=status,
            verdict=result.verdict,
            session_status=session.status if session else None,
            grade=result.grade,
            output=result.output,
            metrics=result.metrics,
        )
        if job.grader is not None:
            job.grader.close()
        self._enter(job, "done")
        outcome.stage_times = dict(job.stage_times)
        # Whole or absent: a gateway killed while writing it must not leave an empty "finished" result behind (the
        # controller and a restarted gateway take an outcome.json as the session's final word).
        atomic_write(job.attempt.outcome, outcome.model_dump_json(indent=2).encode())
        job.done.set_result(outcome)
        del self.jobs[job.request.request_id]  # from now on submit() answers from outcome.json
        self.finished(job.request, outcome)
        self.metrics.finish(outcome)
        if self.results.full():  # nobody is taking them: the oldest goes (it is in its future and on disk)
            self.results.get_nowait()
        self.results.put_nowait(outcome)
        if self.config.callback_url:
            task = asyncio.get_running_loop().create_task(self._deliver(outcome))
            self._deliveries.add(task)
            task.add_done_callback(self._deliveries.discard)
        self._group_done(job, outcome)

    def _group_done(self, job: _Job, outcome: SessionOutcome) -> None:
        req, gid = job.request, job.request.group_id
        if gid is None:
            return
        live = self._group_jobs.get(gid, set())
        live.discard(req.request_id)
        if req.group_needed is not None and not outcome.mask_sample:
            self._groups[gid] = self._groups.get(gid, 0) + 1
            if self._groups[gid] >= req.group_needed:  # enough for the GRPO group: stop the stragglers
                for other in list(live):
                    self.cancel(other)
        if not live:  # nothing left to stop: a later request with this group id starts a fresh count
            self._group_jobs.pop(gid, None)
            self._groups.pop(gid, None)

    async def _deliver(self, outcome: SessionOutcome) -> None:
        assert self.config.callback_url
        marker = self.attempt(outcome.request_id).delivered
        headers = {"Idempotency-Key": outcome.request_id}
        if self._callback_http is None:
            self._callback_http = httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_keepalive_connections=0))
        for attempt in range(self.config.callback_attempts):
            with contextlib.suppress(httpx.HTTPError):
                resp = await self._callback_http.post(
                    self.config.callback_url, content=outcome.model_dump_json(), headers=headers
                )
                if resp.status_code < 300:
                    marker.write_text(json.dumps({"at": time.time(), "attempts": attempt + 1}))
                    return
            await asyncio.sleep(min(2.0**attempt * 0.1, 5.0))

    # -- restart -----------------------------------------------------------------------------------------------
    async def recover(self) -> RecoveryReport:
        """Finished results survive a restart (and are re-delivered if the callback never acknowledged them);
        sessions that were mid-flight are reported with the stage they reached."""
        report = RecoveryReport()
        for directory in sorted(p for p in self.config.state_dir.iterdir() if p.is_dir()):
            attempt = AttemptDir(directory)
            if attempt.outcome.exists():
                report.finished.append(attempt.name)
                if self.config.callback_url and not attempt.delivered.exists():
                    outcome = SessionOutcome.model_validate_json(attempt.outcome.read_text())
                    await self._deliver(outcome)
                    report.redelivered.append(attempt.name)
            elif attempt.state.exists():
                report.unfinished[attempt.name] = json.loads(attempt.state.read_text())["stage"]
        return report


class GatewayThread:
    """A gateway on an event loop of its own, for hosts whose requests may run on other (or short-lived) loops — a
    web server's handlers, test clients, synchronous code: ``await host.run(request)`` from any loop, or
    ``host.run_sync(request)`` from a plain thread."""

    def __init__(self, config: GatewayConfig, proxy: ProxyClient | ProxyPool) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="polar-gateway", daemon=True)
        self._thread.start()
        self.gateway = Gateway(config, proxy)
        self.recovery = self._call(self.gateway.start()).result()

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    async def _outcome(self, request: SessionRequest) -> SessionOutcome:
        # Shielded: a caller that stops waiting must not cancel the job's own future (a cancelled future reads as
        # finished, and the job could then no longer be cancelled); stopping the session is :meth:`cancel`.
        return await asyncio.shield(await self.gateway.submit(request))

    async def run(self, request: SessionRequest) -> SessionOutcome:
        return await asyncio.wrap_future(self._call(self._outcome(request)))

    def run_sync(self, request: SessionRequest) -> SessionOutcome:
        return self._call(self._outcome(request)).result()

    def cancel(self, request_id: str) -> bool:
        """:meth:`Gateway.cancel` from any thread."""

        async def cancel() -> bool:
            return self.gateway.cancel(request_id)

        return bool(self._call(cancel()).result()) if not self.loop.is_closed() else False

    def close(self) -> None:
        if self.loop.is_closed():
            return
        self._call(self.gateway.stop()).result()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()
