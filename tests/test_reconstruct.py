"""Trajectory reconstruction: synthetic record sets for every edge case, then real proxy sessions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import openai
import pytest

from nemo_polar.proxy.records import CallRecord
from nemo_polar.reconstruct.audit import audit
from nemo_polar.reconstruct.builders import BuilderConfig, per_request, prefix_merging
from nemo_polar.reconstruct.io import check_contiguous, gym_output_items, load_records
from tests.conftest import ProxyHandle, load_fixture

EOT = 151645
_clock = iter(range(1, 10_000))


def rec(call_id: str, prompt: list[int], sampled: list[int], **kw: Any) -> CallRecord:
    fields: dict[str, Any] = {
        "call_id": call_id,
        "session_id": "s",
        "api": "chat",
        "mode": "continuation",
        "request": {"model": "m", "messages": [{"role": "user", "content": "x"}]},
        "prompt_token_ids": prompt,
        "sampled_token_ids": sampled,
        "sampled_logprobs": [-0.1 * (i + 1) for i in range(len(sampled))],
        "finish_reason": "stop",
        "started_at": float(next(_clock)),
        "complete": True,
        "render_reason": "first_call",
    }
    fields.update(kw)
    return CallRecord(**fields)


def child(call_id: str, parent: CallRecord, delta: list[int], sampled: list[int], **kw: Any) -> CallRecord:
    kw.setdefault("parent_call_id", parent.call_id)
    kw.setdefault("render_reason", "continuation")
    return rec(call_id, parent.prompt_token_ids + parent.sampled_token_ids + delta, sampled, **kw)


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
    assert {t.break_reason for t in result.traces} == {None, "branch"}
    assert result.break_reasons["branch"] == 1
    assert audit(result.traces, [a, retry1, retry2, nxt]).ok
    assert sum(t.weight for t in result.traces) == pytest.approx(1.0)


def test_leaf_siblings_prefer_the_later_attempt() -> None:
    a = rec("a", [1], [10, EOT])
    b1, b2 = child("b1", a, [5], [11, EOT]), child("b2", a, [5], [12, EOT])
    assert calls_of(prefix_merging([a, b1, b2])) == [["a", "b2"], ["b1"]]


def test_interleaved_subagent_and_compaction_become_their_own_traces() -> None:
    m1 = rec("m1", [1, 2, 3], [10, EOT])
    s1 = rec("s1", [7, 8], [40, EOT], render_reason="new_conversation")
    m2 = child("m2", m1, [20], [11, EOT])
    s2 = child("s2", s1, [41], [42, EOT])
    m3 = child("m3", m2, [21], [12, EOT])
    k1 = rec("k1", [1, 2, 99], [50, EOT], render_reason="history_diverged")
    records = [m1, s1, m2, s2, m3, k1]
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
    assert result.traces[1].break_reason == "context_mismatch"
    assert audit(result.traces, [a, b]).ok  # each trace's context is what the engine saw


def test_side_calls_are_flagged_and_weightless() -> None:
    aux = load_fixture("qwen-code", "text_aux_memory_extraction.json")["body"]
    a = rec("a", [1], [10, EOT])
    side = rec("aux", [3, 4], [60, EOT], request=aux, render_reason="new_conversation")
    result = prefix_merging([a, side])
    by_role = {t.role: t for t in result.traces}
    assert by_role["side"].call_ids == ["aux"] and by_role["side"].weight == 0.0
    assert by_role["main"].weight == 1.0


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
    session = proxy.session(sampling_overrides={"max_tokens": 8})
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=session["api_key"], max_retries=0)
    main = [{"role": "system", "content": "main agent"}, {"role": "user", "content": "fix the bug"}]
    sub = [{"role": "system", "content": "explorer subagent"}, {"role": "user", "content": "find files"}]
    for turn in range(4):
        for history in (main, sub) if turn < 2 else (main,):
            reply = client.chat.completions.create(model="local-model", messages=history)
            history += [
                {"role": "assistant", "content": reply.choices[0].message.content},
                {"role": "user", "content": f"tool output {turn}"},
            ]
    path = proxy.record_dir / f"{session['session_id']}.jsonl"
    records = load_records([path])[session["session_id"]]
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
    from nemo_polar.reconstruct.rewards import assign, group_advantages

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
    import httpx

    from nemo_polar.reconstruct.io import recompute_logprobs

    session = proxy.session(sampling_overrides={"max_tokens": 12})
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=session["api_key"], max_retries=0)
    history = [{"role": "user", "content": "hello"}]
    for turn in range(2):
        reply = client.chat.completions.create(model="local-model", messages=history)
        history += [
            {"role": "assistant", "content": reply.choices[0].message.content},
            {"role": "user", "content": f"more {turn}"},
        ]
    records = proxy.records(session["session_id"])
    [trace] = prefix_merging([CallRecord.model_validate(r) for r in records]).traces
    model_dir = httpx.get(f"{engine_url}/v1/models", timeout=10).json()["data"][0]["root"]
    report = recompute_logprobs([trace], Path(model_dir))
    assert report["tokens"] == trace.trainable_tokens == 24
    assert report["mean_abs_logprob_delta"] < 0.05 and 0.0 <= report["kl_k3"] < 0.01
    shifted = trace.model_copy(update={"logprobs": [lp + 1.0 if lp is not None else None for lp in trace.logprobs]})
    assert recompute_logprobs([shifted], Path(model_dir))["mean_abs_logprob_delta"] > 0.9
