"""Rollout gateway: sessions staged INIT -> READY -> RUN -> POSTRUN with separate worker pools, so that preparing
later sessions and grading earlier ones overlap the harness runs that keep the engine busy.

- INIT (``init_workers``): session directory, the task workspace, and the evaluator's fresh sandbox (prewarm).
- READY: a bounded buffer of prepared sessions (``ready_buffer``), so INIT runs ahead but not unboundedly.
- RUN (``run_slots``): the real CLI through a proxy session, under the agent budget.
- POSTRUN (``post_workers``): grade in the prewarmed sandbox, reconstruct (prefix merging), publish.

Budgets: ``session_budget_s`` from INIT, ``agent_budget_s`` from RUN. Cancellation works at every stage (a running
harness is killed) and a cancelled session never publishes a trainable result. State lives on disk under
``state_dir/<request_id>/``: a restart loses no finished result, re-delivers undelivered ones and reports what it
could not finish. Results go to a local queue and/or a callback URL, at least once, with the request id as the
idempotency key. Memory holds unfinished sessions only (a training run submits without end): a finished job
leaves ``jobs`` and answers from its ``outcome.json``, a group leaves with its last live job, and stage depths are
counters kept on every stage change rather than scans.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal, TypeVar

import httpx
from pydantic import BaseModel, Field, field_validator

from nemo_polar.env.episode import task_environment
from nemo_polar.env.gateway_metrics import GatewayMetrics
from nemo_polar.env.harness import get_harness
from nemo_polar.env.runtime import get_runtime
from nemo_polar.env.script import script_adapter
from nemo_polar.env.session import SessionResult, run_session
from nemo_polar.env.workspace import prepare_workspace
from nemo_polar.proxy.client import ProxyClient
from nemo_polar.reconstruct.builders import prefix_merging
from nemo_polar.reconstruct.io import gym_output_items
from nemo_polar.rewards.grader import Evaluator, GradeResult
from nemo_polar.rewards.instance import SWEInstance

Stage = Literal["queued", "init", "ready", "run", "postrun", "done"]
LIVE_STAGES: tuple[Stage, ...] = ("queued", "init", "ready", "run", "postrun")
T = TypeVar("T")
REQUEST_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class GatewayConfig(BaseModel):
    state_dir: Path
    runtime: str = "bwrap"
    init_workers: int = Field(default=2, ge=1)
    run_slots: int = Field(default=4, ge=1)
    post_workers: int = Field(default=2, ge=1)
    ready_buffer: int = Field(default=4, ge=1)
    session_budget_s: float = Field(default=3600.0, gt=0)
    agent_budget_s: float = Field(default=1800.0, gt=0)
    cross_version: Literal["keep", "mask"] = Field(
        default="keep", description="sessions whose calls span policy versions: keep (importance-correct) or mask"
    )
    callback_url: str | None = None
    callback_attempts: int = Field(default=5, ge=1)
    results_buffer: int = Field(
        default=1024,
        ge=1,
        description="outcomes kept in Gateway.results until taken; past that the oldest is dropped (it stays in its "
        "future, in outcome.json and with the callback)",
    )


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
    request_id: str
    status: Literal["published", "cancelled", "failed"]
    reward: float | None = None
    mask_sample: bool = True
    reason: str | None = None
    session_status: str | None = None
    grade: GradeResult | None = None
    output: list[dict[str, Any]] = Field(default_factory=list, description="main chain as NeMo Gym output items")
    metrics: dict[str, Any] = Field(default_factory=dict)
    stage_times: dict[str, float] = Field(default_factory=dict, description="stage -> wall-clock time entered")


class RecoveryReport(BaseModel):
    finished: list[str] = Field(default_factory=list)
    redelivered: list[str] = Field(default_factory=list)
    unfinished: dict[str, str] = Field(default_factory=dict, description="request id -> the stage it was in")


class _Job:
    def __init__(self, request: SessionRequest, directory: Path) -> None:
        self.request = request
        self.dir = directory
        self.cancel = threading.Event()
        self.stage: Stage = "queued"
        self.stage_times: dict[str, float] = {}
        self.started = time.monotonic()
        self.evaluator: Evaluator | None = None
        self.session: SessionResult | None = None
        self.done: asyncio.Future[SessionOutcome] = asyncio.get_running_loop().create_future()

    def remaining(self, budget: float) -> float:
        return budget - (time.monotonic() - self.started)


class Gateway:
    def __init__(self, config: GatewayConfig, proxy: ProxyClient) -> None:
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
        # GRPO groups with a live job: trainable results so far, and the live jobs' request ids.
        self._groups: dict[str, int] = {}
        self._group_jobs: dict[str, set[str]] = {}
        self.metrics = GatewayMetrics(self.depths)
        # Stage bodies block (subprocesses, sandboxes, HTTP): one thread per worker, so a busy pool never starves
        # another (asyncio's default executor has only cpu_count + 4 threads).
        self._threads = ThreadPoolExecutor(max_workers=config.init_workers + config.run_slots + config.post_workers)
        config.state_dir.mkdir(parents=True, exist_ok=True)

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

    async def __aenter__(self) -> Gateway:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- API ---------------------------------------------------------------------------------------------------
    async def submit(self, request: SessionRequest) -> asyncio.Future[SessionOutcome]:
        if request.request_id in self.jobs:
            return self.jobs[request.request_id].done  # idempotent
        directory = self.config.state_dir / request.request_id
        if (directory / "outcome.json").exists():  # finished before a restart: never run twice
            fut: asyncio.Future[SessionOutcome] = asyncio.get_running_loop().create_future()
            fut.set_result(SessionOutcome.model_validate_json((directory / "outcome.json").read_text()))
            return fut
        if directory.exists():  # interrupted before a restart: the attempt starts over from a clean directory
            shutil.rmtree(directory)
        job = _Job(request, directory)
        self.jobs[request.request_id] = job
        if request.group_id is not None:
            self._group_jobs.setdefault(request.group_id, set()).add(request.request_id)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "request.json").write_text(request.model_dump_json(indent=2))
        self._enter(job, "queued")
        await self._init_q.put(job)
        return job.done

    def cancel(self, request_id: str) -> bool:
        job = self.jobs.get(request_id)
        if job is None or job.done.done():
            return False
        job.cancel.set()
        if job.stage in ("queued", "ready"):  # not being worked on: finish now, the worker will skip it
            self._finish(job, "cancelled", reason="cancelled")
        return True

    async def pause(self, timeout_s: float = 60.0) -> dict[str, Any]:
        """Weight sync: the proxy stops admitting generations and drains in-flight ones (bounded)."""
        return await asyncio.to_thread(self.proxy.pause, timeout_s)

    async def resume(self, policy_version: int | None = None) -> dict[str, Any]:
        return await asyncio.to_thread(self.proxy.resume, policy_version)

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
            job.evaluator = await self._blocking(self._prepare, job)
        except Exception as exc:  # a broken instance or runtime: reported, never trained on
            self._finish(job, "failed", reason=f"init failed: {exc}")
            return
        self._enter(job, "ready")
        await self._ready_q.put(job)

    def _prepare(self, job: _Job) -> Evaluator:
        inst = job.request.instance
        prepare_workspace(inst.task(), job.dir / "workspace")
        return Evaluator(inst, self.config.runtime, work_dir=job.dir / "eval").prepare()

    async def _run(self) -> None:
        job = await self._ready_q.get()
        if self._stopped(job):
            return
        self._enter(job, "run")
        budget = min(self.config.agent_budget_s, job.remaining(self.config.session_budget_s))
        try:
            job.session = await self._blocking(self._run_harness, job, budget)
        except Exception as exc:
            self._finish(job, "failed", reason=f"harness run failed: {exc}")
            return
        if self._stopped(job):
            return
        self._enter(job, "postrun")
        await self._post_q.put(job)

    def _run_harness(self, job: _Job, budget: float) -> SessionResult:
        req = job.request
        mounts, env = task_environment(req.instance)
        script = script_adapter.validate_python(req.instance.script) if req.scripted and req.instance.script else None
        config = {**req.session_config, "metadata": {"request_id": req.request_id, "group_id": req.group_id}}
        return run_session(
            get_harness(req.harness, **req.harness_options),
            req.instance.task(),
            get_runtime(self.config.runtime),
            req.proxy or self.proxy,
            job.dir,
            script=script,
            session_config=config,
            timeout=max(budget, 1.0),
            mounts=mounts,
            env=env,
            workspace_ready=True,
            cancel=job.cancel,
        )

    async def _post(self) -> None:
        job = await self._post_q.get()
        if self._stopped(job):
            return
        session = job.session
        assert session is not None and job.evaluator is not None
        if session.status != "completed":
            self._finish(job, "published", reason=f"harness session {session.status}: {session.error}")
            return
        try:
            grade = await self._blocking(job.evaluator.grade, session.patch)
        except Exception as exc:
            self._finish(job, "published", reason=f"evaluation failed: {exc}")
            return
        self._finish(job, "published", grade=grade)

    # -- outcome -----------------------------------------------------------------------------------------------
    def _stopped(self, job: _Job) -> bool:
        """Finished already, cancelled, or over its session budget: finish it without a trainable result."""
        if job.done.done():
            return True
        if job.cancel.is_set():
            self._finish(job, "cancelled", reason="cancelled")
            return True
        if job.remaining(self.config.session_budget_s) <= 0:
            self._finish(job, "published", reason=f"session budget of {self.config.session_budget_s:.0f} s exceeded")
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
        (job.dir / "state.json").write_text(json.dumps({"stage": stage, "stage_times": job.stage_times}))

    def _finish(
        self,
        job: _Job,
        status: Literal["published", "cancelled", "failed"],
        *,
        reason: str | None = None,
        grade: GradeResult | None = None,
    ) -> None:
        if job.done.done():
            return
        if job.cancel.is_set():  # a cancel that raced with the run still wins: nothing trainable is published
            status, reason, grade = "cancelled", reason or "cancelled", None
        session = job.session
        outcome = SessionOutcome(request_id=job.request.request_id, status=status, reason=reason, grade=grade)
        outcome.session_status = session.status if session else None
        if grade is not None and session is not None:
            try:
                outcome = self._with_traces(outcome, session, grade)
            except Exception as exc:  # a reconstruction bug must not kill the POSTRUN worker or strand the job
                outcome.reward, outcome.mask_sample = grade.reward, True
                outcome.reason = f"reconstruction failed: {exc!r}"
        if job.evaluator is not None:
            job.evaluator.close()
        self._enter(job, "done")
        outcome.stage_times = dict(job.stage_times)
        (job.dir / "outcome.json").write_text(outcome.model_dump_json(indent=2))
        job.done.set_result(outcome)
        del self.jobs[job.request.request_id]  # from now on submit() answers from outcome.json
        self.metrics.finish(outcome)
        if self.results.full():  # nobody is taking them: the oldest goes (it is in its future and on disk)
            self.results.get_nowait()
        self.results.put_nowait(outcome)
        if self.config.callback_url:
            task = asyncio.get_running_loop().create_task(self._deliver(outcome))
            self._deliveries.add(task)
            task.add_done_callback(self._deliveries.discard)
        self._group_done(job, outcome)

    def _with_traces(self, outcome: SessionOutcome, session: SessionResult, grade: GradeResult) -> SessionOutcome:
        built = prefix_merging(session.records)
        main = [t for t in built.traces if t.role == "main"]
        versions = sorted({v for t in built.traces for v in t.policy_versions if v is not None})
        outcome.metrics = {
            **built.stats,
            "calls": len(session.records),
            "policy_versions": versions,
            "grade_status": grade.status,
            "fail_to_pass": grade.fail_to_pass,
            "pass_to_pass": grade.pass_to_pass,
            "harness_s": session.timings.get("run_s"),
        }
        outcome.reward, outcome.mask_sample, outcome.reason = grade.reward, grade.mask_sample, grade.reason
        if not main:
            outcome.mask_sample, outcome.reason = True, "no main chain to train on"
        elif len(main) > 1:
            outcome.metrics["main_segments"] = len(main)
        if len(versions) > 1 and self.config.cross_version == "mask":
            outcome.mask_sample, outcome.reason = True, f"calls span policy versions {versions}"
        if main:
            outcome.output = gym_output_items(main[0], {r.call_id: r for r in session.records})
        return outcome

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
        marker = self.config.state_dir / outcome.request_id / "delivered.json"
        headers = {"Idempotency-Key": outcome.request_id}
        async with httpx.AsyncClient(timeout=30) as client:
            for attempt in range(self.config.callback_attempts):
                with contextlib.suppress(httpx.HTTPError):
                    resp = await client.post(
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
            if (directory / "outcome.json").exists():
                report.finished.append(directory.name)
                if self.config.callback_url and not (directory / "delivered.json").exists():
                    outcome = SessionOutcome.model_validate_json((directory / "outcome.json").read_text())
                    await self._deliver(outcome)
                    report.redelivered.append(directory.name)
            elif (directory / "state.json").exists():
                report.unfinished[directory.name] = json.loads((directory / "state.json").read_text())["stage"]
        return report


class GatewayThread:
    """A gateway on an event loop of its own, for hosts whose requests may run on other (or short-lived) loops — a
    web server's handlers, test clients, synchronous code: ``await host.run(request)`` from any loop, or
    ``host.run_sync(request)`` from a plain thread."""

    def __init__(self, config: GatewayConfig, proxy: ProxyClient) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="polar-gateway", daemon=True)
        self._thread.start()
        self.gateway = Gateway(config, proxy)
        self.recovery = self._call(self.gateway.start()).result()

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    async def _outcome(self, request: SessionRequest) -> SessionOutcome:
        return await (await self.gateway.submit(request))

    async def run(self, request: SessionRequest) -> SessionOutcome:
        return await asyncio.wrap_future(self._call(self._outcome(request)))

    def run_sync(self, request: SessionRequest) -> SessionOutcome:
        return self._call(self._outcome(request)).result()

    def close(self) -> None:
        if self.loop.is_closed():
            return
        self._call(self.gateway.stop()).result()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()
