"""A pool of proxy worker processes on one node, addressed as one proxy by the client side.

Each worker is a whole proxy (model and admin listeners, its own event loop and GIL) and every session lives on
exactly one of them: no front router relays the bytes (it would itself be the bottleneck a pool exists to remove);
whoever opens a session is handed that worker's address. A worker writes its index as the first byte of the session
ids it makes (:func:`~nemo_polar.proxy.store.sessions.worker_of`), so a session id alone names its worker, in any
process, with no table to share. The workers write into one record directory: a session's records are one file
named by its id, so reconstruction reads every worker's records as one store.

Weight sync is applied to every worker at once: :meth:`ProxyPool.pause` returns only when every worker has stopped
admitting (and drained, unless ``keep``), so the trainer swaps weights while no worker admits a call, and
:meth:`ProxyPool.resume` stamps the new version on all of them: the version boundary is the same for every worker.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from pydantic import BaseModel, Field, PrivateAttr

from nemo_polar.proxy.http.admission import AdmissionState
from nemo_polar.proxy.http.client import ProxyClient
from nemo_polar.proxy.store.records import CallRecord, read_records
from nemo_polar.proxy.store.sessions import SESSION_ID, worker_of

T = TypeVar("T")


class PoolError(RuntimeError):
    """An admin operation failed on one or more workers (each named with its admin address)."""


class PoolState(BaseModel):
    """The workers' admission states and what they add up to."""

    paused: bool = Field(description="every worker is paused")
    policy_version: int | None = Field(description="the version every worker stamps (None if they disagree)")
    consistent: bool = Field(description="every worker stamps the same version and is in the same paused state")
    in_flight: int
    drained: bool | None = Field(default=None, description="pause: every worker drained")
    waited_s: float | None = Field(default=None, description="pause: the longest any worker waited")
    workers: list[AdmissionState]


def _summary(states: list[AdmissionState]) -> PoolState:
    versions = {s.policy_version for s in states}
    consistent = len(versions) == 1 and len({s.paused for s in states}) == 1
    drains = [s.drained for s in states]
    waits = [s.waited_s for s in states if s.waited_s is not None]
    return PoolState(
        paused=all(s.paused for s in states),
        policy_version=versions.pop() if len(versions) == 1 else None,
        consistent=consistent,
        in_flight=sum(s.in_flight for s in states),
        drained=None if None in drains else all(drains),
        waited_s=max(waits) if waits else None,
        workers=states,
    )


class ProxyPool(BaseModel):
    """The workers' addresses (one :class:`ProxyClient` each, in worker order): a plain picklable model (Ray)."""

    workers: list[ProxyClient] = Field(min_length=1, max_length=256)
    record_dir: Path | None = Field(
        default=None, description="the workers' record directory, as this side reads it: a dead worker's answers"
    )
    retired: set[int] = Field(
        default_factory=set,
        description="workers taken out (dead, :meth:`retire`): given no new session and no admin operation; their "
        "sessions' answered records are read from record_dir",
    )
    scrape_timeout_s: float = Field(
        default=5.0,
        gt=0,
        description="how long a metrics scrape waits for each worker: a hung one is then reported down, and the "
        "scrape answers within a Prometheus scrape's timeout (10 s by default)",
    )
    _turn: int = PrivateAttr(default=0)  # racing threads may both take one worker: no harm, so no lock to pickle

    @property
    def live(self) -> list[ProxyClient]:
        """The workers not retired, in worker order."""
        return [w for i, w in enumerate(self.workers) if i not in self.retired]

    def retire(self, index: int) -> None:
        """Take a dead worker out: weight syncs and new sessions go on without it (its sessions are lost for new
        calls; what they answered stays readable from ``record_dir``)."""
        if not 0 <= index < len(self.workers):
            raise ValueError(f"no worker {index}: this pool has {len(self.workers)}")
        if self.retired | {index} >= set(range(len(self.workers))):
            raise ValueError(f"retiring worker {index} would leave this pool no worker")
        self.retired.add(index)

    def for_key(self, key: str) -> ProxyClient:
        """The live worker a stable key (a rollout's request id) is pinned to: the same one in every process that
        has the same workers retired."""
        digest = hashlib.sha256(key.encode()).digest()
        live = self.live
        return live[int.from_bytes(digest[:8], "big") % len(live)]

    def worker_for(self, session_id: str) -> ProxyClient:
        """The worker holding ``session_id`` (named by the id itself; a pool of one holds every session)."""
        if len(self.workers) == 1:
            return self.workers[0]
        index = worker_of(session_id)
        if index is None:
            raise ValueError(f"{session_id!r} is not a proxy session id")
        if index >= len(self.workers):
            raise ValueError(f"session {session_id} names worker {index}; this pool has {len(self.workers)}")
        return self.workers[index]

    def create_session(self, config: dict[str, Any], *, pin: str | None = None) -> tuple[str, str, ProxyClient]:
        """Open a session on the worker ``pin`` is pinned to, else on the next worker in turn: its id, its key and
        the worker, whose ``url`` is the one the session's harness must call."""
        if pin is not None:
            worker = self.for_key(pin)
        else:
            live = self.live
            worker, self._turn = live[self._turn % len(live)], self._turn + 1
        session_id, api_key = worker.create_session(config)
        return session_id, api_key, worker

    def records(self, session_id: str) -> list[CallRecord]:
        """A session's records from its worker; if the worker is unreachable (it died), the records it answered,
        from its file in ``record_dir`` (each was written and fsync'd before its answer left the worker)."""
        worker = self.worker_for(session_id)
        path = self.record_dir / f"{session_id}.jsonl" if self.record_dir and SESSION_ID.match(session_id) else None
        try:
            if worker in self.live:
                return worker.records(session_id)
            raise ConnectionError(f"worker at {worker.admin_url} is retired")
        except ConnectionError:
            if path is None or not path.exists():
                raise
            return read_records(path, written=True)  # a line it died writing was never answered

    def close(self, session_id: str) -> None:
        """Close a session on its worker; on a retired worker there is nothing left to close (its keys died)."""
        worker = self.worker_for(session_id)
        if worker in self.live:
            worker.close(session_id)

    def _each(self, op: Callable[[ProxyClient], T]) -> list[T]:
        """``op`` on every live worker at once; every failure raised together, each worker named."""
        live = self.live
        with ThreadPoolExecutor(len(live)) as pool:
            futures = [pool.submit(op, w) for w in live]
        failed = [(w, f.exception()) for w, f in zip(live, futures, strict=True) if f.exception()]
        if failed:
            raise PoolError("; ".join(f"worker at {w.admin_url}: {exc}" for w, exc in failed))
        return [f.result() for f in futures]

    def pause(self, timeout_s: float, keep: bool = False) -> PoolState:
        """Stop every worker admitting generations, each waiting up to ``timeout_s`` for its in-flight ones (unless
        ``keep``), all at once. Weights may be swapped only once this returned ``drained`` (or with ``keep``); if a
        worker fails it raises, naming it, and the workers it reached stay paused until :meth:`resume` (a dead worker:
        :meth:`retire` it, and sync the others)."""
        return _summary(self._each(lambda w: AdmissionState.model_validate(w.pause(timeout_s, keep))))

    def resume(self, policy_version: int | None = None) -> PoolState:
        """Admit generations again on every worker, ``policy_version`` stamped from now on by all of them."""
        return _summary(self._each(lambda w: AdmissionState.model_validate(w.resume(policy_version))))

    def health(self) -> PoolState:
        return _summary(self._each(lambda w: AdmissionState.model_validate(w.health())))

    def sessions(self) -> int:
        """Sessions created on all the workers."""
        return sum(self._each(lambda w: int(w.health()["sessions"])))

    def metrics(self) -> str:
        """Every worker's Prometheus metrics as one exposition, each sample labelled ``worker="<index>"`` (sum by
        the other labels for the node's figures), and ``polar_pool_worker_up{worker}``: 1 for a worker that answered,
        0 for one retired, unreachable or not answering within ``scrape_timeout_s``, whose samples are then absent. A
        scrape never fails for one dead or hung worker: ``up`` says which."""
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Labelled(self._scrape()))
        return generate_latest(registry).decode()

    def _scrape(self) -> list[str | None]:
        """Each worker's metrics text by worker index, None where it is retired or did not answer."""

        def one(index: int, worker: ProxyClient) -> str | None:
            if index in self.retired:
                return None
            try:
                return worker.metrics(self.scrape_timeout_s)
            except (ConnectionError, RuntimeError):
                return None

        with ThreadPoolExecutor(len(self.workers)) as pool:
            return list(pool.map(one, range(len(self.workers)), self.workers))

    def total(self, sample: str, **labels: str) -> float:
        """A sample (``polar_calls_total``) summed over the workers, over the samples carrying ``labels``."""
        return sum(
            s.value
            for text in self._each(lambda w: w.metrics())
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == sample and labels.items() <= s.labels.items()
        )


class _Labelled(Collector):
    """The workers' parsed metric families (by worker index; None: the worker did not answer), merged by name, each
    sample labelled with its worker, and each worker's ``up``."""

    def __init__(self, texts: list[str | None]) -> None:
        self.texts = texts

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "polar_pool_worker_up", "1: the worker answered this scrape; 0: retired or unreachable", labels=["worker"]
        )
        merged: dict[str, Metric] = {}
        for index, text in enumerate(self.texts):
            up.add_metric([str(index)], 0.0 if text is None else 1.0)
            for family in text_string_to_metric_families(text or ""):
                into = merged.setdefault(family.name, Metric(family.name, family.documentation, family.type))
                into.samples += [s._replace(labels={**s.labels, "worker": str(index)}) for s in family.samples]
        yield up
        yield from merged.values()


def session_proxy(proxy: ProxyClient | ProxyPool, key: str) -> ProxyClient:
    """The proxy one session's harness talks to: a pool's worker pinned to ``key`` (a rollout's request id), or the
    one proxy there is."""
    return proxy.for_key(key) if isinstance(proxy, ProxyPool) else proxy


def admission(state: dict[str, Any] | PoolState) -> dict[str, Any]:
    """A pause's or resume's answer as one shape: a proxy's admission state, or a pool's summary of its workers'."""
    return state if isinstance(state, dict) else state.model_dump(mode="json")


def unreachable(proxy: ProxyClient) -> str | None:
    """Why ``proxy``'s admin API does not answer (its process died), or None when it answers."""
    try:
        proxy.health()
    except ConnectionError as exc:
        return str(exc)
    return None
