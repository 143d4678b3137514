"""Trajectory reconstruction: synthetic record sets for every edge case, then real proxy sessions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_polar.proxy.store.records import CallRecord
from nemo_polar.reconstruct.audit import audit
from nemo_polar.reconstruct.builders import BuilderConfig, BuildResult, _trace, per_request, prefix_merging
from nemo_polar.reconstruct.gym import check_contiguous, gym_output_items
from nemo_polar.reconstruct.io import load_records
from tests.conftest import ProxyHandle, load_fixture
from tests.helpers.clients import loopback, openai_client
from tests.helpers.records import (
    CONTEXT,
    ENDOFTEXT,
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


def calls_of(result) -> list[list[str]]:
    return [t.call_ids for t in result.traces]


def test_linear_chain_merges_into_one_exact_trace() -> None:
    a = rec("a", [1, 2, 3], [10, 11, EOT])
    b = child("b", a, [20, 21], [12, EOT])
    c = child("c", b, [22], [13, 14, EOT])
    result = prefix_merging([c, a, b])  # order of arrival in the file does not matter
    [trace] = result.traces
    assert trace.call_ids == ["a", "b", "c"] and trace.break_reason is None and trace.weight == 1.0
    assert trace.prompt_ids == [1, 2, 3]
    assert trace.response_ids == [10, 11, EOT, 20, 21, 12, EOT, 22, 13, 14, EOT]
    assert trace.loss_mask == [1, 1, 1, 0, 0, 1, 1, 0, 1, 1, 1]
    assert trace.logprobs[3] is None and trace.logprobs[5] == pytest.approx(-0.1)
    assert audit(result.traces, [a, b, c]).ok
    items = gym_output_items(trace, {r.call_id: r for r in (a, b, c)})
    check_contiguous(items)
    assert items[2]["prompt_token_ids"] == c.prompt_token_ids


def test_identical_prompt_retry_is_kept_as_its_own_trace() -> None:
    a = rec("a", [1, 2], [10, EOT])
    retry1 = child("r1", a, [20], [30, EOT])
    retry2 = child("r2", a, [20], [31, EOT])  # same prompt, resampled
    nxt = child("n", retry2, [21], [32, EOT])
    result = prefix_merging([a, retry1, retry2, nxt])
    assert sorted(calls_of(result)) == [["a", "r2", "n"], ["r1"]]
    assert {t.break_reason for t in result.traces} == {None, "retry"}
    assert result.break_reasons == {"retry": 1}
    assert audit(result.traces, [a, retry1, retry2, nxt]).ok
    assert sum(t.weight for t in result.traces) == pytest.approx(1.0)


def test_leaf_siblings_prefer_the_later_attempt() -> None:
    a = rec("a", [1], [10, EOT])
    b1, b2 = child("b1", a, [5], [11, EOT]), child("b2", a, [5], [12, EOT])
    assert calls_of(prefix_merging([a, b1, b2])) == [["a", "b2"], ["b1"]]


def test_interleaved_subagent_and_compaction_become_their_own_traces() -> None:
    records = subagent_and_compaction()
    result = prefix_merging(records)
    roles = {t.role: t.call_ids for t in result.traces}
    assert roles == {"main": ["m1", "m2", "m3"], "subagent": ["s1", "s2"], "compaction": ["k1"]}
    assert result.break_reasons == {"new_conversation": 1, "history_diverged": 1}
    assert audit(result.traces, records).ok
    assert [t.weight for t in result.traces] == pytest.approx([1 / 3] * 3)


def test_truncated_call_continues_and_can_be_masked() -> None:
    a = rec("a", [1, 2], [10, 11], finish_reason="length")
    b = child("b", a, [EOT, 20], [12, EOT])  # the proxy closed the truncated turn with an end-of-turn token
    [trace] = prefix_merging([a, b]).traces
    assert trace.loss_mask == [1, 1, 0, 0, 1, 1]
    [masked] = prefix_merging([a, b], BuilderConfig(mask_truncated=True)).traces
    assert masked.loss_mask == [0, 0, 0, 0, 1, 1] and masked.logprobs[:2] == [None, None]
    assert audit([masked], [a, b]).ok  # ids still equal what was sampled


def test_failed_calls_are_listed_not_traced() -> None:
    a = rec("a", [1], [10, EOT])
    bad = rec("bad", [1, 10, EOT, 5], [77], complete=False, error="engine died", finish_reason=None)
    result = prefix_merging([a, bad])
    assert calls_of(result) == [["a"]] and result.failed_call_ids == ["bad"]


def test_chat_mode_drift_segments_instead_of_splicing() -> None:
    a = rec("a", [1, 2], [10, 11, EOT], mode="chat")
    # the engine re-rendered history with another tokenisation of the assistant turn ([10, 11] -> [9])
    b = rec("b", [1, 2, 9, EOT, 20], [12, EOT], mode="chat", parent_call_id="a", render_reason="engine_render:cont")
    result = prefix_merging([a, b])
    assert calls_of(result) == [["a"], ["b"]]
    assert result.traces[1].break_reason == "retokenized"  # a's prompt is intact, its turn is not
    assert [(t.role, t.segment) for t in result.traces] == [("main", 0), ("main", 1)]
    assert audit(result.traces, [a, b]).ok  # each trace's context is what the engine saw


def test_side_calls_are_flagged_and_weightless() -> None:
    aux = load_fixture("qwen-code", "text_aux_memory_extraction.json")["body"]
    a = rec("a", [1], [10, EOT])
    side = rec("aux", [3, 4], [60, EOT], request=aux, render_reason="new_conversation")
    result = prefix_merging([a, side])
    by_role = {t.role: t for t in result.traces}
    assert by_role["side"].call_ids == ["aux"] and by_role["side"].weight == 0.0
    assert by_role["main"].weight == 1.0


def test_gemini_cli_utility_calls_are_side_calls_and_tool_output_cannot_make_one() -> None:
    """Gemini CLI's router (by its system prompt) and next-speaker check (by its last user text) are side calls; the
    same words in a tool's output or in what an agent printed (text the agent controls) leave a call in its chain."""
    router = load_fixture("gemini-cli", "text_aux_router_classifier.json")["body"]
    turn = load_fixture("gemini-cli", "tool_turn2.json")["body"]
    ask = "Based *strictly* on that response, determine who should logically speak next: the 'user' or the 'model'."
    next_speaker = {"contents": [*turn["contents"], {"role": "user", "parts": [{"text": ask}]}]}
    planted = {"name": "run_shell_command", "response": {"output": ask}}
    in_output = {
        **turn,
        "contents": [*turn["contents"][:-1], {"role": "user", "parts": [{"functionResponse": planted}]}],
    }
    chat_tool = {"messages": [{"role": "user", "content": "go"}, {"role": "tool", "content": ask, "tool_call_id": "c"}]}
    # mini-swe-agent's text mode: a command's output comes back as a user message, no tools declared
    printed = {"messages": [{"role": "user", "content": "go"}, {"role": "user", "content": f"<output>{ask}</output>"}]}
    a = rec("a", [1], [10, EOT])
    calls = [
        a,
        rec("router", [3], [60, EOT], api="gemini", request=router, render_reason="new_conversation"),
        rec("next", [4], [61, EOT], api="gemini", request=next_speaker, render_reason="history_diverged"),
        child("planted", a, [5], [62, EOT], api="gemini", request=in_output),
        child("tool", a, [6], [63, EOT], request=chat_tool),
        child("printed", a, [7], [64, EOT], request=printed),
    ]
    roles = {call: t.role for t in prefix_merging(calls).traces for call in t.call_ids}
    assert roles["router"] == roles["next"] == "side"
    assert roles["planted"] != "side" and roles["tool"] != "side" and roles["printed"] != "side"


def test_per_request_builder() -> None:
    a = rec("a", [1], [10, EOT])
    b = child("b", a, [20], [11, EOT])
    result = per_request([a, b])
    assert calls_of(result) == [["a"], ["b"]]
    assert result.traces[1].prompt_ids == b.prompt_token_ids and result.traces[1].loss_mask == [1, 1]
    assert [t.weight for t in result.traces] == [0.5, 0.5]
    assert audit(result.traces, [a, b]).ok


def test_bad_record_files_name_the_line(tmp_path: Path) -> None:
    good = rec("a", [1], [10, EOT]).model_dump_json()
    path = tmp_path / "s.jsonl"
    path.write_text(good + "\n{not json\n")
    with pytest.raises(ValueError, match=r"s\.jsonl:2: not a valid call record"):
        load_records([path])
    mismatched = rec("b", [1], [10, EOT]).model_copy(update={"sampled_logprobs": [-1.0]})
    path.write_text(good + "\n" + mismatched.model_dump_json() + "\n")
    with pytest.raises(ValueError, match=r"s\.jsonl:2: record b has 2 sampled ids but 1 logprobs"):
        load_records([path])
    no_prompt = rec("c", [], [10])
    path.write_text(no_prompt.model_dump_json() + "\n")
    with pytest.raises(ValueError, match=r"s\.jsonl:1: record c is complete but has no prompt_token_ids"):
        load_records([path])
    with pytest.raises(FileNotFoundError):
        load_records([tmp_path / "missing.jsonl"])


def test_real_session_through_the_proxy(proxy: ProxyHandle, tmp_path: Path) -> None:
    """A multi-turn agent with an interleaved subagent, recorded by the proxy on the real engine."""
    path, records = main_and_subagent(proxy, 4)
    result = prefix_merging(records)
    assert {t.role: len(t.spans) for t in result.traces} == {"main": 4, "subagent": 2}
    assert result.break_reasons == {"new_conversation": 1}
    report = audit(result.traces, records)
    assert report.ok and report.calls == 6
    by_id = {r.call_id: r for r in records}
    for trace in result.traces:
        check_contiguous(gym_output_items(trace, by_id))
    assert len(per_request(records).traces) == 6

    out = tmp_path / "traces.jsonl"
    cli = [sys.executable, "-m", "nemo_polar.cli"]
    done = subprocess.run([*cli, "reconstruct", str(path), "-o", str(out)], capture_output=True, text=True, check=True)
    assert json.loads(done.stdout)["traces"] == 2 and len(out.read_text().splitlines()) == 2
    checked = subprocess.run([*cli, "audit", str(path)], capture_output=True, text=True)
    assert checked.returncode == 0 and json.loads(checked.stdout)["ok"] is True


def test_session_is_the_unit_of_reward_and_advantage() -> None:
    from nemo_polar.rewards.advantages import assign, group_advantages

    m1 = rec("m1", [1], [10, EOT], session_id="won")
    s1 = rec("s1", [7], [40, EOT], session_id="won", render_reason="new_conversation")
    k1 = rec("k1", [9], [50, EOT], session_id="won", render_reason="history_diverged")
    other = rec("o1", [1], [11, EOT], session_id="lost")
    traces = prefix_merging([m1, s1, k1]).traces + prefix_merging([other]).traces
    rewards = {"won": 1.0, "lost": 0.0}
    advantages = group_advantages(rewards)
    assert advantages == {"won": 0.5, "lost": -0.5}
    assign(traces, rewards, advantages)
    per_session: dict[str, float] = {}
    for t in traces:
        per_session[t.session_id] = per_session.get(t.session_id, 0.0) + t.weight * t.advantage
    assert per_session == pytest.approx({"won": 0.5, "lost": -0.5})  # three traces weigh what one does
    assert group_advantages({"a": 1.0, "b": 1.0}, scale_by_std=True) == {"a": 0.0, "b": 0.0}
    with pytest.raises(KeyError, match="no reward for session"):
        assign(traces, {"won": 1.0}, advantages)


def test_logprob_recomputation_matches_the_engine(proxy: ProxyHandle, engine_url: str) -> None:
    """Trainable logprobs recomputed with transformers under the engine's own weights agree with vLLM's; a
    corrupted set does not."""

    from nemo_polar.reconstruct.recompute import recompute_logprobs

    session = proxy.session(sampling_overrides={"max_tokens": 12})
    client = openai_client(proxy, session["api_key"])
    history = [{"role": "user", "content": "hello"}]
    for turn in range(2):
        reply = client.chat.completions.create(model="local-model", messages=history)
        history += [
            {"role": "assistant", "content": reply.choices[0].message.content},
            {"role": "user", "content": f"more {turn}"},
        ]
    records = proxy.records(session["session_id"])
    [trace] = prefix_merging([CallRecord.model_validate(r) for r in records]).traces
    model_dir = loopback.get(f"{engine_url}/v1/models", timeout=10).json()["data"][0]["root"]
    report = recompute_logprobs([trace], Path(model_dir))
    assert report["tokens"] == trace.trainable_tokens == 24
    assert report["mean_abs_logprob_delta"] < 0.05 and 0.0 <= report["kl_k3"] < 0.01
    shifted = trace.model_copy(update={"logprobs": [lp + 1.0 if lp is not None else None for lp in trace.logprobs]})
    assert recompute_logprobs([shifted], Path(model_dir))["mean_abs_logprob_delta"] > 0.9
    # A model directory the worker cannot load is that call's clear error; the worker answers the next call.
    with pytest.raises(RuntimeError, match="logprob recomputation failed"):
        recompute_logprobs([trace], Path(model_dir) / "missing")
    assert recompute_logprobs([trace], Path(model_dir))["tokens"] == 24


# -- chat mode: the engine re-renders history, so a call merges only where its prompt provably extends the chain --
def every_sampled_id_is_trainable_once(result: BuildResult, records: list[CallRecord]) -> bool:
    return sum(t.trainable_tokens for t in result.traces) == sum(len(r.sampled_token_ids) for r in records)


def test_chat_mode_exact_re_render_merges_including_an_unreported_end_of_turn() -> None:
    a = chat("a", CONTEXT + HEADER + GLUE, [200, 201, EOT])
    # b stopped on the end-of-turn token without the engine reporting it among the sampled ids
    b = chat("b", [*full(a), NL, *tool_turn(0), *HEADER, *GLUE], [300, 301], parent=a)
    # the template closes b's turn in the re-render: that EOT is the first token of c's masked interstitial
    c = chat("c", [*full(b), EOT, NL, *tool_turn(1), *HEADER, *GLUE], [400, EOT], parent=b)
    result = prefix_merging([a, b, c])
    [trace] = result.traces
    assert trace.call_ids == ["a", "b", "c"] and trace.break_reason is None and not result.break_reasons
    eot_after_b = trace.spans[1].end
    assert trace.response_ids[eot_after_b] == EOT and trace.loss_mask[eot_after_b] == 0
    assert trace.logprobs[eot_after_b] is None
    assert audit(result.traces, [a, b, c]).ok


def test_chat_mode_dropped_generation_glue_segments_every_call() -> None:
    a = chat("a", CONTEXT + HEADER + GLUE, [200, 201, EOT])
    # the re-render of a's turn omits the glue a was sampled after; its sampled ids follow verbatim
    b = chat("b", CONTEXT + HEADER + [200, 201, EOT, NL, *tool_turn(0), *HEADER, *GLUE], [300, EOT], parent=a)
    c_prompt = [*b.prompt_token_ids[: -len(GLUE)], 300, EOT, NL, *tool_turn(1), *HEADER, *GLUE]
    c = chat("c", c_prompt, [400, EOT], parent=b)
    records = [a, b, c]
    result = prefix_merging(records)
    assert calls_of(result) == [["a"], ["b"], ["c"]]
    assert [(t.role, t.segment, t.break_reason) for t in result.traces] == [
        ("main", 0, None),
        ("main", 1, "template_glue"),
        ("main", 2, "template_glue"),
    ]
    assert result.break_reasons == {"template_glue": 2}
    assert every_sampled_id_is_trainable_once(result, records)
    assert audit(result.traces, records).ok
    # why it cannot merge: a spliced trace would give b a context (with the glue) that the engine never saw
    spliced = _trace([a, b], "main", 0, None, BuilderConfig())
    assert audit([spliced], records).context_mismatch == ["b"]
    # the glue list only names the break: without it the same calls segment as a plain context mismatch
    plain = prefix_merging(records, BuilderConfig(generation_glue=[]))
    assert calls_of(plain) == calls_of(result) and plain.break_reasons == {"context_mismatch": 2}


def test_chat_mode_glue_kept_in_history_merges() -> None:
    a = chat("a", CONTEXT + HEADER + GLUE, [200, EOT])
    b = chat("b", [*full(a), NL, *tool_turn(0), *HEADER, *GLUE], [300, EOT], parent=a)
    [trace] = prefix_merging([a, b]).traces
    assert trace.call_ids == ["a", "b"] and audit([trace], [a, b]).ok
    # glue kept but the turn re-tokenised: the turn is what differs
    b2 = chat("b2", [*a.prompt_token_ids, 299, EOT, NL, *tool_turn(0), *HEADER, *GLUE], [300, EOT], parent=a)
    assert [t.break_reason for t in prefix_merging([a, b2]).traces] == [None, "retokenized"]


def test_chat_mode_retokenized_turn_leaves_the_chain_and_keeps_its_tokens() -> None:
    a = chat("a", CONTEXT + HEADER, [200, 201, EOT])
    b = chat("b", [*full(a), NL, *tool_turn(0), *HEADER], [300, 301, 302, EOT], parent=a)
    # c's re-render tokenises b's turn canonically ([300, 301, 302] -> [300, 399]); everything before it is intact
    c = chat("c", [*b.prompt_token_ids, 300, 399, EOT, NL, *tool_turn(1), *HEADER], [400, EOT], parent=b)
    d = chat("d", [*full(c), NL, *tool_turn(2), *HEADER], [401, EOT], parent=c)
    records = [a, b, c, d]
    result = prefix_merging(records)
    # c provably extends a: b's re-rendered turn is masked context there, and b keeps its own trace
    assert calls_of(result) == [["a", "c", "d"], ["b"]]
    main, off = result.traces
    assert main.break_reason is None and off.break_reason == "retokenized"
    assert [(t.role, t.segment) for t in result.traces] == [("main", 0), ("main", 1)]
    assert result.break_reasons == {"retokenized": 1}
    c_span = main.spans[1]
    masked = main.response_ids[c_span.context_start : c_span.start]
    assert masked == c.prompt_token_ids[len(full(a)) :] and 399 in masked
    assert set(main.loss_mask[c_span.context_start : c_span.start]) == {0}
    assert off.response_ids == b.sampled_token_ids and off.loss_mask == [1, 1, 1, 1]
    assert every_sampled_id_is_trainable_once(result, records)
    assert audit(result.traces, records).ok


def test_chat_mode_retokenized_first_turn_starts_a_segment() -> None:
    # the first turn is re-tokenised, so nothing earlier prefixes b: b starts the chain's next segment
    a = chat("a", CONTEXT + HEADER, [200, 201, ENDOFTEXT])  # stopped on <|endoftext|>; the template closes with EOT
    b = chat("b", CONTEXT + HEADER + [200, 201, EOT, NL, *tool_turn(0), *HEADER], [300, EOT], parent=a)
    c = chat("c", [*full(b), NL, *tool_turn(1), *HEADER], [400, EOT], parent=b)
    records = [a, b, c]
    result = prefix_merging(records)
    assert calls_of(result) == [["a"], ["b", "c"]]
    assert [(t.role, t.segment, t.break_reason) for t in result.traces] == [
        ("main", 0, None),
        ("main", 1, "retokenized"),
    ]
    assert every_sampled_id_is_trainable_once(result, records)
    assert audit(result.traces, records).ok


def test_chat_mode_history_change_before_the_turn_is_a_context_mismatch() -> None:
    a = chat("a", CONTEXT + HEADER, [200, EOT])
    edited = [*CONTEXT[:3], 999, *CONTEXT[4:]]  # the harness rewrote the system prompt
    b = chat("b", edited + HEADER + [200, EOT, NL, *tool_turn(0), *HEADER], [300, EOT], parent=a)
    result = prefix_merging([a, b])
    assert [t.break_reason for t in result.traces] == [None, "context_mismatch"]
    assert audit(result.traces, [a, b]).ok


def test_chain_left_by_a_later_call_carries_that_calls_reason() -> None:
    a = chat("a", CONTEXT + HEADER, [200, EOT])
    b = chat("b", [*full(a), NL, *tool_turn(0), *HEADER], [300, 301, EOT], parent=a)
    c = chat("c", [*full(b), NL, *tool_turn(1), *HEADER], [400, EOT], parent=b)
    # d (linked to c) re-renders b's turn differently, so it extends only a; e goes on from d
    d_prompt = [*b.prompt_token_ids, 399, EOT, NL, *tool_turn(1), *HEADER, 400, EOT, NL, *tool_turn(2), *HEADER]
    d = chat("d", d_prompt, [500, EOT], parent=c)
    e = chat("e", [*full(d), NL, *tool_turn(3), *HEADER], [600, EOT], parent=d)
    records = [a, b, c, d, e]
    result = prefix_merging(records)
    # the longer chain continues from a; b's branch (holding c) is the one that left it, and says why
    assert calls_of(result) == [["a", "d", "e"], ["b", "c"]]
    assert [t.break_reason for t in result.traces] == [None, "context_mismatch"]
    assert result.break_reasons == {"context_mismatch": 1}
    assert every_sampled_id_is_trainable_once(result, records)
    assert audit(result.traces, records).ok


# -- the record format's version: records outlive their writer, so a reader refuses what it does not understand --
def test_records_carry_a_schema_version_and_readers_refuse_newer_ones(tmp_path: Path) -> None:
    from nemo_polar.proxy.store.records import RECORD_SCHEMA_VERSION, read_records

    current = rec("a", [1], [10, EOT])
    assert RECORD_SCHEMA_VERSION == 3 and json.loads(current.model_dump_json())["schema_version"] == 3
    # a record written before the field existed loads as version 1
    old = current.model_dump(mode="json")
    del old["schema_version"]
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps(old) + "\n")
    assert [r.schema_version for r in read_records(path)] == [1]
    assert load_records([path])["s"][0].schema_version == 1

    newer = {**current.model_dump(mode="json"), "call_id": "b", "schema_version": 4, "a_field_from_the_future": 1}
    path.write_text(json.dumps(old) + "\n" + json.dumps(newer) + "\n")
    message = r"s\.jsonl:2: call record schema_version 4 is newer than this reader understands \(up to 3\)"
    with pytest.raises(ValueError, match=message):
        read_records(path)
    with pytest.raises(ValueError, match=message):
        load_records([path])
    # every other way in (the admin API's records, a ProxyClient) validates the same model
    with pytest.raises(ValueError, match="schema_version 4 is newer than this reader understands"):
        CallRecord.model_validate(newer)
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        CallRecord.model_validate({**newer, "schema_version": 0})


def test_root_carrying_an_earlier_summary_is_a_compaction_segment_of_that_chain() -> None:
    summary = "Summary: listed the files and found the bug in calc.add."
    m1 = rec("m1", [1, 2, 3], [10, EOT])
    m2 = child("m2", m1, [20], [11, EOT], output_text=summary)  # the CLI asked for a summary
    k1 = rec(
        "k1",
        [1, 2, 60],
        [12, EOT],
        render_reason="new_conversation",
        request={"model": "m", "messages": [{"role": "user", "content": f"Earlier work:\n{summary}\nGo on."}]},
    )
    k2 = child("k2", k1, [21], [13, EOT])
    s1 = rec("s1", [7, 8], [40, EOT], render_reason="new_conversation")  # a subagent carries no summary
    result = prefix_merging([m1, m2, k1, k2, s1])
    assert [(t.role, t.segment, t.break_reason, t.call_ids) for t in result.traces] == [
        ("main", 0, None, ["m1", "m2"]),
        ("compaction", 1, "compaction", ["k1", "k2"]),
        ("subagent", 0, "new_conversation", ["s1"]),
    ]
    assert audit(result.traces, [m1, m2, k1, k2, s1]).ok


def test_resent_first_request_is_a_retry_of_the_main_chain() -> None:
    first = rec("a1", [1, 2], [10, EOT])  # completed, but the CLI lost the stream and sent it again
    again = rec("a2", [1, 2], [10, EOT])
    nxt = child("b", again, [20], [11, EOT])
    result = prefix_merging([first, again, nxt])
    assert [(t.role, t.break_reason, t.call_ids) for t in result.traces] == [
        ("main", "retry", ["a1"]),
        ("main", None, ["a2", "b"]),
    ]
    assert result.break_reasons == {"retry": 1}


def test_history_rendered_afresh_goes_on_in_the_same_chain() -> None:
    """A call the proxy could not continue (``end_of_turn_in_sampled``) starts a new segment of its chain, not a
    subagent."""
    m1 = rec("m1", [1, 2, 3], [10, 11, 12, EOT])
    m2 = rec("m2", [1, 2, 3, 10, EOT, 11, 12, EOT, 20], [13, EOT], render_reason="end_of_turn_in_sampled")
    result = prefix_merging([m1, m2])
    assert [(t.role, t.segment, t.break_reason) for t in result.traces] == [
        ("main", 0, None),
        ("main", 1, "end_of_turn_in_sampled"),
    ]


def test_audit_coverage_names_a_dropped_or_duplicated_call() -> None:
    a = rec("a", [1, 2], [10, EOT])
    b = child("b", a, [20], [11, 12, EOT])
    lost = rec("x", [5], [30, 31, EOT])
    failed = rec("f", [5], [32], complete=False)  # no finished generation: not the builder's to place
    traces = prefix_merging([a, b]).traces
    report = audit(traces, [a, b, lost, failed])
    assert not report.ok and report.uncovered == ["x"] and report.tokens_lost == 3
    twice = audit([*traces, traces[0]], [a, b])
    assert not twice.ok and twice.duplicated == ["a", "b"]
    assert audit(prefix_merging([a, b, lost, failed]).traces, [a, b, lost, failed]).ok


def test_summary_asked_for_in_a_conversation_of_its_own_is_compaction_too() -> None:
    """Pi asks for its compaction summary in a new conversation (own system prompt, the turns written out)."""
    summary = "## Goal\nFix calc.add; the file was read and the bug found."
    m1 = rec("m1", [1, 2, 3], [10, EOT])
    ask = rec("ask", [9, 9], [50, EOT], render_reason="new_conversation", output_text=summary)
    k1 = rec(
        "k1",
        [1, 2, 70],
        [12, EOT],
        render_reason="history_diverged",
        request={"model": "m", "messages": [{"role": "user", "content": f"Compacted:\n<summary>{summary}</summary>"}]},
    )
    result = prefix_merging([m1, ask, k1])
    assert [(t.role, t.break_reason, t.call_ids) for t in result.traces] == [
        ("main", None, ["m1"]),
        ("compaction", "compaction", ["ask"]),
        ("compaction", "compaction", ["k1"]),
    ]


def test_a_summary_is_recognised_by_the_part_its_cli_carries() -> None:
    """Claude Code carries only what is inside <summary>...</summary> into its compacted history."""
    from nemo_polar.reconstruct.side_rules import carried_summary

    reply = "<analysis>scratch work</analysis>\n<summary>\nThe user asked to fix add().\n</summary>"
    assert carried_summary(reply) == "The user asked to fix add()."
    assert carried_summary("no tags: carried whole") == "no tags: carried whole"
