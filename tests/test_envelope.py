"""The ``training_traces`` envelope (``delivery: all_traces``): every trace of a rollout, by either builder, in the
shape and under the rules Gym PR #3212 / NeMo-RL PR #4078 state (restated in ``nemo_polar/reconstruct/envelope.py``);
what breaks a rule masked with its reason, never delivered as a different sample."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
from pydantic import ValidationError

from nemo_polar.reconstruct.builders import per_request, prefix_merging
from nemo_polar.reconstruct.envelope import TrainingTraces, training_traces
from tests.helpers.records import EOT, child, rec, subagent_and_compaction


@pytest.mark.parametrize("builder", ["prefix_merging", "per_request"])
def test_a_subagent_and_compaction_session_is_one_valid_envelope(builder: str) -> None:
    records = subagent_and_compaction()
    build = (prefix_merging if builder == "prefix_merging" else per_request)(records)
    result = training_traces("task3-r1", builder, build.traces)  # type: ignore[arg-type]
    envelope = result.training_traces
    assert result.masked == {} and envelope.builder == builder and envelope.schema_version == 1
    owners = [s.model_call_id for t in envelope.traces for s in t.sampled_spans]
    assert sorted(owners) == sorted(r.call_id for r in records)  # every sampled call owned exactly once
    by_id = {r.call_id: r for r in records}
    for t in envelope.traces:
        assert t.trace_id == f"task3-r1:{t.model_call_ids[-1]}" and t.loss_mask[0] == 0
        for s in t.sampled_spans:  # the exact context and the exact sampled ids and logprobs of each call
            r = by_id[s.model_call_id]
            assert t.token_ids[: s.start] == r.prompt_token_ids and t.token_ids[s.start : s.end] == r.sampled_token_ids
            assert t.generation_logprobs[s.start : s.end] == r.sampled_logprobs
        assert sum(t.loss_mask) == sum(s.end - s.start for s in t.sampled_spans)
    if builder == "prefix_merging":
        assert [t.model_call_ids for t in envelope.traces] == [["m1", "m2", "m3"], ["s1", "s2"], ["k1"]]
    else:
        assert len(envelope.traces) == len(records)
    TrainingTraces.model_validate(envelope.model_dump(mode="json"))  # it round-trips through JSON


def test_what_breaks_a_rule_is_masked_with_its_reason() -> None:
    a = rec("a", [1, 2], [10, EOT])
    b = child("b", a, [20], [11, EOT], sampled_logprobs=[-0.5, math.nan])  # the engine gave no finite logprob
    c = child("c", b, [21], [12, EOT])
    [trace] = prefix_merging([a, b, c]).traces
    result = training_traces("r", "prefix_merging", [trace, trace])  # the same calls twice
    assert result.masked == {
        "b": "a sampled token has no finite logprob",
        "a": "owned by an earlier trace",  # the copy
        "c": "owned by an earlier trace",
        trace.trace_id: "nothing sampled left to train on",
    }
    [t] = result.training_traces.traces
    assert t.model_call_ids == ["a", "c"] and all(math.isfinite(x) for x in t.generation_logprobs)
    b_start = len(a.prompt_token_ids) + 2 + 1
    assert t.loss_mask[b_start : b_start + 2] == [0, 0]  # b's tokens stay, as context


def valid() -> dict[str, Any]:
    a = rec("a", [1, 2], [10, EOT])
    b = child("b", a, [20], [11, EOT])
    return training_traces("r", "prefix_merging", prefix_merging([a, b]).traces).training_traces.model_dump()


@pytest.mark.parametrize(
    ("breaks", "message"),
    [
        (lambda t: t["loss_mask"].append(0), "differ in length"),
        (lambda t: t["loss_mask"].__setitem__(0, 1), "loss_mask[0] must be 0"),
        (lambda t: t["generation_logprobs"].__setitem__(3, math.inf), "not finite"),
        (lambda t: t["loss_mask"].__setitem__(4, 1), "do not cover the trainable tokens"),  # the context between
        (lambda t: t.__setitem__("trace_id", "r:a"), "trace_id must be"),
        (lambda t: t["sampled_spans"].append(dict(t["sampled_spans"][0])), "overlap"),
        (lambda t: t["model_call_ids"].reverse(), "model_call_ids are not the calls"),
        (lambda t: t.__setitem__("routed_experts", [[0]]), "routed_experts"),
    ],
)
def test_the_restated_rules_reject_what_they_reject(breaks: Any, message: str) -> None:
    envelope = valid()
    TrainingTraces.model_validate(envelope)
    bad = copy.deepcopy(envelope)
    breaks(bad["traces"][0])
    with pytest.raises(ValidationError, match=message.replace("[", r"\[").replace("]", r"\]")):
        TrainingTraces.model_validate(bad)


def test_a_call_owned_by_two_traces_is_rejected() -> None:
    envelope = valid()
    twice = copy.deepcopy(envelope["traces"][0])
    envelope["traces"].append(twice)
    with pytest.raises(ValidationError, match="call a is owned by r:b and r:b"):
        TrainingTraces.model_validate(envelope)
