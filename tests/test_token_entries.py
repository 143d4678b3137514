"""Proxy records in NeMo Gym's token-capture language (nemo-gym 0.7.0, ``nemo_gym/token_id_capture/``).

The rules restated here are Gym's: ``records.py`` (``TokenEntry``, ``stamp_lineage``: ``cum_len``/``digest`` over the
full sequence, ROOT/UNRESOLVED carry no parent), ``sink.py`` (a lost capture is ``mark_incomplete``), ``store.py`` (the
reference sink/source), ``conformance.py`` (the contract, run unmodified), ``builder.py`` (``prefix_merging``, the
builder ours is cross-checked against) and ``consumer.py`` (``trajectories_from_source``: what a trainer gets).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

pytest.importorskip("nemo_gym", reason="nemo-gym is not installed (make gym)")

from nemo_gym.token_id_capture.builder import assert_prefix_contiguity
from nemo_gym.token_id_capture.conformance import run_conformance
from nemo_gym.token_id_capture.consumer import trajectories_for_rollout, trajectories_from_source
from nemo_gym.token_id_capture.records import ParentResolutionStatus, TokenEntry, compute_digest
from nemo_gym.token_id_capture.store import TokenCaptureStore

from nemo_polar.cli import main as polar
from nemo_polar.env.gym.token_check import cross_check
from nemo_polar.env.gym.token_store import PolarLineageStore, PolarTokenStore
from nemo_polar.env.gym.tokens import export_rollout, export_sessions, publish, rollout_id_of, token_entry
from nemo_polar.proxy.store.records import CallRecord
from nemo_polar.reconstruct.builders import BuilderConfig, prefix_merging
from nemo_polar.reconstruct.gym import gym_output_items
from nemo_polar.reconstruct.io import load_records
from tests.conftest import ENV_HARNESSES, ProxyHandle
from tests.helpers.records import (
    CONTEXT,
    EOT,
    GLUE,
    HEADER,
    NL,
    chat,
    child,
    full,
    main_and_subagent,
    rec,
    subagent_and_compaction,
    tool_turn,
)
from tests.helpers.sessions import ScriptedSessions

SESSION = "sess-" + "0" * 32
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {}}}}]


def session_file(record_dir: Path, records: list[CallRecord], session_id: str = SESSION) -> Path:
    path = record_dir / f"{session_id}.jsonl"
    with path.open("a") as fh:
        for r in records:
            fh.write(r.model_copy(update={"session_id": session_id}).model_dump_json() + "\n")
    return path


def token_items(response: dict) -> list[tuple[list[int], list[int], list[float]]]:
    """The token fields of a Gym response's token-bearing items (what NeMo-RL trains on)."""
    fields = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")
    return [tuple(it[f] for f in fields) for it in response["output"] if it.get("generation_token_ids") is not None]


# -- the exporter: records.py's TokenEntry, field by field -----------------------------------------------------------
def test_a_record_maps_to_a_token_entry_field_by_field() -> None:
    a = rec(
        "call-a",
        [1, 2],
        [10, EOT],
        request={"model": "local-model", "messages": [{"role": "user", "content": "x"}], "tools": TOOLS},
        output_text='<think>plan</think>\n\nsure\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n'
        "</tool_call>",
        finished_at=7.5,
        policy_version=3,
    )
    entry = token_entry(a, "rollout-1")
    assert TokenEntry.model_validate(entry.model_dump(mode="json")) == entry  # Gym's own validator accepts it
    assert (entry.rollout_id, entry.model_call_id, entry.model) == ("rollout-1", "call-a", "local-model")
    assert entry.prompt_token_ids == [1, 2] and entry.generation_token_ids == [10, EOT]
    assert entry.generation_log_probs == a.sampled_logprobs and entry.created_at == 7.5
    assert entry.schema_version == 1 and entry.response_id is None and not entry.prompt_is_delta
    # the assistant turn as Responses output items, parsed the way the proxy parsed it for the harness
    assert [it["type"] for it in entry.output_items] == ["reasoning", "message", "function_call"]
    assert entry.output_items[0]["summary"][0]["text"] == "plan"
    assert entry.output_items[1]["content"][0]["text"] == "sure"
    assert {k: entry.output_items[2][k] for k in ("name", "arguments")} == {
        "name": "bash",
        "arguments": '{"command": "ls"}',
    }
    assert entry.token_item_index == 2
    # lineage stamped by Gym's stamp_lineage: digest and length of the full sequence; a first call is a root
    assert entry.parent_resolution == ParentResolutionStatus.ROOT and entry.parent_call_id is None
    assert entry.cum_len == 4 and entry.digest == compute_digest([1, 2, 10, EOT])
    extra = entry.model_dump(include={"polar_session_id", "polar_policy_version", "polar_finish_reason", "polar_mode"})
    assert extra == {
        "polar_session_id": "s",
        "polar_policy_version": 3,
        "polar_finish_reason": "stop",
        "polar_mode": "continuation",
    }


def test_lineage_is_the_proxys_request_time_decision_in_gyms_terms() -> None:
    a = rec("a", [1], [10, EOT])
    b = child("b", a, [20], [11, EOT])  # continued by the proxy: exact ids supplied
    sub = rec("sub", [7], [40, EOT], render_reason="new_conversation")  # no model-authored history: a root
    compacted = rec("k", [1, 99], [50, EOT], render_reason="history_diverged")  # history the proxy cannot prove
    unproven = rec("u", [1, 10, EOT, 5], [51, EOT], render_reason="engine_render:assistant_turn_not_from_proxy")
    legacy = rec("l", [3], [52, EOT], render_reason=None)  # no decision recorded
    chat_b = child("cb", a, [20], [12, EOT], mode="chat")  # linked, but the engine re-rendered: nothing supplied
    prefix_b = child("pb", a, [20], [13, EOT], mode="chat_prefix")
    bad_prefix = rec("bp", [1, 99], [14, EOT], mode="chat_prefix", parent_call_id="a")  # asked for, not applied
    by_id = {r.call_id: r for r in (a, b, sub, compacted, unproven, legacy, chat_b, prefix_b, bad_prefix)}
    entries = {cid: token_entry(r, "s", by_id.get(r.parent_call_id or "")) for cid, r in by_id.items()}
    decided = {cid: (e.parent_resolution, e.parent_call_id, e.parent_resolution_reason) for cid, e in entries.items()}
    resolved, root, unresolved = (
        ParentResolutionStatus.RESOLVED,
        ParentResolutionStatus.ROOT,
        ParentResolutionStatus.UNRESOLVED,
    )
    assert decided == {
        "a": (root, None, ""),
        "b": (resolved, "a", ""),
        "sub": (root, None, ""),
        "k": (unresolved, None, "history_diverged"),
        "u": (unresolved, None, "assistant_turn_not_from_proxy"),
        "l": (None, None, ""),
        "cb": (resolved, "a", ""),
        "pb": (resolved, "a", ""),
        "bp": (resolved, "a", ""),
    }
    supplied = {cid: (e.prefix_requested, e.prefix_supplied) for cid, e in entries.items() if e.parent_call_id}
    assert supplied == {"b": (True, True), "cb": (False, False), "pb": (True, True), "bp": (True, False)}


def test_failed_calls_are_gyms_incomplete_marks_and_rollout_ids_follow_the_gym_agent() -> None:
    a = rec("a", [1], [10, EOT])
    bad = rec("bad", [1, 10, EOT, 5], [77], complete=False, error="engine died", finish_reason=None)
    export = export_rollout([bad, a], "r-1")
    assert [e.model_call_id for e in export.entries] == ["a"] and export.incomplete_call_ids == ["bad"]
    with pytest.raises(ValueError, match="not complete"):
        token_entry(bad, "r-1")
    # a session's rollout id: the Gym agent's metadata.rollout_id, else the session id; validated like Gym's store
    assert rollout_id_of(SESSION, {"rollout_id": "7-0", "gym_agent": "polar"}) == "7-0"
    assert rollout_id_of(SESSION) == SESSION
    with pytest.raises(ValueError, match="Invalid rollout id"):
        rollout_id_of(SESSION, {"rollout_id": "../x"})
    other = rec("b", [2], [11, EOT], session_id="t")
    grouped = export_sessions({"s": [a, bad], "t": [other]}, {"s": "r-1", "t": "r-1"})
    assert [(x.rollout_id, x.session_ids, [e.model_call_id for e in x.entries]) for x in grouped] == [
        ("r-1", ["s", "t"], ["a", "b"])
    ]


def test_polar_reconstruct_writes_a_gym_token_store_that_gyms_consumer_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = rec("a", [1, 2], [10, EOT])
    b = child("b", a, [20], [11, EOT])
    records = session_file(tmp_path, [a, b])
    failed = session_file(tmp_path, [rec("c", [3], [12, EOT]), rec("x", [3], [], complete=False)], "sess-" + "1" * 32)
    out = tmp_path / "gym-store"
    args = ["reconstruct", str(records), str(failed), "--format", "gym-token-entries", "-o", str(out)]
    assert polar([*args, "--rollout-id", f"{SESSION}=task-3-r0"]) == 0
    assert json.loads(capsys.readouterr().out)["entries"] == 3
    # Gym's own consumer, on Gym's own file store: the rebuilt main chain is our Gym export, token for token
    built = trajectories_for_rollout("task-3-r0", [out])
    assert built is not None and built["mask_sample"] is False
    [trace] = prefix_merging(load_records([records])[SESSION]).traces
    by_id = {r.call_id: r.model_copy(update={"session_id": SESSION}) for r in (a, b)}
    assert token_items(built["rebuilt_response"]) == token_items({"output": gym_output_items(trace, by_id)})
    # a failed call is Gym's incomplete mark: its consumer masks the rollout
    masked = trajectories_for_rollout("sess-" + "1" * 32, [out])
    assert masked is not None and masked["mask_sample"] is True and masked["metrics"]["capture_incomplete"] is True
    # writing again replaces the rollout (no conflict with the frozen copy the consumer left)
    assert polar([*args, "--rollout-id", f"{SESSION}=task-3-r0"]) == 0
    with pytest.raises(SystemExit, match="SESSION_ID=ROLLOUT_ID"):
        polar([*args, "--rollout-id", "no-equals-sign"])
    with pytest.raises(SystemExit, match="names sessions not in the records: sess-nope"):
        polar([*args, "--rollout-id", "sess-nope=r"])
    with pytest.raises(SystemExit, match="--rollout-id is for --format gym-token-entries"):
        polar(["reconstruct", str(records), "-o", str(tmp_path / "t.jsonl"), "--rollout-id", f"{SESSION}=r"])


# -- PolarTokenStore: Gym's TokenSink/TokenSource over the proxy's record dir -----------------------------------------
def test_polar_token_store_passes_gyms_conformance_suite(tmp_path: Path) -> None:
    """``run_conformance`` exactly as its docstring says: factories return fresh clients over one shared backend."""
    backend = tmp_path / "records"
    passed = asyncio.run(
        run_conformance(
            lambda: PolarTokenStore(backend),
            lambda: PolarTokenStore(backend),
            lambda: PolarLineageStore(backend),
        )
    )
    assert passed == [
        "put_then_freeze_visibility",
        "idempotent_reput",
        "conflicting_reput",
        "mark_incomplete_durability",
        "freeze_idempotency",
        "post_freeze_write_safety",
        "conditional_retirement",
        "lineage_visibility",
        "fresh_client_lineage_visibility",
        "begin_call_custody",
    ]
    # the store's files are beside the proxy's, never among them: a *.jsonl glob of the record dir sees none
    assert not list(backend.glob("*.jsonl")) and not list(backend.rglob(".tmp-*"))


def test_proxy_records_and_put_entries_coexist_in_one_durable_snapshot(tmp_path: Path) -> None:
    a = rec("a", [1, 2], [10, EOT], session_id=SESSION)
    b = child("b", a, [20], [11, EOT], session_id=SESSION)
    proxy_file = session_file(tmp_path, [a, b])
    gym_entry = token_entry(rec("g", [5], [6, EOT]), SESSION)

    async def scenario() -> None:
        store = PolarTokenStore(tmp_path)
        await store.put(gym_entry)
        # the proxy's own entry put again, byte for byte: one entry; with other bytes: fail closed at the reader
        await store.put(export_rollout([a, b], SESSION).entries[0].model_copy())
        snap = await store.freeze(SESSION)
        assert sorted(e.model_call_id for e in snap.entries) == ["a", "b", "g"] and not snap.incomplete
        assert [e.parent_call_id for e in sorted(snap.entries, key=lambda e: e.model_call_id)] == [None, "a", None]
        # durable: a new instance (another process) sees the same frozen snapshot
        again = await PolarTokenStore(tmp_path).freeze(SESSION)
        assert (again.snapshot_id, again.version) == (snap.snapshot_id, snap.version)
        assert {e.model_call_id: e.digest for e in again.entries} == {e.model_call_id: e.digest for e in snap.entries}
        with pytest.raises(RuntimeError, match="already frozen"):
            await store.put(token_entry(rec("h", [5], [7, EOT]), SESSION))  # Gym puts are fenced

        # the proxy cannot be fenced: a record landing after the freeze moves the version, the old snapshot is stale
        c = child("c", b, [21], [12, EOT], session_id=SESSION)
        with proxy_file.open("a") as fh:
            fh.write(c.model_dump_json())  # an append in flight: no newline yet
        assert (await store.freeze(SESSION)).version == snap.version  # a partial line is not read yet
        with proxy_file.open("a") as fh:
            fh.write("\n")
        assert not await store.drop(SESSION, snapshot_id=snap.snapshot_id, version=snap.version)
        moved = await store.freeze(SESSION)
        assert moved.version > snap.version and "c" in {e.model_call_id for e in moved.entries}
        assert await store.drop(SESSION, snapshot_id=moved.snapshot_id, version=moved.version)
        # retired: a tombstone; the proxy's records stay (the proxy owns their retention)
        assert proxy_file.exists() and not store.entries_dir(SESSION).exists()
        with pytest.raises(RuntimeError, match="retired"):
            await store.freeze(SESSION)
        with pytest.raises(RuntimeError, match="retired"):
            await store.put(gym_entry)

    asyncio.run(scenario())


def test_a_gym_rollout_id_reads_its_bound_session_and_failed_calls_mask_it(tmp_path: Path) -> None:
    a = rec("a", [1], [10, EOT])
    bad = rec("bad", [1, 10, EOT, 5], [77], complete=False, error="engine died", finish_reason=None)
    session_file(tmp_path, [a, bad])

    async def scenario() -> None:
        store = PolarTokenStore(tmp_path)
        with pytest.raises(ValueError, match="not a proxy session id"):
            await store.bind_session("task-1-r0", "../etc")
        await store.bind_session("task-1-r0", SESSION)
        snap = await PolarTokenStore(tmp_path).freeze("task-1-r0")
        assert [(e.rollout_id, e.model_call_id) for e in snap.entries] == [("task-1-r0", "a")]
        assert snap.incomplete  # the failed call: Gym's consumer must mask the rollout
        # a conflicting put under a proxy call id is caught when read: the snapshot is incomplete
        clean = PolarTokenStore(tmp_path)
        session_file(tmp_path, [a], "sess-" + "2" * 32)
        await clean.put(token_entry(rec("a", [1], [11, EOT]), "sess-" + "2" * 32))
        assert (await clean.freeze("sess-" + "2" * 32)).incomplete

    asyncio.run(scenario())


def refused_rec(call_id: str, prompt: list[int], **kw: object) -> CallRecord:
    """A call the serving side refused before sampling, as the proxy records it (test_bad_input makes real ones)."""
    fields: dict = {"complete": False, "finish_reason": None, "status_code": 400, "error": "too long"}
    return rec(call_id, prompt, [], **{**fields, "error_code": "context_length_exceeded", **kw})


def test_a_refused_call_resolves_and_a_lost_call_masks() -> None:
    """A call refused before sampling lost nothing (Gym main's engine refusal); a stream the client dropped (499)
    or an engine fault lost sampled tokens (an incomplete mark)."""
    a = rec("a", [1], [10, EOT])
    refused = refused_rec("r", [1, 10, EOT, 5], parent_call_id="a")
    dropped = rec("d", [1, 10, EOT, 6], [77], complete=False, status_code=499, error="client gone")
    fault = refused_rec("f", [1, 10, EOT, 7], status_code=502, error_code="engine_error")
    export = export_rollout([a, refused, dropped, fault], "r-1")
    assert [(r.model_call_id, r.code, r.parent_call_id) for r in export.refused] == [
        ("r", "context_length_exceeded", "a")
    ]
    assert export.incomplete_call_ids == ["d", "f"]
    old = refused_rec("old", [1], error_code=None)  # a record from before error_code: its status names it
    assert old.refused and export_rollout([old], "r-2").refused[0].code == "http_400"


def gym_file_store(root: Path) -> TokenCaptureStore:
    return TokenCaptureStore(root)


def polar_store(root: Path) -> PolarTokenStore:
    return PolarTokenStore(root)


@pytest.mark.parametrize("make", [gym_file_store, polar_store], ids=["gym_file_store", "polar_token_store"])
def test_begin_call_custody_and_delete_behave_as_in_gyms_file_store(make, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The same scenario on Gym's own file store (nemo-gym 0.7.0, nemo_gym/token_id_capture/store.py: begin_call,
    drop, delete) and on ours: an intent without an entry masks the rollout; a drop retires it (writes refused);
    ``delete`` removes everything unconditionally, retirement included, so the rollout id takes writes and freezes
    afresh."""
    entry = token_entry(rec("a", [1], [10, EOT]), "r-1")
    other = token_entry(rec("b", [2], [11, EOT]), "r-1")

    async def scenario() -> None:
        store = make(tmp_path)
        await store.begin_call("r-1", "a")
        await store.begin_call("r-1", "x")
        await store.put(entry)
        snap = await store.freeze("r-1")
        assert snap.incomplete and [e.model_call_id for e in snap.entries] == ["a"]  # "x" began, never landed
        assert await store.drop("r-1", snapshot_id=snap.snapshot_id, version=snap.version)
        with pytest.raises(RuntimeError, match=r"(?i)retired"):
            await store.put(other)
        store.delete("r-1")
        await store.put(other)
        fresh = await store.freeze("r-1")
        assert not fresh.incomplete and [e.model_call_id for e in fresh.entries] == ["b"]
        assert fresh.snapshot_id != snap.snapshot_id
        store.delete("r-1")  # unfrozen or frozen, it is gone
        assert (await store.freeze("r-1")).entries == ()

    asyncio.run(scenario())


def test_engine_refusals_resolve_intents_in_the_polar_store(tmp_path: Path) -> None:
    """Gym main's optional ``record_engine_refusal``: durable, it resolves the call's intent; refused after a
    freeze like any write; a call both sampled and refused is a conflict. ``publish`` records the proxy's refused
    calls where the sink can, and marks them incomplete in a sink that cannot (Gym 0.7.0's file store).

    Restated, not run: Gym main's sink method (``record_engine_refusal(rollout_id, *, model_call_id, code,
    parent_call_id=None, ...)``) and its conformance check ``refuse_call_resolution`` are known from Gym's docs and
    PR threads after 0.7.0 (nemo_gym/models/token_capture on main); no snapshot of that code is reachable here (the
    newest, NVIDIA-NeMo/Gym 07d6b0d of 2026-08-22, predates it). The intent rule is 0.7.0's begin_call
    (nemo_gym/token_id_capture/store.py, _dangling_intents), run on Gym's own store in the test above."""
    a = rec("a", [1], [10, EOT], session_id=SESSION)
    refused = refused_rec("r", [1, 10, EOT, 5], parent_call_id="a", session_id=SESSION)

    async def scenario() -> None:
        store = PolarTokenStore(tmp_path / "polar")
        await store.begin_call("r-1", "q")
        await store.record_engine_refusal("r-1", model_call_id="q", code="context_length_exceeded", detail="x")
        assert not (await PolarTokenStore(tmp_path / "polar").freeze("r-1")).incomplete  # durable, resolved
        with pytest.raises(RuntimeError, match="frozen"):
            await store.record_engine_refusal("r-1", model_call_id="z", code="x")
        with pytest.raises(TypeError):
            await store.record_engine_refusal("r-2", model_call_id="z", code="x", detail=object())
        await store.put(token_entry(rec("s", [1], [10, EOT]), "r-3"))
        await store.record_engine_refusal("r-3", model_call_id="s", code="x")
        assert (await store.freeze("r-3")).incomplete  # sampled and refused: one of them is wrong

        # the proxy's own refused call, read from its records: resolved, not a mask
        (tmp_path / "proxy").mkdir()
        session_file(tmp_path / "proxy", [a, refused])
        snap = await PolarTokenStore(tmp_path / "proxy").freeze(SESSION)
        assert not snap.incomplete and [e.model_call_id for e in snap.entries] == ["a"]

        export = export_rollout([a, refused], "r-9")
        ours, gyms = PolarTokenStore(tmp_path / "published"), TokenCaptureStore(tmp_path / "gym")
        assert not hasattr(gyms, "record_engine_refusal") or callable(gyms.record_engine_refusal)
        for sink in (ours, gyms):
            assert await publish(sink, [export]) == 1
        assert not (await ours.freeze("r-9")).incomplete
        if not hasattr(gyms, "record_engine_refusal"):  # Gym 0.7.0: no way to resolve it, so the rollout is masked
            assert (await gyms.freeze("r-9")).incomplete

    asyncio.run(scenario())


# -- the cross-check: Gym's prefix_merging over our entries vs ours over the records ---------------------------------
def test_builders_agree_on_linear_chains_subagents_compaction_truncation_and_chat_re_renders() -> None:
    a = rec("a", [1, 2, 3], [10, 11, EOT])
    b = child("b", a, [20, 21], [12, EOT])
    c = child("c", b, [22], [13, 14, EOT], finish_reason="length")
    linear = cross_check([c, a, b])
    assert linear.polar_chains == linear.gym_chains == [["a", "b", "c"]]
    assert linear.same_tokens and linear.polar_main == linear.gym_main == ["a", "b", "c"]
    assert linear.polar_trainable == linear.gym_trainable == 8

    mixed = cross_check(subagent_and_compaction())
    assert mixed.same_chains and mixed.same_tokens
    assert sorted(mixed.gym_chains) == [["k1"], ["m1", "m2", "m3"], ["s1", "s2"]]
    assert mixed.polar_main == mixed.gym_main == ["m1", "m2", "m3"]
    # the compaction is UNRESOLVED in Gym's terms (history the proxy could not prove): its own chain in both builders
    assert mixed.gym_unresolved_parent_calls == ["k1"] and mixed.gym_parent_link_failures == {"parent_unresolved": 1}

    # chat mode: an exact re-render merges in both (the unreported end-of-turn token is interstitial for both)
    x = chat("x", CONTEXT + HEADER + GLUE, [200, 201, EOT])
    y = chat("y", [*full(x), NL, *tool_turn(0), *HEADER, *GLUE], [300, 301], parent=x)
    z = chat("z", [*full(y), EOT, NL, *tool_turn(1), *HEADER, *GLUE], [400, EOT], parent=y)
    exact = cross_check([x, y, z])
    assert exact.polar_chains == exact.gym_chains == [["x", "y", "z"]] and exact.same_tokens
    # dropped generation glue: every recorded link fails the token rule; ours segments, Gym's digest check breaks
    y2 = chat("y2", CONTEXT + HEADER + [200, 201, EOT, NL, *tool_turn(0), *HEADER, *GLUE], [300, EOT], parent=x)
    z2 = chat(
        "z2", [*y2.prompt_token_ids[: -len(GLUE)], 300, EOT, NL, *tool_turn(1), *HEADER, *GLUE], [400, EOT], parent=y2
    )
    glue = cross_check([x, y2, z2])
    assert glue.polar_chains == glue.gym_chains == [["x"], ["y2"], ["z2"]] and glue.same_tokens
    assert glue.gym_parent_link_failures == {"parent_digest_mismatch": 2}

    # a failed call: listed by ours, Gym's incomplete mark; the chains are the same
    bad = rec("bad", [1, 10, EOT, 5], [77], complete=False, error="engine died", finish_reason=None)
    failed = cross_check([a, bad])
    assert failed.polar_chains == failed.gym_chains == [["a"]] and failed.failed_calls == ["bad"]


def test_builders_differ_by_design_and_each_difference_is_exact() -> None:
    # 1. Retry siblings (identical prompts): ours keeps the one no later call extends as its own "branch" trace; Gym
    #    quarantines it (its tokens are dropped).
    a = rec("a", [1, 2], [10, EOT])
    r1, r2 = child("r1", a, [20], [30, EOT]), child("r2", a, [20], [31, EOT])
    n = child("n", r2, [21], [32, EOT])
    retry = cross_check([a, r1, r2, n])
    assert retry.polar_chains == [["a", "r2", "n"], ["r1"]] and retry.gym_chains == [["a", "r2", "n"]]
    assert retry.gym_quarantined == ["r1"] and retry.polar_trainable - retry.gym_trainable == len(r1.sampled_token_ids)
    # ... and when no later call says which sibling the harness kept, ours keeps the later attempt on the chain, Gym
    #    the smaller call id, and Gym reports both as unresolved retries (its consumer masks the rollout).
    b1, b2 = child("b1", a, [5], [11, EOT]), child("b2", a, [5], [12, EOT])
    leaf = cross_check([a, b1, b2])
    assert leaf.polar_chains == [["a", "b2"], ["b1"]] and leaf.gym_chains == [["a", "b1"]]
    assert leaf.gym_quarantined == ["b2"] and leaf.gym_unresolved_retries == ["b1", "b2"]

    # 2. Branches with different prompts: ours puts every call in exactly one trace (the branch starts its own);
    #    Gym emits every root-to-leaf path, so the shared prefix is in (and trainable in) each.
    c1, c2 = child("c1", a, [5], [11, EOT]), child("c2", a, [6], [12, EOT])
    branch = cross_check([a, c1, c2])
    assert branch.polar_chains == [["a", "c2"], ["c1"]] and sorted(branch.gym_chains) == [["a", "c1"], ["a", "c2"]]
    assert branch.gym_trainable - branch.polar_trainable == len(a.sampled_token_ids)

    # 3. A call the proxy linked whose prompt fails the token rule but still extends an earlier call of the chain
    #    (chat mode: the parent's turn was re-tokenised): ours stitches it there, the re-rendered turn masked, and the
    #    skipped call keeps its own trace; Gym's digest check is a hard boundary, so the call starts an unresolved
    #    fragment. Same calls, same trainable tokens, different chains.
    p = chat("p", CONTEXT + HEADER, [200, 201, EOT])
    q = chat("q", [*full(p), NL, *tool_turn(0), *HEADER], [300, 301, 302, EOT], parent=p)
    r = chat("r", [*q.prompt_token_ids, 300, 399, EOT, NL, *tool_turn(1), *HEADER], [400, EOT], parent=q)
    s = chat("s", [*full(r), NL, *tool_turn(2), *HEADER], [401, EOT], parent=r)
    retok = cross_check([p, q, r, s])
    assert retok.polar_chains == [["p", "r", "s"], ["q"]] and retok.gym_chains == [["p", "q"], ["r", "s"]]
    assert retok.gym_unresolved_parent_calls == ["r"] and retok.polar_trainable == retok.gym_trainable

    # 4. A request the proxy could not continue (UNRESOLVED) whose fresh render happens to extend an earlier call:
    #    ours merges by tokens; Gym never merges across an unresolved decision.
    u = rec("u", [*full(a), 5], [11, EOT], render_reason="assistant_turn_not_from_proxy")
    unresolved = cross_check([a, u])
    assert unresolved.polar_chains == [["a", "u"]] and unresolved.gym_chains == [["a"], ["u"]]
    assert unresolved.gym_unresolved_parent_calls == ["u"] and unresolved.polar_trainable == unresolved.gym_trainable

    # 5. A completed call that sampled nothing: ours keeps its (empty) span; Gym drops it and re-attaches the next
    #    call by prefix. The token sequences are identical.
    e = child("e", a, [5], [])
    nxt = child("nxt", e, [6], [11, EOT])
    empty = cross_check([a, e, nxt])
    assert empty.polar_chains == [["a", "e", "nxt"]] and empty.gym_chains == [["a", "nxt"]]
    assert empty.gym_empty_generation_calls == ["e"]
    assert empty.gym_parent_link_failures == {"parent_call_id_missing_recovered": 1}
    assert [(c.tokens, c.loss_mask) for c in empty.polar] == [(c.tokens, c.loss_mask) for c in empty.gym]

    # 6. mask_truncated (ours, opt-in): a call cut by max_tokens keeps its ids but not their loss; Gym trains them.
    t = rec("t", [1, 2], [10, 11], finish_reason="length")
    t2 = child("t2", t, [EOT, 20], [12, EOT])
    truncated = cross_check([t, t2], BuilderConfig(mask_truncated=True))
    assert truncated.same_chains and not truncated.same_tokens
    assert truncated.gym_trainable - truncated.polar_trainable == len(t.sampled_token_ids)


# -- real sessions through the proxy on the real engine --------------------------------------------------------------
@pytest.mark.engine
def test_real_session_with_a_subagent_through_the_store_and_gyms_consumer(proxy: ProxyHandle) -> None:
    """The shape of ``test_reconstruct``'s real session (continuation mode, a main agent and an interleaved
    subagent): both builders agree; Gym's consumer, reading it through :class:`PolarTokenStore`, masks the rollout for
    its two roots unless the terminal call is named, and then delivers exactly our main trace."""
    _, records = main_and_subagent(proxy, 3, metadata={"rollout_id": "task-9-r1"})
    check = cross_check(records)
    assert check.same_chains and check.same_tokens and len(check.gym) == 2
    assert check.polar_main == check.gym_main and len(check.polar_main) == 3
    assert not (check.gym_quarantined or check.gym_unresolved_parent_calls or check.gym_parent_link_failures)

    async def through_the_store() -> tuple[dict, dict]:
        store = PolarTokenStore(proxy.record_dir)
        await store.bind_session("task-9-r1", records[0].session_id)  # the rollout id the Gym agent set
        strict = await trajectories_from_source("task-9-r1", store)
        named = await trajectories_from_source("task-9-r1", store, explicit_terminal_call_id=check.polar_main[-1])
        return strict, named

    strict, named = asyncio.run(through_the_store())
    assert strict is not None and strict["mask_sample"] is True and strict["metrics"]["roots"] == 2
    assert named is not None and named["mask_sample"] is False
    [trace] = [t for t in prefix_merging(records).traces if t.role == "main"]
    ours = gym_output_items(trace, {r.call_id: r for r in records})
    assert token_items(named["rebuilt_response"]) == token_items({"output": ours})


@pytest.mark.engine
@pytest.mark.parametrize("harness", ENV_HARNESSES)
def test_real_cli_sessions_agree_with_gyms_builder(
    proxy: ProxyHandle, scripted_sessions: ScriptedSessions, harness: str
) -> None:
    """One scripted session of each real CLI in bwrap (``test_harness``'s helpers): Gym's prefix_merging over the
    exported entries gives our chain, and Gym's consumer over :class:`PolarTokenStore` delivers our Gym items."""
    result, _ = scripted_sessions(harness)  # the session test_harness checks, read here from Gym's side
    assert result.status == "completed", result.error
    records = result.records
    check = cross_check(records)
    assert check.polar_chains == check.gym_chains == [[r.call_id for r in records]]
    assert check.same_tokens and check.polar_trainable == sum(len(r.sampled_token_ids) for r in records)
    assert not (check.gym_quarantined or check.gym_unresolved_parent_calls or check.gym_parent_link_failures)
    # the scripted turns: four tool calls, then the final answer, as the harness's own API returned them (mini-swe-agent
    # submits with a command beside its answer: a reply without one is a format error to it)
    entries = export_rollout(records, f"cli-{harness.replace('_', '-')}").entries
    assert [e.output_items[-1]["type"] for e in entries[:4]] == ["function_call"] * 4
    [answer] = [item for item in entries[-1].output_items if item["type"] == "message"]
    assert answer["content"][0]["text"] == "Fixed add in calc.py."

    async def through_the_store() -> dict | None:
        store = PolarTokenStore(proxy.record_dir)
        await store.bind_session(f"gym-{harness.replace('_', '-')}", result.session_id or "")
        return await trajectories_from_source(f"gym-{harness.replace('_', '-')}", store)

    built = asyncio.run(through_the_store())
    assert built is not None and built["mask_sample"] is False
    assert_prefix_contiguity(built["rebuilt_response"])
    [trace] = prefix_merging(records).traces
    assert token_items(built["rebuilt_response"]) == token_items(
        {"output": gym_output_items(trace, {r.call_id: r for r in records})}
    )
