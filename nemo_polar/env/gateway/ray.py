"""Ray scale-out: rollout gateways as Ray actors, and a controller that spreads sessions over them by pressure and
survives a gateway dying.

- :class:`GatewayActor` wraps one :class:`~nemo_polar.env.gateway.Gateway` in an async Ray actor (the gateway's
  stage pools run on the actor's own event loop). One per node in production; several on one machine in tests.
- :class:`RolloutController` starts the actors, each with its own ``state_dir`` under ``root``, sends each request to
  the live gateway with the least load per run slot, and awaits its outcome. When an actor dies, every request it
  had not finished is first looked up in the dead gateway's ``state_dir`` (a result written before the death is
  returned as it is, never run twice), then re-dispatched to a survivor at most ``max_redispatch`` times, then
  reported as a ``failed`` outcome with the reason. No request is silently lost.

Idempotency is keyed on the request id. The controller reads a dead gateway's ``outcome.json`` from ``root``, so it
sees it when ``root`` is one filesystem (one machine, or a shared mount across nodes); on its own node it first
waits for the dead process to exit (Ray reports a death a little before that). With a node-local ``root`` a
dead node's disk is out of reach: a session that finished in the instant between writing its outcome and returning
it is run again on a survivor (at least once, same request id; the trainer dedupes by it), and the dead node's own
outcome stays on its disk, where a gateway restarted on that node reports it from ``recover()``.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import time
from pathlib import Path
from typing import Annotated, Any, Literal

import ray
from pydantic import BaseModel, ConfigDict, Field, computed_field, field_validator, model_validator
from ray.exceptions import RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from nemo_polar.env.gateway.gateway import Gateway
from nemo_polar.env.gateway.models import GatewayConfig, RecoveryReport, SessionOutcome, SessionRequest
from nemo_polar.env.runtime.attempt import AttemptDir
from nemo_polar.env.runtime.verdict import Verdict, VerdictKind
from nemo_polar.proxy.http.client import ProxyClient
from nemo_polar.proxy.http.pool import ProxyPool


def resolve_gateway_cls(spec: str | type) -> type[Gateway]:
    """``"package.module:Class"`` (or ``"package.module.Class"``) or the class itself; must subclass Gateway."""
    if isinstance(spec, str):
        module_name, sep, attr = spec.partition(":") if ":" in spec else spec.rpartition(".")
        if not sep or not module_name or not attr:
            raise ValueError(f"gateway_cls {spec!r} is not an import path like 'package.module:Class'")
        try:
            cls = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"gateway_cls {spec!r} cannot be imported: {exc}") from None
    else:
        cls = spec
    if not (isinstance(cls, type) and issubclass(cls, Gateway)):
        raise ValueError(f"gateway_cls {spec!r} is not a subclass of nemo_polar.env.gateway.Gateway")
    return cls


class Pressure(BaseModel):
    """One gateway's load, as its own stage depths report it."""

    gateway: str
    node_id: str
    run_slots: int
    depths: dict[str, int]
    request_ids: list[str] = Field(default_factory=list, repr=False, description="its unfinished requests")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def free_slots(self) -> int:
        return max(self.run_slots - self.depths.get("run", 0), 0)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def backlog(self) -> int:
        """Sessions waiting for or in INIT, or prepared and waiting for a run slot."""
        return sum(self.depths.get(s, 0) for s in ("queued", "init", "ready"))

    @computed_field  # type: ignore[prop-decorator]
    @property
    def unfinished(self) -> int:
        return sum(self.depths.values())


class GatewayActor:
    """One gateway in a Ray actor. All methods are coroutines, which makes it an async actor: the gateway's workers
    and the concurrent ``submit`` calls share the actor's event loop."""

    def __init__(
        self, name: str, config: GatewayConfig, proxy: ProxyClient | ProxyPool, gateway_cls: str | type
    ) -> None:
        self.name = name
        self.gateway = resolve_gateway_cls(gateway_cls)(config, proxy)

    async def start(self) -> RecoveryReport:
        return await self.gateway.start()

    async def where(self) -> tuple[str, int]:
        """The node and process this gateway runs in: the controller waits for that process to be gone."""
        return ray.get_runtime_context().get_node_id(), os.getpid()

    async def submit(self, request: SessionRequest) -> SessionOutcome:
        """Returns when the session is done (idempotent by request id, also across a restart on the same disk)."""
        return await (await self.gateway.submit(request))

    async def cancel(self, request_id: str) -> bool:
        return self.gateway.cancel(request_id)

    async def pressure(self) -> Pressure:
        return Pressure(
            gateway=self.name,
            node_id=ray.get_runtime_context().get_node_id(),
            run_slots=self.gateway.config.run_slots,
            depths=self.gateway.depths(),
            request_ids=[rid for rid, job in self.gateway.jobs.items() if not job.done.done()],
        )

    async def recover(self) -> RecoveryReport:
        return await self.gateway.recover()

    async def stop(self) -> None:
        await self.gateway.stop()


class ControllerConfig(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)

    root: Path = Field(description="each gateway's state_dir is root/<gateway name>")
    proxy: ProxyClient | ProxyPool
    gateways: Annotated[int, Field(ge=1)] | Literal["per_node"] = Field(
        default="per_node", description="how many gateway actors, or one pinned to each alive Ray node"
    )
    gateway_cls: str | type = "nemo_polar.env.gateway.gateway:Gateway"
    gateway: dict[str, Any] = Field(default_factory=dict, description="GatewayConfig fields except state_dir")
    max_redispatch: int = Field(default=1, ge=0, description="re-dispatches per request after gateway deaths")
    death_wait_s: float = Field(
        default=30.0, gt=0, description="how long to wait for a dead gateway's process to exit (same node only)"
    )
    actor_options: dict[str, Any] = Field(default_factory=dict, description="extra options for .options()")

    @field_validator("gateway_cls")
    @classmethod
    def _importable(cls, value: str | type) -> str | type:
        resolve_gateway_cls(value)
        return value

    @model_validator(mode="after")
    def _gateway_config(self) -> ControllerConfig:
        if "state_dir" in self.gateway:
            raise ValueError("gateway.state_dir is set per gateway under root; leave it out")
        GatewayConfig(state_dir=self.root, **self.gateway)  # fail here, not inside N actors
        return self


class _Handle:
    def __init__(self, name: str, actor: Any, run_slots: int) -> None:
        self.name = name
        self.actor = actor
        self.run_slots = run_slots
        self.alive = True
        self.assigned: set[str] = set()  # dispatched here and not yet returned: counted before the actor sees them
        self.node_id = ""
        self.pid = 0
        self.gone: asyncio.Task[None] | None = None


class RolloutController:
    """Lives on the driver as a plain object rather than as another actor: the trainer that owns the requests
    awaits outcomes directly (Ray object refs are awaitable), and a controller actor would be one more process
    whose death needs the same handling, while the driver's death ends the training job anyway."""

    def __init__(self, config: ControllerConfig) -> None:
        self.config = config
        self.gateways: dict[str, _Handle] = {}
        self.outcomes: dict[str, SessionOutcome] = {}
        self._tasks: dict[str, asyncio.Task[SessionOutcome]] = {}
        self._cancelled: set[str] = set()

    # -- lifecycle ---------------------------------------------------------------------------------------------
    async def start(self) -> dict[str, RecoveryReport]:
        if not ray.is_initialized():
            raise RuntimeError("ray.init() first: the controller places gateways on the running Ray cluster")
        cfg = self.config
        remote = ray.remote(GatewayActor)
        # max_restarts=0: a dead gateway stays dead and its requests move; the controller owns recovery.
        base: dict[str, Any] = {"max_restarts": 0, "max_concurrency": 10_000, **cfg.actor_options}
        if cfg.gateways == "per_node":
            nodes = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])
            placements = [{"scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=False)} for node in nodes]
        else:
            placements = [{} for _ in range(cfg.gateways)]
        for i, placement in enumerate(placements):
            name = f"gw{i}"
            gw_config = GatewayConfig(state_dir=cfg.root / name, **cfg.gateway)
            actor = remote.options(**base, **placement).remote(name, gw_config, cfg.proxy, cfg.gateway_cls)
            self.gateways[name] = _Handle(name, actor, gw_config.run_slots)
        handles = list(self.gateways.values())
        places = await asyncio.gather(*(h.actor.where.remote() for h in handles))
        for handle, (node_id, pid) in zip(handles, places, strict=True):
            handle.node_id, handle.pid = node_id, pid
        reports = await asyncio.gather(*(h.actor.start.remote() for h in handles))
        return dict(zip(self.gateways, reports, strict=True))

    async def stop(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        live = [h for h in self.gateways.values() if h.alive]
        await asyncio.gather(*(h.actor.stop.remote() for h in live), return_exceptions=True)
        for handle in live:
            ray.kill(handle.actor)
            handle.alive = False

    async def __aenter__(self) -> RolloutController:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- API ---------------------------------------------------------------------------------------------------
    async def run(self, requests: list[SessionRequest]) -> list[SessionOutcome]:
        return list(await asyncio.gather(*(self.submit(r) for r in requests)))

    def submit(self, request: SessionRequest) -> asyncio.Future[SessionOutcome]:
        """The request's outcome, however many gateways it took; the same future again for the same request id."""
        rid = request.request_id
        if rid not in self._tasks:
            self._tasks[rid] = asyncio.ensure_future(self._drive(request))
        return self._tasks[rid]

    async def cancel(self, request_id: str) -> bool:
        """True if the request was unfinished: its outcome will be ``cancelled``, whatever its gateway does."""
        task = self._tasks.get(request_id)
        if task is None or task.done():
            return False
        self._cancelled.add(request_id)  # also stops a re-dispatch if its gateway dies meanwhile
        handle = next((h for h in self.gateways.values() if request_id in h.assigned), None)
        if handle is not None:
            try:
                await handle.actor.cancel.remote(request_id)  # kills a running harness
            except RayActorError:
                await self._dead(handle)
        return True

    async def pressure(self) -> list[Pressure]:
        """The live gateways' pressure; a gateway that does not answer is marked dead."""
        live = [h for h in self.gateways.values() if h.alive]
        answers = await asyncio.gather(*(h.actor.pressure.remote() for h in live), return_exceptions=True)
        result = []
        for handle, answer in zip(live, answers, strict=True):
            if isinstance(answer, RayActorError):
                await self._dead(handle)
            elif isinstance(answer, BaseException):
                raise answer
            else:
                result.append(answer)
        return result

    def actor(self, name: str) -> Any:
        return self.gateways[name].actor

    def assignments(self) -> dict[str, str]:
        """Request id -> the gateway running it now."""
        return {rid: h.name for h in self.gateways.values() for rid in h.assigned}

    # -- dispatch ----------------------------------------------------------------------------------------------
    async def _pick(self) -> _Handle | None:
        by_name = {p.gateway: p for p in await self.pressure()}
        live = [h for h in self.gateways.values() if h.alive and h.name in by_name]
        if not live:
            return None

        def score(h: _Handle) -> tuple[float, int, str]:
            p = by_name[h.name]
            # Unfinished sessions per run slot. The actor's view lags dispatches still on their way to it, the
            # controller's misses work submitted to the gateway by others: the union of the two counts both.
            load = len(h.assigned.union(p.request_ids))
            return (load / h.run_slots, p.backlog, h.name)

        return min(live, key=score)

    async def _drive(self, request: SessionRequest) -> SessionOutcome:
        rid, attempts, history = request.request_id, 0, []
        while True:
            if rid in self._cancelled:
                return self._record(request, "cancelled", "cancelled", history)
            handle = await self._pick()
            if rid in self._cancelled:
                return self._record(request, "cancelled", "cancelled", history)
            if handle is None:
                tried = ", ".join(history) or "none"
                return self._record(request, "failed", f"no live gateway left (tried: {tried})", history)
            handle.assigned.add(rid)
            history.append(handle.name)
            try:
                outcome: SessionOutcome = await handle.actor.submit.remote(request)
            except RayActorError as exc:
                await self._dead(handle)
                saved = AttemptDir(self.config.root / handle.name / rid).outcome
                if saved.exists():  # finished before the death: its result stands, never run twice
                    return self._keep(SessionOutcome.model_validate_json(saved.read_text()), history)
                if attempts >= self.config.max_redispatch:
                    reason = f"gateway {handle.name} died ({type(exc).__name__}); re-dispatched {attempts} times"
                    return self._record(request, "failed", reason, history)
                attempts += 1
                continue
            except Exception as exc:  # the gateway itself raised: deterministic, so reported rather than retried
                return self._record(request, "failed", f"gateway {handle.name} raised: {exc}", history)
            finally:
                handle.assigned.discard(rid)
            if rid in self._cancelled and outcome.status != "cancelled":
                # The cancel reached the actor before the request did (async actors do not order calls):
                # the gateway's rule still holds, a cancelled request publishes nothing trainable.
                outcome.status, outcome.verdict = "cancelled", Verdict(kind="cancelled", reason="cancelled")
            return self._keep(outcome, history)

    async def _dead(self, handle: _Handle) -> None:
        """Mark the gateway dead and return once its process is gone. Ray reports a death before the process has
        exited (by some milliseconds, more under load); until then it can still write an outcome, and reading its
        disk earlier would run that request twice."""
        if handle.alive:
            handle.alive = False
            ray.kill(handle.actor)  # fence it: a gateway given up on must not publish late
        if handle.gone is None:
            handle.gone = asyncio.ensure_future(self._exited(handle))
        await asyncio.shield(handle.gone)

    async def _exited(self, handle: _Handle) -> None:
        if handle.node_id != ray.get_runtime_context().get_node_id():
            return  # another node's process is out of sight (and so, unless root is shared, is its disk)
        deadline = time.monotonic() + self.config.death_wait_s
        while time.monotonic() < deadline:
            try:
                os.kill(handle.pid, 0)
            except ProcessLookupError:
                return
            await asyncio.sleep(0.01)

    def _record(
        self, request: SessionRequest, status: Literal["cancelled", "failed"], reason: str, history: list[str]
    ) -> SessionOutcome:
        kind: VerdictKind = "cancelled" if status == "cancelled" else "gateway_failed"
        verdict = Verdict(kind=kind, reason=reason)
        outcome = SessionOutcome(request_id=request.request_id, status=status, verdict=verdict)
        return self._keep(outcome, history)

    def _keep(self, outcome: SessionOutcome, history: list[str]) -> SessionOutcome:
        outcome.metrics = {**outcome.metrics, "gateway": history[-1] if history else None, "dispatches": history}
        self.outcomes[outcome.request_id] = outcome
        return outcome
