"""Weight sync: pause drains in-flight generations and holds new ones (the harness just waits), resume reopens
with a new policy version that every later record carries; sessions spanning versions are visible in traces."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest

from nemo_polar.proxy.store.records import CallRecord
from nemo_polar.reconstruct.builders import prefix_merging
from tests.conftest import ProxyHandle, make_proxy
from tests.helpers.clients import openai_client

pytestmark = pytest.mark.engine
# The in-process proxy shares two busy cores with the engine and the streaming client: admin calls may answer late.
ADMIN_TIMEOUT = 60


@pytest.fixture
def versioned(engine_url: str, tmp_path) -> ProxyHandle:  # type: ignore[no-untyped-def]
    yield from make_proxy(engine_url, tmp_path, policy_version=1)


def ask(proxy: ProxyHandle, key: str, history: list[dict]) -> str:
    client = openai_client(proxy, key, timeout=120)
    return client.chat.completions.create(model="local-model", messages=history).choices[0].message.content or ""


def start_in_flight(proxy: ProxyHandle, call: Callable[[], object]) -> threading.Thread:
    """Start ``call`` on a thread and return once the proxy counts it in flight. The proxy is warmed first (its
    first call fetches the engine's model card and end-of-turn id), so a slow engine cannot hide the window; a call
    that ends before it was ever seen in flight fails the test with its own error instead of a timeout."""
    ask(proxy, proxy.session(sampling_overrides={"max_tokens": 1})["api_key"], [{"role": "user", "content": "hi"}])
    errors: list[BaseException] = []

    def target() -> None:
        try:
            call()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    deadline = time.monotonic() + 120
    # Watched in-process, not over HTTP: a loaded machine can answer an admin call more slowly than a short
    # generation runs, and then the call is never seen in flight.
    while proxy.apps.proxy.admission.state().in_flight == 0:
        assert thread.is_alive(), f"the generation ended before it was seen in flight: {errors or 'no error'}"
        assert time.monotonic() < deadline, "the generation never started"
        time.sleep(0.001)
    return thread


@pytest.fixture
def held(engine_url: str, tmp_path):  # type: ignore[no-untyped-def]
    """A proxy whose engine holds the end of its second model call (the first is start_in_flight's warm-up) until
    the test releases it."""
    from tests.faults import FaultPoint

    with FaultPoint(engine_url, "hold_finish", [1]) as point:
        for proxy in make_proxy(point.url, tmp_path, policy_version=1):
            try:
                yield proxy, point
            finally:
                point.release()  # before the proxy stops: it would wait on a held stream


def test_pause_drains_holds_and_resume_stamps_the_new_version(held) -> None:  # type: ignore[no-untyped-def]
    """The in-flight generation is held by the engine until the test lets it go: pause must wait for it however
    long that takes, and return once it is recorded."""
    proxy, point = held
    slow = proxy.session(sampling_overrides={"max_tokens": 4})
    quick = proxy.session(sampling_overrides={"max_tokens": 4})
    replies: dict[str, float] = {}

    def run(name: str, key: str) -> None:
        ask(proxy, key, [{"role": "user", "content": "go"}])
        replies[name] = time.monotonic()

    first = start_in_flight(proxy, lambda: run("in_flight", slow["api_key"]))
    pause: dict[str, dict] = {}
    pausing = threading.Thread(
        target=lambda: pause.update(
            state=proxy.admin("POST", "/polar/pause", json={"timeout_s": 600}, timeout=660).json()
        )
    )
    pausing.start()
    while point.faulted != [1]:  # the engine has finished and holds the end of the generation
        assert first.is_alive() and pausing.is_alive(), "the held generation ended on its own"
        time.sleep(0.01)
    pausing.join(0.5)
    assert pausing.is_alive() and "in_flight" not in replies  # pause waits for the held generation
    point.release()
    pausing.join(120)
    paused = pause["state"]
    assert paused["paused"] and paused["drained"] and paused["in_flight"] == 0
    # Pause returned only after the in-flight generation finished and was recorded.
    assert [r["complete"] for r in proxy.records(slow["session_id"])] == [True]

    held = threading.Thread(target=run, args=("held", quick["api_key"]))
    held.start()
    time.sleep(1.0)
    assert "held" not in replies  # a call arriving while paused waits...
    resumed_at = time.monotonic()
    state = proxy.admin("POST", "/polar/resume", json={"policy_version": 2}, timeout=ADMIN_TIMEOUT).json()
    assert state == {
        "paused": False,
        "policy_version": 2,
        "in_flight": state["in_flight"],
        "drained": None,
        "waited_s": None,
    }
    held.join(60)
    first.join(60)
    assert replies["held"] >= resumed_at  # ...and is served after the resume

    [before] = proxy.records(slow["session_id"])
    [after] = proxy.records(quick["session_id"])
    assert before["policy_version"] == 1 and after["policy_version"] == 2
    assert before["complete"] and after["complete"]


def test_keep_mode_records_where_a_weight_update_split_a_generation(held) -> None:  # type: ignore[no-untyped-def]
    """An engine that keeps in-flight generations across a weight update (vLLM's keep mode, NeMo-RL PR #3839): the
    pause drains nothing, and the resume marks the generation still in flight with the token count reached. The
    trace then carries both versions, and the training_traces envelope keeps the call out, with the reason."""
    from nemo_polar.reconstruct.envelope import training_traces

    proxy, point = held
    s = proxy.session(sampling_overrides={"max_tokens": 4}, extra_body={"ignore_eos": True})

    thread = start_in_flight(proxy, lambda: ask(proxy, s["api_key"], [{"role": "user", "content": "go"}]))
    while point.faulted != [1]:  # the engine has sampled the call and holds its finishing event
        assert thread.is_alive(), "the held generation ended on its own"
        time.sleep(0.01)
    paused = proxy.admin("POST", "/polar/pause", json={"timeout_s": 600, "keep": True}, timeout=ADMIN_TIMEOUT).json()
    assert paused["paused"] and paused["in_flight"] == 1 and paused["drained"] is False  # nothing waited for
    proxy.admin("POST", "/polar/resume", json={"policy_version": 2}, timeout=ADMIN_TIMEOUT)
    point.release()
    thread.join(60)

    [rec] = [CallRecord.model_validate(r) for r in proxy.records(s["session_id"])]
    assert rec.complete and rec.finish_reason == "length" and len(rec.sampled_token_ids) == 4
    [change] = rec.policy_version_changes
    assert rec.policy_version == 1 and change["policy_version"] == 2
    assert 0 <= change["at_token"] < 4  # the finishing event (the last token) came after the update
    [trace] = prefix_merging([rec]).traces
    assert trace.policy_versions == [1, 2] and trace.spans[0].policy_versions == [1, 2]
    envelope = training_traces("r", "prefix_merging", [trace])
    assert envelope.training_traces.traces == []
    assert envelope.masked[rec.call_id] == "sampled across a weight update (policy versions [1, 2])"


def test_a_version_change_before_the_engine_has_the_call_is_no_split() -> None:
    """A resume that lands while a call is admitted but not yet sent to the engine: the call simply runs under the
    new version (nothing was sampled or prefilled under the old one)."""
    from nemo_polar.proxy.http.admission import Admission

    async def scenario() -> tuple[int | None, list, list]:
        adm = Admission(1)
        early, late = await adm.enter(), await adm.enter()
        late.sampled = lambda: 3
        adm.resume(2)
        return early.version, early.changes, late.changes

    version, early_changes, late_changes = asyncio.run(scenario())
    assert version == 2 and early_changes == []
    assert [c.model_dump() for c in late_changes] == [{"at_token": 3, "policy_version": 2}]


def test_pause_wait_is_bounded(versioned: ProxyHandle) -> None:
    """A generation that cannot finish during the test (thousands of forced tokens) is in flight when the pause's
    bounded wait ends; the client then hangs up, which ends the generation and releases it."""
    proxy = versioned
    slow = proxy.session(
        extra_body={"structured_outputs": {"regex": "(word ){3000}"}}, sampling_overrides={"max_tokens": 4000}
    )
    hang_up = threading.Event()

    def stream_until_hang_up() -> None:
        client = openai_client(proxy, slow["api_key"], timeout=120)
        messages = [{"role": "user", "content": "go"}]
        with client.chat.completions.create(model="local-model", messages=messages, stream=True) as stream:  # type: ignore[arg-type]
            for _ in stream:
                if hang_up.is_set():
                    break

    t = start_in_flight(proxy, stream_until_hang_up)
    state = proxy.admin("POST", "/polar/pause", json={"timeout_s": 0.01}, timeout=ADMIN_TIMEOUT).json()
    hang_up.set()
    assert state["paused"] and state["drained"] is False and state["in_flight"] == 1
    proxy.admin("POST", "/polar/resume", json={}, timeout=ADMIN_TIMEOUT)
    t.join(60)
    deadline = time.monotonic() + 30
    while proxy.admin("GET", "/health", timeout=ADMIN_TIMEOUT).json()["in_flight"]:
        assert time.monotonic() < deadline, "the abandoned generation was never released"
        time.sleep(0.05)
    [record] = proxy.records(slow["session_id"])
    assert not record["complete"] and record["status_code"] == 499  # recorded as cut off by the client


def test_a_session_spanning_versions_shows_both_in_its_trace(versioned: ProxyHandle) -> None:
    proxy = versioned
    s = proxy.session(sampling_overrides={"max_tokens": 4})
    history = [{"role": "user", "content": "one"}]
    history += [{"role": "assistant", "content": ask(proxy, s["api_key"], history)}, {"role": "user", "content": "2"}]
    proxy.admin("POST", "/polar/pause", json={"timeout_s": 10}, timeout=ADMIN_TIMEOUT)
    proxy.admin("POST", "/polar/resume", json={"policy_version": 7}, timeout=ADMIN_TIMEOUT)
    ask(proxy, s["api_key"], history)
    records = [CallRecord.model_validate(r) for r in proxy.records(s["session_id"])]
    [trace] = prefix_merging(records).traces
    assert trace.policy_versions == [1, 7]


@pytest.mark.parametrize(
    ("route", "body", "message"),
    [
        ("pause", {"timeout_s": -1}, "timeout_s"),
        ("pause", {"timeout_s": 1, "keep": "yes"}, "keep must be true or false"),
        ("pause", [1], "JSON object"),
        ("resume", {"policy_version": "v2"}, "policy_version must be an integer"),
    ],
)
def test_weight_sync_bad_input(versioned: ProxyHandle, route: str, body: object, message: str) -> None:
    resp = versioned.admin("POST", f"/polar/{route}", json=body, timeout=ADMIN_TIMEOUT)
    assert resp.status_code == 400 and message in resp.text
    assert versioned.admin("GET", "/health", timeout=ADMIN_TIMEOUT).json()["paused"] is False


def test_admission_counts_every_exit_path() -> None:
    from nemo_polar.proxy.http.admission import Admission

    async def scenario() -> None:
        adm = Admission(3)
        ticket = await adm.enter()
        ticket.release()
        ticket.release()  # idempotent
        assert adm.in_flight == 0 and ticket.version == 3
        await adm.pause(0)
        waiter = asyncio.create_task(adm.enter())
        await asyncio.sleep(0.05)
        assert not waiter.done()
        adm.resume(4)
        assert (await waiter).version == 4

    asyncio.run(scenario())
