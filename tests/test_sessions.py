"""Sessions keep their records apart under concurrency; records are durable and complete; small endpoints."""

from __future__ import annotations

import asyncio
import gc
import json
import time
import weakref
from pathlib import Path

import openai
import pytest

from nemo_polar.proxy.store.records import read_records
from tests.conftest import ProxyHandle
from tests.helpers.clients import loopback, openai_client


@pytest.mark.anyio
async def test_concurrent_sessions_never_mix_records(proxy: ProxyHandle) -> None:
    sessions = [proxy.session(sampling_overrides={"max_tokens": 6}, metadata={"n": i}) for i in range(12)]

    async def converse(i: int, session: dict[str, str]) -> None:
        client = openai.AsyncOpenAI(base_url=f"{proxy.url}/v1", api_key=session["api_key"], max_retries=0)
        history = [{"role": "user", "content": f"session {i} says hello"}]
        for turn in range(3):
            stream = await client.chat.completions.create(model="local-model", messages=history, stream=True)
            text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
            history += [{"role": "assistant", "content": text}, {"role": "user", "content": f"turn {turn} of {i}"}]
        await client.close()

    await asyncio.gather(*(converse(i, s) for i, s in enumerate(sessions)))
    for i, session in enumerate(sessions):
        records = proxy.records(session["session_id"])
        assert len(records) == 3
        assert all(r["session_id"] == session["session_id"] and r["complete"] for r in records)
        assert all(f"session {i} says hello" in json.dumps(r["request"]) for r in records)
        assert [r["render_reason"] for r in records] == ["first_call", "continuation", "continuation"]
        assert records[1]["parent_call_id"] == records[0]["call_id"]
        assert records[2]["parent_call_id"] == records[1]["call_id"]
        on_disk = read_records(proxy.record_dir / f"{session['session_id']}.jsonl")
        assert [r.model_dump(mode="json") for r in on_disk] == records


def test_record_fields_and_timing(proxy: ProxyHandle) -> None:
    session = proxy.session(policy_version=7, sampling_overrides={"max_tokens": 5, "temperature": 0.5, "top_p": 0.9})
    client = openai_client(proxy, session["api_key"])
    before = time.time()
    client.chat.completions.create(
        model="local-model", messages=[{"role": "user", "content": "x"}], temperature=1.7, max_tokens=99
    )
    [rec] = proxy.records(session["session_id"])
    assert rec["policy_version"] == 7 and rec["api"] == "chat" and rec["mode"] == "continuation"
    # pinned params win; max_tokens is a cap on what the harness asked for
    assert rec["sampling"] == {
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": None,
        "max_tokens": 5,
        "stop": None,
        "seed": None,
    }
    assert rec["request"]["temperature"] == 1.7  # the original body, unchanged
    assert before <= rec["started_at"] <= rec["finished_at"] <= time.time()
    assert rec["call_id"].startswith("call-")


def test_corrupt_record_line_names_file_and_line(tmp_path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_text('{"not": "a record"}\n')
    with pytest.raises(ValueError, match=r"s\.jsonl:1: not a valid call record"):
        read_records(path)


def test_models_count_tokens_and_websocket_probe(proxy: ProxyHandle, engine_url: str) -> None:
    models = loopback.get(f"{proxy.url}/v1/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == ["tiny-qwen3", "local-model"]
    anth = loopback.get(f"{proxy.url}/v1/models", headers={"anthropic-version": "2023-06-01"}, timeout=10).json()
    assert anth["data"][0]["type"] == "model" and anth["has_more"] is False
    assert loopback.get(f"{proxy.url}/v1/responses", timeout=10).status_code == 404

    session = proxy.session()
    body = {"model": "local-model", "messages": [{"role": "user", "content": "hello there"}]}
    resp = loopback.post(f"{proxy.url}/v1/messages/count_tokens?beta=true", json=body,
                      headers={"x-api-key": session["api_key"]}, timeout=10)  # fmt: skip
    expected = loopback.post(f"{engine_url}/tokenize", json={"model": "tiny-qwen3", "add_generation_prompt": True,
                          "messages": body["messages"]}, timeout=10).json()["count"]  # fmt: skip
    assert resp.json() == {"input_tokens": expected}
    assert proxy.records(session["session_id"]) == []  # counting tokens is not a model call


def test_script_constrains_calls_in_order_then_samples_freely() -> None:
    from nemo_polar.proxy.store.sessions import SessionConfig

    cfg = SessionConfig(script=["a.b", "done"], extra_body={"seed_hint": 1})
    first, second, after = cfg.engine_extra(0), cfg.engine_extra(1), cfg.engine_extra(2)
    assert first["structured_outputs"] == {"regex": r"a\.b"}  # the text is matched literally
    assert second["structured_outputs"] == {"regex": "done"}
    assert after == {"seed_hint": 1} and "structured_outputs" not in after
    assert first["seed_hint"] == 1


def test_a_script_turn_goes_to_the_engine_as_its_token_ids() -> None:
    from nemo_polar.proxy.store.sessions import SessionConfig

    turn = {"tool_calls": [{"name": "bash", "arguments": {"command": "ls"}}]}
    cfg = SessionConfig(script=[turn, "done"], extra_body={"vllm_xargs": {"other": 1}})
    with pytest.raises(ValueError, match="its token ids are needed"):
        cfg.engine_extra(0)  # a turn is held to ids, which only the engine's template and tokenizer give
    held = {"polar_forced_ids": [5, 6], "polar_then_stop": 7}
    assert cfg.engine_extra(0, held)["vllm_xargs"] == {"other": 1, **held}
    assert "structured_outputs" not in cfg.engine_extra(0, held)
    assert cfg.engine_extra(1)["structured_outputs"] == {"regex": "done"}  # a string stays a text constraint


LS_TOOL = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {
    "command": {"type": "string"}}}}}]  # fmt: skip


def test_a_script_turn_is_written_by_the_template_and_sampled_token_for_token(
    proxy: ProxyHandle, model_dir: str
) -> None:
    """The turn's tool call is written by the engine's chat template (hermes here), the engine is held to exactly
    those ids (the canonical tokenisation, special tokens as the tokens) and reports the model's own logprobs; the
    proxy parses the call back. A text turn follows."""
    from transformers import AutoTokenizer

    turn = {"tool_calls": [{"name": "bash", "arguments": {"command": "ls -la"}}]}
    session = proxy.session(script=[turn, {"content": "Two files."}], sampling_overrides={"max_tokens": 64})
    client = openai_client(proxy, session["api_key"], timeout=60)
    messages: list[dict] = [{"role": "user", "content": "list the files"}]
    first = client.chat.completions.create(model="local-model", messages=messages, tools=LS_TOOL)  # type: ignore[arg-type]
    [call] = first.choices[0].message.tool_calls or []
    assert call.function.name == "bash" and json.loads(call.function.arguments) == {"command": "ls -la"}
    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "a.py\nb.py"},
    ]
    second = client.chat.completions.create(model="local-model", messages=messages, tools=LS_TOOL)  # type: ignore[arg-type]
    assert second.choices[0].message.content == "Two files."

    tok = AutoTokenizer.from_pretrained(model_dir)
    for rec in proxy.records(session["session_id"]):
        ids = rec["sampled_token_ids"]
        text = tok.decode(ids)
        assert ids == tok.encode(text, add_special_tokens=False)  # canonical: "<tool_call>" is its one token
        assert ids[-1] == tok.convert_tokens_to_ids("<|im_end|>")  # ended on the template's end of turn
        assert all(lp <= 0 for lp in rec["sampled_logprobs"]) and min(rec["sampled_logprobs"]) < -1  # the model's
    first_rec = proxy.records(session["session_id"])[0]
    assert tok.convert_tokens_to_ids("<tool_call>") == first_rec["sampled_token_ids"][0]


def test_an_engine_that_ignores_forced_ids_refuses_a_scripted_turn(engine_url: str, tmp_path: Path) -> None:
    """An engine started without the forced-tokens processor would let the model sample freely under a scripted
    turn: the proxy checks once and answers a clear error, with a failed record, instead."""
    from tests.conftest import make_proxy
    from tests.faults import FaultPoint

    with FaultPoint(engine_url, "drop_xargs", range(1000)) as point:
        for handle in make_proxy(point.url, tmp_path / "records"):
            session = handle.session(script=[{"content": "hi"}])
            headers = {"Authorization": f"Bearer {session['api_key']}"}
            body = {"model": "local-model", "messages": [{"role": "user", "content": "hello"}]}
            resp = loopback.post(f"{handle.url}/v1/chat/completions", json=body, headers=headers, timeout=60)
            assert resp.status_code == 500, resp.text
            error = resp.json()["error"]
            assert error["code"] == "script_unsupported" and "--logits-processors" in error["message"]
            [rec] = handle.records(session["session_id"])
            assert not rec["complete"] and "does not hold a request to given token ids" in rec["error"]
        assert point.faulted  # the probe's field was dropped, as such an engine drops it


def test_answered_calls_count_calls_whose_tool_calls_were_streamed() -> None:
    from nemo_polar.proxy.store.records import CallRecord
    from nemo_polar.proxy.store.sessions import SessionConfig, SessionStore

    session = SessionStore(None).create(SessionConfig(script=["a", "b", "c"]))
    for call_id in ("c1", "c2"):
        session.delivering.add(call_id)  # its tool calls reached the harness; the call is still running
    assert session.answered_calls() == 2
    failed = CallRecord(call_id="c1", session_id=session.id, api="chat", mode="chat", request=None, started_at=0)
    session.commit(failed.mark_failed("engine stream truncated", 502), None, None, [])
    assert session.answered_calls() == 1  # a failed call gives its entry back, as before it was counted
    assert session.config.engine_extra(session.answered_calls())["structured_outputs"] == {"regex": "b"}


def test_a_call_sent_on_a_streamed_tool_call_gets_the_next_script_entry(engine_url: str, tmp_path: Path) -> None:
    """Codex starts its auto-reviewer (and a subagent) on a finished tool-call item, before the call that produced it
    completes. The reviewer's request takes the script entry after that call's, not the same one, and is not the
    session's first call: here the engine holds the first call's finishing event until the second is answered."""
    from tests.conftest import make_proxy
    from tests.faults import FaultPoint

    tool = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {
        "command": {"type": "string"}}}}}]  # fmt: skip
    with FaultPoint(engine_url, "hold_finish", [0]) as point:
        for handle in make_proxy(point.url, tmp_path / "records"):
            session = handle.session(script=[tool, "reviewed", "done"], sampling_overrides={"max_tokens": 60})
            client = openai_client(handle, session["api_key"], timeout=60)
            stream = client.chat.completions.create(
                model="local-model", messages=[{"role": "user", "content": "list"}], tools=tools, stream=True
            )
            chunks = iter(stream)
            while not next(chunks).choices[0].delta.tool_calls:
                pass
            review = client.chat.completions.create(
                model="local-model", messages=[{"role": "user", "content": "review the call"}]
            )
            assert review.choices[0].message.content == "reviewed"
            assert point.faulted == [0]  # the first call was still unfinished when the review was answered
            point.release()
            assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
            records = handle.records(session["session_id"])
            assert [r["complete"] for r in records] == [True, True]
            assert [r["output_text"] for r in records] == ["reviewed", tool]  # in the order they completed
            # and the review, sent after the first call had answered, is not the session's first call
            assert [r["render_reason"] for r in records] == ["new_conversation", "first_call"]


def _gauges(proxy: ProxyHandle) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = proxy.admin("GET", "/metrics").text
    wanted = ("polar_sessions", "polar_sessions_open")
    return {f.name: f.samples[0].value for f in text_string_to_metric_families(text) if f.name in wanted}


def test_a_closed_session_leaves_memory_and_its_records_are_read_back_from_disk(proxy: ProxyHandle) -> None:
    store = proxy.apps.proxy.sessions
    created, live = len(store), store.live
    session, idle = proxy.session(sampling_overrides={"max_tokens": 4}), proxy.session()
    sid, key = session["session_id"], session["api_key"]
    client = openai_client(proxy, key)
    client.chat.completions.create(model="local-model", messages=[{"role": "user", "content": "hi"}])
    held = store.get(sid)
    assert held is not None and held.calls  # live: the replay map is in memory
    gone = weakref.ref(held)
    del held
    live_records = proxy.records(sid)
    assert len(live_records) == 1 and live_records[0]["complete"]
    assert (len(store), store.live) == (created + 2, live + 2)

    assert proxy.admin("DELETE", f"/polar/sessions/{sid}").json() == {"session_id": sid, "closed": True, "records": 1}
    gc.collect()
    assert store.get(sid) is None and gone() is None  # nothing (replay map, key index, metrics) keeps it alive
    assert proxy.records(sid) == live_records  # from <session_id>.jsonl
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(model="local-model", messages=[{"role": "user", "content": "hi"}])
    again = proxy.admin("DELETE", f"/polar/sessions/{sid}")  # closing twice answers what is left
    assert again.status_code == 200 and again.json()["records"] == 1

    # A session that never made a call is known once closed too (an empty records file).
    assert proxy.admin("DELETE", f"/polar/sessions/{idle['session_id']}").json()["records"] == 0
    assert proxy.records(idle["session_id"]) == []
    assert proxy.admin("DELETE", f"/polar/sessions/{idle['session_id']}").status_code == 200
    # Closed sessions still count as created; only live ones are held.
    assert (len(store), store.live) == (created + 2, live)
    assert _gauges(proxy) == {"polar_sessions": created + 2, "polar_sessions_open": live}
    assert proxy.admin("GET", "/health").json()["sessions"] == created + 2

    for unknown in (f"sess-{'0' * 32}", "nope", "..", "sess-..%2Fx"):
        assert proxy.admin("GET", f"/polar/sessions/{unknown}/records").status_code == 404, unknown
        assert proxy.admin("DELETE", f"/polar/sessions/{unknown}").status_code == 404, unknown


def test_without_a_record_dir_only_the_latest_closed_sessions_are_kept() -> None:
    from nemo_polar.proxy.store.records import CallRecord
    from nemo_polar.proxy.store.sessions import ClosedSession, SessionConfig, SessionStore

    store = SessionStore(None, keep_closed=2)
    sessions = [store.create(SessionConfig()) for _ in range(3)]
    for s in sessions:
        record = CallRecord(call_id=f"c-{s.id}", session_id=s.id, api="chat", mode="chat", request=None, started_at=0)
        s.records.append(record)
    for s in sessions:
        assert store.close(s.id) is s and store.by_key(s.api_key) is None
    oldest, *kept = sessions
    assert store.records(oldest.id) is None and store.close(oldest.id) is None  # dropped: unknown again
    for s in kept:
        assert [r.call_id for r in store.records(s.id) or []] == [f"c-{s.id}"]
        assert store.close(s.id) == ClosedSession(s.id, s.records)
    assert (len(store), store.live) == (3, 0)


def test_the_engine_loads_the_forced_tokens_processor() -> None:
    """`polar engine up` loads the processor scripted turns need, from a folder of its own on the engine's path (not
    the proxy's site-packages); with speculative decoding, which vLLM refuses beside it, it does not."""
    from nemo_polar.engine.launcher import FORCED_TOKENS, EngineSpec

    cmd, env = EngineSpec(model="tiny-qwen3").command()
    assert cmd[cmd.index("--logits-processors") + 1] == FORCED_TOKENS
    module = FORCED_TOKENS.split(":")[0]
    folder = Path(env["PYTHONPATH"].split(":")[0])
    assert (folder / f"{module}.py").is_file() and not (folder / "nemo_polar").exists()
    spec = EngineSpec(model="tiny-qwen3", extra_args=['--speculative-config={"method": "ngram"}'])
    assert "--logits-processors" not in spec.command()[0]


def test_a_port_promised_to_another_process_is_not_handed_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two processes sharing a run directory (make test's two lanes, a bench beside the demo) never get the same
    port while either may still be starting the server that binds it."""
    import subprocess
    import sys

    from nemo_polar.engine import launcher

    monkeypatch.setenv("POLAR_CACHE", str(tmp_path))
    code = "from nemo_polar.engine.launcher import free_port; print(free_port())"
    theirs = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    kernel_offers = iter([theirs, theirs, 1])  # the kernel offers their port again, then another

    class Offered:
        def __enter__(self) -> Offered:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def bind(self, address: tuple[str, int]) -> None:
            self.port = next(kernel_offers)

        def getsockname(self) -> tuple[str, int]:
            return ("127.0.0.1", self.port)

    monkeypatch.setattr(launcher.socket, "socket", Offered)
    assert launcher.free_port() == 1
    held = json.loads((tmp_path / "run" / "ports.json").read_text())
    assert set(held) == {str(theirs), "1"}
    (tmp_path / "run" / "ports.json").write_text("not json")  # unreadable: this process's own still hold
    kernel_offers = iter([1, 2])
    assert launcher.free_port() == 2


def test_a_live_session_s_records_are_read_from_its_file_whole_lines_only(tmp_path: Path) -> None:
    """With a record_dir, a committed call's prompt list is shared with the calls that continue it (extended in place:
    ``CallRecord.share_prompt``), so a live session's records are read from its file, as written; a line still being
    appended is not read."""
    from nemo_polar.proxy.conversation import Conversation, Message
    from nemo_polar.proxy.store.records import CallRecord
    from nemo_polar.proxy.store.sessions import SessionConfig, SessionStore

    store = SessionStore(tmp_path)
    session = store.create(SessionConfig())
    conv = Conversation(model="m", messages=[Message(role="user", content="hi")])
    made = []
    for i in range(3):
        prompt = [*made[-1].prompt_view()[0], 7, 8] if made else [1, 2, 3]
        record = CallRecord(
            call_id=f"c{i}", session_id=session.id, api="chat", mode="continuation", request={"n": i},
            started_at=0, prompt_token_ids=prompt, sampled_token_ids=[5], complete=True,
        )  # fmt: skip
        session.writer.append_sync(record)
        session.commit(record, conv, Message(role="assistant", content=f"r{i}"), [])
        made.append(record)
    assert [r.prompt_view()[1] for r in made] == [3, 5, 7] and made[0].prompt_token_ids == []
    assert session.writer.path is not None
    with session.writer.path.open("a") as fh:
        fh.write('{"call_id": "half-writ')  # a line being appended
    records = store.records(session.id) or []
    assert [r.call_id for r in records] == ["c0", "c1", "c2"]
    assert [r.prompt_token_ids for r in records] == [[1, 2, 3], [1, 2, 3, 7, 8], [1, 2, 3, 7, 8, 7, 8]]


def test_the_proxy_returns_its_allocator_s_free_memory_every_so_often(monkeypatch: pytest.MonkeyPatch) -> None:
    """``trim_heap`` calls glibc's ``malloc_trim`` every ``trim_heap_s`` seconds (found on this machine's libc) until
    it is cancelled; where the libc has none it does nothing."""
    from nemo_polar.proxy.http import proxy as proxy_module

    real = proxy_module._malloc_trim()
    assert real is not None and real(0) in (0, 1)
    calls: list[int] = []
    monkeypatch.setattr(proxy_module, "_malloc_trim", lambda: lambda pad: calls.append(pad) or 0)

    async def run() -> None:
        task = asyncio.create_task(proxy_module.trim_heap(0.001))
        for _ in range(10_000):  # until it has trimmed twice, however slow the machine
            if len(calls) >= 2:
                break
            await asyncio.sleep(0.001)
        task.cancel()

    asyncio.run(run())
    assert calls[:2] == [0, 0]
    monkeypatch.setattr(proxy_module, "_malloc_trim", lambda: None)
    asyncio.run(asyncio.wait_for(proxy_module.trim_heap(0.001), 5))  # no malloc_trim: returns at once
