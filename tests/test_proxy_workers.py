"""Proxy worker processes: two workers over one record directory, sessions pinned to a worker by their id, weight
sync applied to both at once (no call sampled under two versions unmarked), every worker's records read as one
store, metrics labelled by worker. The engine is a stub whose completions the test holds, so which calls are in
flight when the weights change is decided by the test, not by timing."""

from __future__ import annotations

import os
import pickle
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from nemo_polar.cli import build_parser
from nemo_polar.proxy.http.client import ProxyClient
from nemo_polar.proxy.http.config import ProxyConfig
from nemo_polar.proxy.http.pool import PoolError, ProxyPool
from nemo_polar.proxy.http.serve import BackgroundServer
from nemo_polar.proxy.http.workers import ProxyWorkers, worker_ports
from nemo_polar.proxy.store.records import CallRecord
from nemo_polar.proxy.store.sessions import worker_of
from nemo_polar.reconstruct.builders import prefix_merging
from nemo_polar.reconstruct.io import load_records
from tests.helpers.clients import loopback
from tests.helpers.gated_engine import Gate, gated_engine


class Node:
    def __init__(self, pool: ProxyPool, gate: Gate, record_dir: Path, engine_url: str) -> None:
        self.pool, self.gate, self.record_dir, self.engine_url = pool, gate, record_dir, engine_url

    def session(self) -> tuple[str, str, ProxyClient]:
        return self.pool.create_session({"mode": "continuation"})

    def ask(self, worker: ProxyClient, key: str, text: str) -> None:
        body = {"model": "local-model", "messages": [{"role": "user", "content": text}], "max_tokens": 4}
        resp = loopback.post(f"{worker.url}/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"})
        assert resp.status_code == 200, resp.text

    def in_background(self, calls: list[Callable[[], None]]) -> list[threading.Thread]:
        threads = [threading.Thread(target=call) for call in calls]
        for thread in threads:
            thread.start()
        return threads


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    gate = Gate()
    record_dir = tmp_path_factory.mktemp("records")
    with BackgroundServer(gated_engine(gate)) as engine:
        config = ProxyConfig(
            engine_url=engine.url, record_dir=record_dir, model_aliases=["local-model"], policy_version=1
        )
        with ProxyWorkers(config, 2) as workers:
            yield Node(workers.pool, gate, record_dir, engine.url)


def test_sessions_are_pinned_to_workers_and_named_by_their_ids(node: Node) -> None:
    made = [node.session() for _ in range(4)]
    assert [worker_of(sid) for sid, _, _ in made] == [0, 1, 0, 1]  # in turn, the worker's index in the id
    for sid, key, worker in made:
        assert node.pool.worker_for(sid) is worker
        node.ask(worker, key, "hi")
        assert [r.session_id for r in node.pool.records(sid)] == [sid]
    # a key for one worker is refused by the other: a session lives on one worker only
    sid, key, worker = made[0]
    other = node.pool.workers[1]
    body = {"model": "local-model", "messages": [{"role": "user", "content": "hi"}]}
    resp = loopback.post(f"{other.url}/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"})
    assert resp.status_code == 401
    # a stable key always lands on the same worker, and both workers get some of a few keys
    assert {node.pool.for_key(f"rollout-{i}").admin_url for i in range(16)} == {w.admin_url for w in node.pool.workers}
    assert node.pool.for_key("rollout-3") is node.pool.for_key("rollout-3")
    with pytest.raises(ValueError, match="not a proxy session id"):
        node.pool.worker_for("nope")
    with pytest.raises(ValueError, match="names worker 7; this pool has 2"):
        node.pool.worker_for("sess-07" + "0" * 30)


def test_a_pause_drains_every_worker_before_it_reports_drained(node: Node) -> None:
    a, b = node.session(), node.session()
    assert {worker_of(a[0]), worker_of(b[0])} == {0, 1}
    before = node.gate.arrived
    node.gate.open.clear()
    held = node.in_background([lambda s=s: node.ask(s[2], s[1], "slow") for s in (a, b)])
    node.gate.wait_arrived(before + 2)  # one call at the engine from each worker
    state = node.pool.pause(timeout_s=0.2)
    assert state.paused and state.drained is False and state.in_flight == 2
    assert [w.in_flight for w in state.workers] == [1, 1]
    node.gate.open.set()
    for thread in held:
        thread.join(120)
    state = node.pool.pause(timeout_s=60)
    assert state.paused and state.drained and state.in_flight == 0
    state = node.pool.resume(2)
    assert state.consistent and not state.paused and state.policy_version == 2
    for sid, key, worker in (a, b):
        node.ask(worker, key, "after")
        assert [(r.policy_version, r.policy_version_changes) for r in node.pool.records(sid)] == [(1, []), (2, [])]
    node.pool.pause(timeout_s=60)
    node.pool.resume(1)  # back to the module's version for the tests after


def test_a_kept_generation_on_every_worker_records_the_version_change(node: Node) -> None:
    """pause(keep=True): calls in flight at the engine on both workers when the weights change are marked there,
    on every worker, and every later call on either is stamped with the new version."""
    sessions = [node.session() for _ in range(4)]
    assert {worker_of(sid) for sid, *_ in sessions[:2]} == {0, 1}
    for _, key, worker in sessions:
        node.ask(worker, key, "first")
    before = node.gate.arrived
    node.gate.open.clear()
    kept = node.in_background([lambda s=s: node.ask(s[2], s[1], "kept") for s in sessions[:2]])
    node.gate.wait_arrived(before + 2)
    assert node.pool.pause(timeout_s=0, keep=True).paused
    state = node.pool.resume(3)
    assert state.consistent and state.policy_version == 3 and [w.policy_version for w in state.workers] == [3, 3]
    node.gate.open.set()
    for thread in kept:
        thread.join(120)
    for _, key, worker in sessions:
        node.ask(worker, key, "next")
    versions = {
        sid: [(r.policy_version, r.policy_version_changes) for r in node.pool.records(sid)] for sid, *_ in sessions
    }
    change = [{"at_token": 0, "policy_version": 3}]
    for sid, *_ in sessions[:2]:
        assert versions[sid] == [(1, []), (1, change), (3, [])], versions[sid]
    for sid, *_ in sessions[2:]:
        assert versions[sid] == [(1, []), (3, [])], versions[sid]
    node.pool.pause(timeout_s=60)
    node.pool.resume(1)


def test_every_workers_records_read_as_one_store(node: Node) -> None:
    made = [node.session() for _ in range(2)]
    for sid, key, worker in made:
        for turn in range(2):
            node.ask(worker, key, f"turn {turn}")
        node.pool.close(sid)
    store = load_records(sorted(node.record_dir.glob("sess-*.jsonl")))
    assert {worker_of(sid) for sid in store} == {0, 1}
    for sid, _, _ in made:
        assert [r.call_id for r in store[sid]] == [r.call_id for r in node.pool.records(sid)]
        assert prefix_merging(store[sid]), f"no trace for {sid}"
    assert all(isinstance(r, CallRecord) for recs in store.values() for r in recs)
    # the metrics: every worker's samples, labelled, and summed over the pool
    calls = sum(r.complete for recs in store.values() for r in recs)
    assert node.pool.total("polar_calls_total", outcome="completed") == calls
    text = node.pool.metrics()
    assert 'worker="0"' in text and 'worker="1"' in text and "polar_calls_total{" in text
    assert 'polar_pool_worker_up{worker="0"} 1.0' in text and 'polar_pool_worker_up{worker="1"} 1.0' in text


def test_a_hung_worker_is_reported_down_within_the_scrape_timeout(node: Node) -> None:
    """A worker that stops answering (stopped, not dead: its port still accepts) does not hold the pool's scrape for
    the admin client's 30 s: after ``scrape_timeout_s`` it is reported down and its samples left out."""
    pid = node.pool.workers[1].health()["pid"]
    pool = node.pool.model_copy(update={"scrape_timeout_s": 1.0})
    os.kill(pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        text = pool.metrics()
        took = time.monotonic() - started
    finally:
        os.kill(pid, signal.SIGCONT)
    assert 'polar_pool_worker_up{worker="1"} 0.0' in text and 'outcome="completed",worker="1"' not in text
    assert took < 15, took  # the old wait was the client's 30 s
    assert 'polar_pool_worker_up{worker="1"} 1.0' in node.pool.metrics()  # answering again once continued


def test_helper_threads_where_the_cores_outnumber_the_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker's render and record line go to threads only where a core is spare for them: with 2 cores, one
    proxy (or a pool of one) uses them, a worker of a pool of 2 does not; a set value wins."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1})
    config = ProxyConfig(engine_url="http://127.0.0.1:9")
    assert config.uses_helper_threads()  # one process on 2 cores
    assert config.model_copy(update={"workers": 4}).uses_helper_threads()  # not a worker: this process is the one
    assert config.model_copy(update={"worker": 0, "workers": 1}).uses_helper_threads()
    assert not config.model_copy(update={"worker": 1, "workers": 2}).uses_helper_threads()
    assert config.model_copy(update={"worker": 1, "workers": 2, "helper_threads": True}).uses_helper_threads()
    assert not config.model_copy(update={"helper_threads": False}).uses_helper_threads()


def test_worker_ports_and_bad_counts() -> None:
    assert worker_ports(3, 8100, None) == [(8100, 8101), (8102, 8103), (8104, 8105)]
    assert worker_ports(2, None, None) == [(None, None), (None, None)]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["proxy", "--engine-url", "http://x", "--workers", "0"])
    with pytest.raises(ValueError, match="worker"):
        ProxyConfig(engine_url="http://x", workers=0)
    # a pool of one holds every session, whatever its id's first byte
    one = ProxyPool(workers=[ProxyClient(url="http://a", admin_url="http://b")])
    assert one.worker_for("sess-ff" + "0" * 30) is one.workers[0]
    # a pool travels (Ray pickles it) and keeps its turn
    two = ProxyPool(workers=[ProxyClient(url=f"http://w{i}", admin_url=f"http://a{i}") for i in range(2)])
    two._turn = 1
    assert pickle.loads(pickle.dumps(two))._turn == 1


def test_polar_proxy_serves_workers_and_stops_them(node: Node, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`polar proxy --workers 2`: worker 0 printed first as a single proxy is, the pool file without the token, a
    session on worker 1 recorded in the one record directory, worker 1's death said on stderr while worker 0 serves on,
    and no worker left once the command is stopped."""
    monkeypatch.setenv("POLAR_ADMIN_TOKEN", "polar-admin-test-workers")
    pool_file, records = tmp_path / "pool.json", tmp_path / "records"
    cmd = [sys.executable, "-m", "nemo_polar.cli", "proxy", "--engine-url", node.engine_url, "--port", "0"]
    cmd += [
        "--workers",
        "2",
        "--pool-file",
        str(pool_file),
        "--record-dir",
        str(records),
        "--model-alias",
        "local-model",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ)
    said: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [said.put(line) for line in proc.stderr or []], daemon=True).start()
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(5)]
        assert lines[0].startswith("model API") and lines[2].startswith("worker 1"), lines
        pool_api = lines[4].split()[2]  # "pool API   <url>   (...)"
        assert lines[4].startswith("pool API") and loopback.get(f"{pool_api}/metrics").status_code == 401
        assert "polar-admin-test-workers" not in pool_file.read_text()
        pool = ProxyPool.model_validate_json(pool_file.read_text())
        assert len(pool.workers) == 2 and pool.workers[1].admin_token == "polar-admin-test-workers"
        pool.create_session({})
        sid, key, worker = pool.create_session({})
        assert worker_of(sid) == 1 and worker is pool.workers[1]
        node.ask(worker, key, "hi")
        assert [r.session_id for r in load_records([records / f"{sid}.jsonl"])[sid]] == [sid]
        health = worker.health()
        assert health["worker"] == 1
        admin = {"authorization": "Bearer polar-admin-test-workers"}
        scrape = loopback.get(f"{pool_api}/metrics", headers=admin).text
        assert 'polar_calls_total{api="chat",mode="continuation",outcome="completed",worker="1"} 1.0' in scrape
        assert 'polar_pool_worker_up{worker="0"} 1.0' in scrape and 'polar_pool_worker_up{worker="1"} 1.0' in scrape
        assert loopback.get(f"{pool_api}/health", headers=admin).json()["consistent"]
        os.kill(health["pid"], signal.SIGKILL)
        while "exited" not in (line := said.get(timeout=60)):
            pass
        assert f"worker 1 exited with status {-signal.SIGKILL}" in line
        assert pool.workers[0].health()["status"] == "ok"  # the other keeps serving
        # the pool's scrape goes on without the dead worker and says which is down; its health names it
        scrape = loopback.get(f"{pool_api}/metrics", headers=admin).text
        assert 'polar_pool_worker_up{worker="1"} 0.0' in scrape and 'worker="1"} 1.0' not in scrape
        assert 'polar_pool_worker_up{worker="0"} 1.0' in scrape and 'outcome="completed",worker="1"' not in scrape
        sick = loopback.get(f"{pool_api}/health", headers=admin)
        assert sick.status_code == 503 and pool.workers[1].admin_url in sick.text
    finally:
        proc.send_signal(signal.SIGTERM)  # the command alone: its workers must stop with it
        assert proc.wait(60) == 0
    for w in pool.workers:
        with pytest.raises(httpx.ConnectError):
            loopback.get(f"{w.url}/health", timeout=5)


def test_a_dead_worker_loses_no_answered_record(node: Node, tmp_path: Path) -> None:
    """A worker killed outright: the records it answered are read back from the record directory, the other worker
    keeps serving, the pool's admin operations name the dead one instead of passing over it, until it is retired."""
    config = ProxyConfig(engine_url=node.engine_url, record_dir=tmp_path, model_aliases=["local-model"])
    with ProxyWorkers(config, 2) as workers:
        pool = workers.pool
        pool.create_session({})
        sid, key, doomed = pool.create_session({})
        for turn in range(2):
            node.ask(doomed, key, f"turn {turn}")
        answered = [r.call_id for r in pool.records(sid)]
        os.kill(workers.ready[1].pid, signal.SIGKILL)
        workers.processes[1].wait(60)
        assert workers.exited() == {1: -signal.SIGKILL}
        assert [r.call_id for r in pool.records(sid)] == answered and len(answered) == 2
        with pytest.raises(httpx.TransportError):
            loopback.post(f"{doomed.url}/v1/chat/completions", json={}, headers={"authorization": f"Bearer {key}"})
        alive_sid, alive_key, alive = pool.create_session({})
        assert worker_of(alive_sid) == 0
        node.ask(alive, alive_key, "still here")
        with pytest.raises(PoolError, match=f"worker at {doomed.admin_url}"):
            pool.pause(timeout_s=5)
        assert alive.health()["paused"]  # the one it reached: a weight sync must not go ahead
        with pytest.raises(PoolError, match=f"worker at {doomed.admin_url}"):
            pool.resume()
        assert not alive.health()["paused"]
        # retired, the dead worker is passed over: weight syncs and new sessions go on with the others
        pool.retire(1)
        assert pool.pause(timeout_s=60).drained and pool.resume(5).policy_version == 5
        assert {worker_of(pool.create_session({})[0]) for _ in range(3)} == {0}
        assert [r.call_id for r in pool.records(sid)] == answered
        pool.close(sid)  # nothing left to close on a dead worker
        with pytest.raises(ValueError, match="would leave this pool no worker"):
            pool.retire(0)


def test_a_gateway_over_the_pool_pins_each_session_and_syncs_every_worker(node: Node, tmp_path: Path) -> None:
    """The rollout gateway given the pool: each session runs on the worker its request id is pinned to (both
    workers get some), and the gateway's weight sync pauses and resumes every worker."""
    import asyncio

    from nemo_polar.env.gateway import GatewayConfig, SessionRequest
    from nemo_polar.env.gateway.testing import ChatLoopGateway
    from nemo_polar.env.runtime.attempt import AttemptDir
    from nemo_polar.rewards import bundled_instances

    instance = bundled_instances()[0]
    before = node.pool.health().policy_version
    ids = [f"rollout-{i}" for i in range(8)]

    async def scenario() -> tuple[list[str], dict, dict]:
        config = GatewayConfig(state_dir=tmp_path, run_slots=4, post_workers=1)
        async with ChatLoopGateway(config, node.pool) as gw:
            requests = [
                SessionRequest(request_id=i, harness="chat_loop", instance=instance, harness_options={"turns": 2})
                for i in ids
            ]
            futures = [await gw.submit(r) for r in requests]
            statuses = [(await f).status for f in futures]
            return statuses, await gw.pause(30), await gw.resume(before + 5)

    statuses, paused, resumed = asyncio.run(scenario())
    assert statuses == ["published"] * len(ids)
    workers = []
    for request_id in ids:
        records = AttemptDir(tmp_path / request_id).read_records()
        assert len(records) == 2 and len({r.session_id for r in records}) == 1
        pinned = node.pool.workers.index(node.pool.for_key(request_id))
        assert worker_of(records[0].session_id) == pinned
        workers.append(pinned)
    assert set(workers) == {0, 1}
    assert paused["drained"] is True and len(paused["workers"]) == 2
    assert resumed["policy_version"] == before + 5 and resumed["consistent"] is True
    node.pool.resume(before)  # the module's other tests count versions from the node's own


def test_rollouts_read_a_pool_file_with_its_token_from_config_or_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`proxy.pool_file=` of polar rollout / generate: the file `polar proxy --pool-file` writes (no token), its token
    from the config, else $POLAR_ADMIN_TOKEN; a file that is not one is a clear error."""
    from nemo_polar.env.frontends.rollout import compose, engine_url, load_pool, proxy_client

    workers = [ProxyClient(url=f"http://m{i}", admin_url=f"http://a{i}", admin_token="t") for i in range(2)]
    path = tmp_path / "pool.json"
    path.write_text(ProxyPool(workers=workers).model_dump_json(exclude={"workers": {"__all__": {"admin_token"}}}))
    assert "admin_token" not in path.read_text()
    monkeypatch.setenv("POLAR_ADMIN_TOKEN", "from-env")
    assert [w.admin_token for w in load_pool(path).workers] == ["from-env", "from-env"]
    assert [w.admin_token for w in load_pool(path, "given").workers] == ["given", "given"]
    cfg = compose([f"proxy.pool_file={path}", "engine.url=null"])
    with engine_url(cfg) as engine, proxy_client(cfg, engine, tmp_path / "unused") as proxy:
        assert (
            engine is None
            and isinstance(proxy, ProxyPool)
            and [w.url for w in proxy.workers] == ["http://m0", "http://m1"]
        )
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match=r"bad\.json: not a pool file of `polar proxy --workers`"):
        load_pool(tmp_path / "bad.json")


def test_a_gateway_masks_the_sessions_of_a_worker_that_died(node: Node, tmp_path: Path) -> None:
    """A worker killed while its sessions' calls are at the engine: the gateway masks exactly those sessions, naming
    the dead worker (proxy_unreachable, never trained on), and the other worker's sessions finish trainable."""
    import asyncio

    from nemo_polar.env.gateway import GatewayConfig, SessionRequest
    from nemo_polar.env.gateway.testing import ChatLoopGateway
    from nemo_polar.rewards import bundled_instances

    instance = bundled_instances()[0]
    config = ProxyConfig(engine_url=node.engine_url, record_dir=tmp_path / "records", model_aliases=["local-model"])
    with ProxyWorkers(config, 2) as workers:
        pool = workers.pool
        keys = [f"attempt-{i}" for i in range(64)]
        ids = {w: [k for k in keys if pool.workers.index(pool.for_key(k)) == w][:2] for w in (0, 1)}

        async def scenario() -> dict[str, object]:
            gw_config = GatewayConfig(state_dir=tmp_path / "state", run_slots=4, post_workers=1)
            async with ChatLoopGateway(gw_config, pool) as gw:
                arrived = node.gate.arrived
                node.gate.open.clear()  # every session's first call held at the engine
                futures = {
                    i: await gw.submit(
                        SessionRequest(
                            request_id=i, harness="chat_loop", instance=instance, harness_options={"turns": 2}
                        )
                    )
                    for i in ids[0] + ids[1]
                }
                await asyncio.to_thread(node.gate.wait_arrived, arrived + 4)
                os.kill(workers.ready[1].pid, signal.SIGKILL)
                await asyncio.to_thread(workers.processes[1].wait, 60)
                node.gate.open.set()
                return {i: await f for i, f in futures.items()}

        try:
            outcomes = asyncio.run(scenario())
        finally:
            node.gate.open.set()
    for request_id in ids[0]:
        assert outcomes[request_id].status == "published" and outcomes[request_id].verdict.trainable
    for request_id in ids[1]:
        outcome = outcomes[request_id]
        assert (outcome.status, outcome.verdict.kind, outcome.mask_sample) == ("failed", "proxy_unreachable", True)
        assert f"proxy worker at {pool.workers[1].url} died" in outcome.verdict.reason
