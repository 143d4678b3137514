"""The rollout gateway: staged pools that overlap INIT and POSTRUN with RUN, budgets, cancellation, early stop of
stragglers, durable state across a restart, and at-least-once idempotent delivery. Real CLI (Pi), real engine,
real grader, bwrap."""

from __future__ import annotations

import asyncio
import gc
import json
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI, Request, Response

from nemo_polar.env.gateway import Gateway, GatewayConfig, SessionOutcome, SessionRequest
from nemo_polar.env.gateway.testing import ChatLoopGateway
from nemo_polar.proxy.http.serve import BackgroundServer
from nemo_polar.rewards import bundled_instances
from tests.conftest import ProxyHandle

pytestmark = pytest.mark.engine
INSTANCES = bundled_instances()


def request(i: int, **kw: object) -> SessionRequest:
    return SessionRequest(request_id=f"r{i}", harness="pi", instance=INSTANCES[i], scripted=True, **kw)  # type: ignore[arg-type]


def hanging(i: int, **kw: object) -> SessionRequest:
    """A session whose agent runs a command that never finishes in time."""
    inst = INSTANCES[i].model_copy(
        update={"script": [{"kind": "shell", "command": "sleep 120"}, {"kind": "final", "text": "x"}]}
    )
    return SessionRequest(request_id=f"h{i}", harness="pi", instance=inst, scripted=True, **kw)  # type: ignore[arg-type]


def gateway(proxy: ProxyHandle, tmp: Path, **kw: object) -> Gateway:
    return Gateway(GatewayConfig(state_dir=tmp / "state", **kw), proxy.client())  # type: ignore[arg-type]


def test_stages_overlap_and_results_are_rewarded(proxy: ProxyHandle, tmp_path: Path) -> None:
    async def scenario() -> list[SessionOutcome]:
        async with gateway(proxy, tmp_path, init_workers=2, run_slots=1, post_workers=1) as gw:
            futures = [await gw.submit(request(i)) for i in range(3)]
            assert await gw.submit(request(0)) is futures[0]  # idempotent by request id
            return list(await asyncio.gather(*futures))

    outcomes = asyncio.run(scenario())
    assert [o.status for o in outcomes] == ["published"] * 3
    assert [o.reward for o in outcomes] == [1.0] * 3 and not any(o.mask_sample for o in outcomes)
    for o in outcomes:
        assert o.metrics["calls"] >= 4 and o.metrics["traces"] == 1 and o.metrics["grade_status"] == "resolved"
        ids = [it["generation_token_ids"] for it in o.output]
        assert ids and all(ids)
    # In the order they held the run slot (two INIT workers may finish in either order):
    first, second, third = sorted((o.stage_times for o in outcomes), key=lambda t: t["run"])
    assert second["ready"] < first["postrun"]  # INIT of a later session overlapped an earlier RUN
    assert second["run"] < first["done"]  # POSTRUN of an earlier session overlapped a later RUN
    assert third["ready"] < second["postrun"]
    saved = json.loads((tmp_path / "state" / "r0" / "outcome.json").read_text())
    assert saved["reward"] == 1.0 and (tmp_path / "state" / "r0" / "records.jsonl").exists()


def test_cancel_during_run_kills_the_harness_and_publishes_nothing_trainable(
    proxy: ProxyHandle, tmp_path: Path
) -> None:
    async def scenario() -> tuple[SessionOutcome, SessionOutcome]:
        # One INIT worker: h0 is prepared first, so it (not r1) takes the only run slot.
        async with gateway(proxy, tmp_path, init_workers=1, run_slots=1) as gw:
            running = await gw.submit(hanging(0))
            queued = await gw.submit(request(1))
            while gw.jobs["h0"].stage != "run" or not list((tmp_path / "state" / "h0").glob("harness.*")):
                await asyncio.sleep(0.1)
            assert gw.cancel("r1")  # waiting for the only run slot, held by h0
            await asyncio.sleep(1)
            assert gw.jobs["h0"].stage == "run"
            assert gw.cancel("h0")
            assert not gw.cancel("nope")
            return await asyncio.wait_for(running, 30), await asyncio.wait_for(queued, 30)

    running, queued = asyncio.run(scenario())
    for outcome in (running, queued):
        assert outcome.status == "cancelled" and outcome.mask_sample and outcome.reward is None, outcome
    assert running.session_status == "cancelled"
    assert queued.session_status is None and "run" not in queued.stage_times  # never ran


def test_agent_budget_masks_a_straggler(proxy: ProxyHandle, tmp_path: Path) -> None:
    async def scenario() -> SessionOutcome:
        async with gateway(proxy, tmp_path, agent_budget_s=5) as gw:
            return await (await gw.submit(hanging(0)))

    outcome = asyncio.run(scenario())
    assert outcome.status == "published" and outcome.mask_sample and outcome.reward is None
    assert outcome.session_status == "timeout" and "timeout" in (outcome.reason or "")


def test_early_stop_once_the_group_is_complete(proxy: ProxyHandle, tmp_path: Path) -> None:
    async def scenario() -> list[SessionOutcome]:
        async with gateway(proxy, tmp_path, run_slots=1, init_workers=1) as gw:
            futures = [await gw.submit(request(0, group_id="g", group_needed=1))]
            futures += [await gw.submit(hanging(i, group_id="g", group_needed=1)) for i in (1, 2)]
            return list(await asyncio.gather(*futures))

    outcomes = asyncio.run(scenario())
    assert outcomes[0].status == "published" and outcomes[0].reward == 1.0
    assert [o.status for o in outcomes[1:]] == ["cancelled", "cancelled"]


@pytest.fixture
def receiver() -> Iterator[tuple[str, list[dict]]]:
    """A callback endpoint that fails its first delivery, then accepts (and dedupes by idempotency key)."""
    app = FastAPI()
    seen: list[dict] = []

    @app.post("/results")
    async def results(req: Request) -> Response:
        seen.append({"key": req.headers.get("idempotency-key"), "body": await req.json()})
        return Response(status_code=500 if len(seen) == 1 else 200)

    with BackgroundServer(app) as server:
        yield f"{server.url}/results", seen


def test_restart_keeps_finished_results_redelivers_and_reports_the_rest(
    proxy: ProxyHandle, tmp_path: Path, receiver: tuple[str, list[dict]]
) -> None:
    url, seen = receiver

    async def first_life() -> SessionOutcome:
        async with gateway(proxy, tmp_path, callback_url=url) as gw:
            outcome = await (await gw.submit(request(0)))
            for _ in range(100):  # delivery is asynchronous: first attempt refused, second accepted
                if (tmp_path / "state" / "r0" / "delivered.json").exists():
                    break
                await asyncio.sleep(0.1)
            return outcome

    outcome = asyncio.run(first_life())
    assert [s["key"] for s in seen] == ["r0", "r0"]
    assert json.loads((tmp_path / "state" / "r0" / "delivered.json").read_text())["attempts"] == 2
    # A crash left one session mid-run and one result unacknowledged.
    (tmp_path / "state" / "r9").mkdir()
    (tmp_path / "state" / "r9" / "state.json").write_text(json.dumps({"stage": "run", "stage_times": {}}))
    (tmp_path / "state" / "r0" / "delivered.json").unlink()

    async def second_life() -> tuple[object, SessionOutcome]:
        gw = gateway(proxy, tmp_path, callback_url=url)
        report = await gw.start()
        again = await (await gw.submit(request(0)))  # finished before the restart: not run twice
        await gw.stop()
        return report, again

    report, again = asyncio.run(second_life())
    assert report.finished == ["r0"] and report.redelivered == ["r0"]  # type: ignore[attr-defined]
    assert report.unfinished == {"r9": "run"}  # type: ignore[attr-defined]
    assert again.reward == outcome.reward == 1.0 and again.stage_times == outcome.stage_times
    assert len(seen) == 3 and seen[-1]["body"]["request_id"] == "r0"  # at least once, same key


def test_bad_requests_are_refused() -> None:
    with pytest.raises(ValueError, match="request_id"):
        SessionRequest(request_id="../x", harness="pi", instance=INSTANCES[0])


def test_a_broken_instance_fails_in_init_without_a_trainable_result(proxy: ProxyHandle, tmp_path: Path) -> None:
    broken = INSTANCES[0].model_copy(update={"repo_path": tmp_path / "missing"})

    async def scenario() -> SessionOutcome:
        async with gateway(proxy, tmp_path) as gw:
            req = SessionRequest(request_id="b0", harness="pi", instance=broken, scripted=True)
            return await (await gw.submit(req))

    outcome = asyncio.run(scenario())
    assert outcome.status == "failed" and outcome.mask_sample and "does not exist" in (outcome.reason or "")


def light(rid: str, group: str, needed: int | None = None) -> SessionRequest:
    """A chat-loop session: one real call through a real proxy session, an instant grade."""
    options = {"turns": 1, "max_tokens": 4}
    return SessionRequest(
        request_id=rid, harness="chat_loop", instance=INSTANCES[0], harness_options=options, group_id=group,
        group_needed=needed,
    )  # fmt: skip


def scanned_depths(gw: Gateway) -> dict[str, int]:
    """Stage depths counted the slow way, over every held job."""
    stages = [j.stage for j in gw.jobs.values() if not j.done.done()]
    return {s: stages.count(s) for s in ("queued", "init", "ready", "run", "postrun")}


def test_finished_jobs_leave_memory_and_answer_from_disk(proxy: ProxyHandle, tmp_path: Path) -> None:
    async def scenario() -> None:
        config = GatewayConfig(state_dir=tmp_path / "state", run_slots=2, ready_buffer=1, results_buffer=3)
        async with ChatLoopGateway(config, proxy.client()) as gw:
            futures = [await gw.submit(light(f"a{i}", "g", needed=4)) for i in range(4)]
            futures += [await gw.submit(light(f"b{i}", "h")) for i in range(2)]
            job = weakref.ref(gw.jobs["a0"])
            while not all(f.done() for f in futures):
                assert gw.depths() == scanned_depths(gw)  # kept on every stage change, exact at all times
                await asyncio.sleep(0.005)
            outcomes = [f.result() for f in futures]
            assert [o.status for o in outcomes] == ["published"] * 6 and not any(o.mask_sample for o in outcomes)
            assert gw.jobs == {} and gw.depths() == dict.fromkeys(scanned_depths(gw), 0)
            assert gw._groups == {} and gw._group_jobs == {}  # no group has a live job left
            assert gw.results.qsize() == 3  # the newest results; all six are in their futures and on disk
            gc.collect()
            assert job() is None  # nothing holds a finished job (its session, records, evaluator)

            again = await gw.submit(light("a0", "g", needed=4))  # answered from outcome.json, not run again
            assert again.done() and again.result().model_dump() == outcomes[0].model_dump()
            assert gw.jobs == {} and not gw.cancel("a0")
            assert sum(1 for _ in (tmp_path / "state").glob("*/outcome.json")) == 6

    asyncio.run(scenario())


def test_a_group_is_dropped_once_it_has_no_live_job(proxy: ProxyHandle, tmp_path: Path) -> None:
    async def scenario() -> list[SessionOutcome]:
        config = GatewayConfig(state_dir=tmp_path / "state", init_workers=1, run_slots=1, ready_buffer=1)
        async with ChatLoopGateway(config, proxy.client()) as gw:
            futures = [await gw.submit(light(f"s{i}", "g", needed=1)) for i in range(3)]
            outcomes = list(await asyncio.gather(*futures))
            assert gw._groups == {} and gw._group_jobs == {} and gw.jobs == {}
            # A later request with the same group id starts a fresh count instead of being stopped at once.
            outcomes.append(await (await gw.submit(light("s3", "g", needed=1))))
            assert gw._groups == {} and gw._group_jobs == {}
            return outcomes

    outcomes = asyncio.run(scenario())
    # The first trainable result (almost always s0's) completes the group and stops the other two.
    assert sorted(o.status for o in outcomes[:3]) == ["cancelled", "cancelled", "published"]
    assert outcomes[3].status == "published"


def test_a_reconstruction_failure_is_masked_and_the_worker_lives_on(proxy: ProxyHandle, tmp_path: Path) -> None:
    class Broken(ChatLoopGateway):
        def conclude(self, request, attempt, session, grade, grade_error):  # type: ignore[no-untyped-def]
            if request.request_id == "bad":
                raise ValueError("no trace")
            return super().conclude(request, attempt, session, grade, grade_error)

    async def scenario() -> list[SessionOutcome]:
        config = GatewayConfig(state_dir=tmp_path / "state", post_workers=1)
        async with Broken(config, proxy.client()) as gw:
            bad = await gw.submit(light("bad", "g"))
            good = await gw.submit(light("good", "h"))  # the one POSTRUN worker must still be there for it
            return [await asyncio.wait_for(bad, 120), await asyncio.wait_for(good, 120)]

    bad, good = asyncio.run(scenario())
    assert bad.status == "published" and bad.mask_sample and "reconstruction failed" in (bad.reason or "")
    assert good.status == "published" and not good.mask_sample and good.output


def test_an_outcome_is_written_whole_or_not_at_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A gateway killed while writing ``outcome.json`` left an empty file, which the controller took for the
    session's final result (a load run: ValidationError on ''). Outcomes go through ``atomic_write``: a write that
    dies before its rename leaves the previous file (or none) and no partial one."""
    import os

    import nemo_polar.paths as paths

    target = tmp_path / "outcome.json"
    paths.atomic_write(target, b'{"first": 1}')
    assert json.loads(target.read_text()) == {"first": 1}

    def killed(fd: int) -> None:
        raise KeyboardInterrupt  # the process dies between writing and renaming

    monkeypatch.setattr(paths.os, "fsync", killed)
    with pytest.raises(KeyboardInterrupt):
        paths.atomic_write(target, b'{"second": 2}')
    monkeypatch.undo()
    assert json.loads(target.read_text()) == {"first": 1}
    assert sorted(os.listdir(tmp_path)) == ["outcome.json"]
    with pytest.raises(KeyboardInterrupt):
        monkeypatch.setattr(paths.os, "fsync", killed)
        paths.atomic_write(tmp_path / "new.json", b"{}")
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == ["outcome.json"]
