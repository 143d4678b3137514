"""Ray scale-out: two gateway actors on a local Ray cluster, sessions spread by pressure, a gateway killed mid-run
and its sessions re-dispatched, a result written just before a death kept and never run twice. Sessions are
lightweight agent loops of real chat calls through real proxy sessions to the real engine (no CLI, no sandbox)."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
from pydantic import ValidationError

from nemo_polar.env.gateway import SessionOutcome, SessionRequest
from nemo_polar.env.gateway.ray import ControllerConfig, RolloutController
from nemo_polar.env.gateway.testing import ChatLoopGateway
from nemo_polar.env.runtime.attempt import AttemptDir
from nemo_polar.env.runtime.session import SessionResult
from nemo_polar.proxy.http.client import ProxyClient
from nemo_polar.rewards import bundled_instances
from tests.conftest import ProxyHandle

pytestmark = pytest.mark.engine
ROOT = Path(__file__).resolve().parents[1]
LIGHT = "tests.test_ray:LightGateway"
INSTANCE = bundled_instances()[0]


class LightGateway(ChatLoopGateway):
    """Chat-loop sessions (``turns`` calls ``hold_s`` apart, harness_options) on a gateway that can be made to die;
    a session with ``hold_until`` (a path) waits in its run stage until that file exists."""

    def run_harness(
        self, request: SessionRequest, attempt: AttemptDir, budget: float, cancel: threading.Event
    ) -> SessionResult:
        gate = request.harness_options.get("hold_until")
        while gate and not Path(gate).exists() and not cancel.wait(0.05):
            pass
        return super().run_harness(request, attempt, budget, cancel)

    def finished(self, request: SessionRequest, outcome: SessionOutcome) -> None:
        if request.harness_options.get("die_after_finish"):
            os._exit(1)  # the node goes down right after the result reached its disk, before it was returned


def light(rid: str, **options: Any) -> SessionRequest:
    options = {"max_tokens": 4, **options}
    return SessionRequest(request_id=rid, harness="light", instance=INSTANCE, harness_options=options)


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_USAGE_STATS_ENABLED", "0")  # no usage report: nothing leaves the machine
        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
        ray.init(
            address="local", num_cpus=4, include_dashboard=False, object_store_memory=200 * 2**20,
            log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": path, "RAY_USAGE_STATS_ENABLED": "0"}},
        )  # fmt: skip
        try:
            yield
        finally:
            ray.shutdown()


def controller(proxy: ProxyHandle, root: Path, **kw: Any) -> RolloutController:
    gateway = {"run_slots": 2, "init_workers": 2, "post_workers": 2, **kw.pop("gateway", {})}
    client = proxy.client()
    return RolloutController(
        ControllerConfig(root=root, proxy=client, gateways=2, gateway_cls=LIGHT, gateway=gateway, **kw)
    )


def saved(root: Path, outcome: SessionOutcome) -> SessionOutcome:
    path = root / outcome.metrics["gateway"] / outcome.request_id / "outcome.json"
    return SessionOutcome.model_validate_json(path.read_text())


def test_sessions_spread_over_both_gateways_by_pressure(cluster: None, proxy: ProxyHandle, tmp_path: Path) -> None:
    requests = [light(f"s{i}", turns=2, hold_s=0.3) for i in range(8)]
    busy = [light(f"busy{i}", turns=2, hold_s=1.0) for i in range(4)]
    later = [light(f"p{i}", turns=1) for i in range(6)]

    async def scenario() -> tuple[list[SessionOutcome], dict[str, int], list[int], list[SessionOutcome]]:
        async with controller(proxy, tmp_path) as ctl:
            futures = [ctl.submit(r) for r in requests]
            assert ctl.submit(requests[0]) is futures[0]  # idempotent by request id
            peak = {"gw0": 0, "gw1": 0}
            while not all(f.done() for f in futures):
                for p in await ctl.pressure():
                    peak[p.gateway] = max(peak[p.gateway], p.depths["run"])
                await asyncio.sleep(0.05)
            idle = [p.unfinished for p in await ctl.pressure()]
            # gw0 gets work from elsewhere (straight to the actor): 4 sessions for its 2 slots. New requests go
            # to gw1 until its load per slot reaches gw0's.
            direct = [ctl.actor("gw0").submit.remote(r) for r in busy]
            while {p.gateway: p.unfinished for p in await ctl.pressure()}["gw0"] < 4:
                await asyncio.sleep(0.05)
            placed_later = await ctl.run(later)
            await asyncio.gather(*direct)
            return [f.result() for f in futures], peak, idle, placed_later

    outcomes, peak, idle, placed_later = asyncio.run(scenario())
    assert [o.metrics["gateway"] for o in placed_later].count("gw1") >= 4, placed_later  # not round robin (3:3)
    assert [o.request_id for o in outcomes] == [r.request_id for r in requests]
    assert all(o.status == "published" and o.reward == 1.0 and not o.mask_sample for o in outcomes), outcomes
    placed = [o.metrics["gateway"] for o in outcomes]
    assert placed.count("gw0") == placed.count("gw1") == 4  # equal run slots: equal shares
    assert all(len(o.metrics["dispatches"]) == 1 for o in outcomes)
    assert 1 <= peak["gw0"] <= 2 and 1 <= peak["gw1"] <= 2 and idle == [0, 0]  # both ran, neither over its slots
    for o in outcomes:
        assert saved(tmp_path, o).reward == 1.0 and o.metrics["calls"] == 2
        session = json.loads((tmp_path / o.metrics["gateway"] / o.request_id / "session.json").read_text())
        records = proxy.disk_records(session["session_id"])
        assert len(records) == 2 and all(r["complete"] for r in records)
        assert o.output and all(it["generation_token_ids"] for it in o.output)


def test_a_killed_gateway_has_its_unfinished_sessions_redispatched(
    cluster: None, proxy: ProxyHandle, tmp_path: Path
) -> None:
    requests = [light(f"k{i}", turns=2, hold_s=0.5) for i in range(8)]

    async def scenario() -> tuple[list[SessionOutcome], set[str]]:
        async with controller(proxy, tmp_path) as ctl:
            task = asyncio.ensure_future(ctl.run(requests))
            # Kill gw0 once it has finished something and still has something unfinished.
            while not (list((tmp_path / "gw0").glob("*/outcome.json")) and "gw0" in ctl.assignments().values()):
                await asyncio.sleep(0.05)
            on_gw0 = {rid for rid, gw in ctl.assignments().items() if gw == "gw0"}
            ray.kill(ctl.actor("gw0"))
            outcomes = await asyncio.wait_for(task, 60)
            assert [p.gateway for p in await ctl.pressure()] == ["gw1"]
            return outcomes, on_gw0

    outcomes, on_gw0 = asyncio.run(scenario())
    kept = {p.parent.name for p in (tmp_path / "gw0").glob("*/outcome.json")}  # finished before the kill
    moved = on_gw0 - kept
    assert moved and kept
    assert sorted(o.request_id for o in outcomes) == sorted(r.request_id for r in requests)  # one each
    assert all(o.status == "published" and o.reward == 1.0 for o in outcomes), outcomes
    by_id = {o.request_id: o for o in outcomes}
    for rid in moved:  # unfinished on gw0 when it died: run again on gw1, recorded there
        assert by_id[rid].metrics["dispatches"] == ["gw0", "gw1"], by_id[rid]
        assert saved(tmp_path, by_id[rid]).request_id == rid
    for rid in kept:  # finished on gw0 before it died: not run again
        assert by_id[rid].metrics["dispatches"] == ["gw0"] and not (tmp_path / "gw1" / rid).exists()


def test_a_result_written_before_the_death_is_kept_and_the_rest_reported(
    cluster: None, proxy: ProxyHandle, tmp_path: Path
) -> None:
    """max_redispatch=0: the dying gateway's finished result is read from its disk, its others fail with a reason.
    The others wait in their run stage until the death is seen, so none can finish before it (no race on time);
    run slots for all, so none queues behind them."""
    release = tmp_path / "release"
    requests = [light("last-words", turns=1, die_after_finish=True)]
    requests += [light(f"d{i}", turns=2, hold_until=str(release)) for i in range(5)]

    async def scenario() -> list[SessionOutcome]:
        async with controller(proxy, tmp_path, max_redispatch=0, gateway={"run_slots": len(requests)}) as ctl:
            task = asyncio.ensure_future(ctl.run(requests))

            async def death_seen() -> None:
                while len(await ctl.pressure()) == 2:
                    await asyncio.sleep(0.05)

            await asyncio.wait_for(death_seen(), 60)
            release.touch()  # the survivors go on
            return await asyncio.wait_for(task, 60)

    outcomes = asyncio.run(scenario())
    assert [o.request_id for o in outcomes] == [r.request_id for r in requests]
    died = outcomes[0].metrics["gateway"]
    assert outcomes[0].status == "published" and outcomes[0].reward == 1.0
    assert outcomes[0] == saved(tmp_path, outcomes[0]).model_copy(update={"metrics": outcomes[0].metrics})
    lost = [o for o in outcomes[1:] if o.metrics["gateway"] == died]
    assert lost and all(o.status == "failed" and o.mask_sample for o in lost)
    assert all(f"gateway {died} died" in (o.reason or "") and "re-dispatched 0 times" in (o.reason or "") for o in lost)
    others = [o for o in outcomes[1:] if o.metrics["gateway"] != died]
    assert others and all(o.status == "published" for o in others)


def test_one_gateway_per_node_and_cancel_through_it(cluster: None, proxy: ProxyHandle, tmp_path: Path) -> None:
    async def scenario() -> tuple[list[Any], SessionOutcome]:
        config = ControllerConfig(root=tmp_path, proxy=proxy.client(), gateway_cls=LIGHT)
        async with RolloutController(config) as ctl:
            idle = await ctl.pressure()
            running = ctl.submit(light("c0", turns=20, hold_s=0.5))
            while not any(p.depths["run"] for p in await ctl.pressure()):
                await asyncio.sleep(0.05)
            assert await ctl.cancel("c0") and not await ctl.cancel("nope")
            return idle, await asyncio.wait_for(running, 30)

    (only,), cancelled = asyncio.run(scenario())  # a local cluster is one node
    assert only.node_id == ray.get_runtime_context().get_node_id() and only.free_slots == only.run_slots == 4
    assert cancelled.status == "cancelled" and cancelled.mask_sample and cancelled.reward is None
    assert "postrun" not in cancelled.stage_times  # stopped in RUN, well before its 20 turns


def test_bad_configuration_is_refused(tmp_path: Path) -> None:
    client = ProxyClient(url="http://127.0.0.1:9", admin_url="http://127.0.0.1:9")
    with pytest.raises(ValidationError, match="cannot be imported"):
        ControllerConfig(root=tmp_path, proxy=client, gateway_cls="tests.test_ray:NoSuchGateway")
    with pytest.raises(ValidationError, match="not an import path"):
        ControllerConfig(root=tmp_path, proxy=client, gateway_cls="LightGateway")
    with pytest.raises(ValidationError, match="not a subclass"):
        ControllerConfig(root=tmp_path, proxy=client, gateway_cls="pathlib:Path")
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        ControllerConfig(root=tmp_path, proxy=client, gateways=0)
    with pytest.raises(ValidationError, match="run_slots"):
        ControllerConfig(root=tmp_path, proxy=client, gateway={"run_slots": 0})
    with pytest.raises(ValidationError, match="state_dir"):
        ControllerConfig(root=tmp_path, proxy=client, gateway={"state_dir": tmp_path})
