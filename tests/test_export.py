"""Offline export: SFT rows from real harness request bodies, JSONL/Parquet round trips, and `polar reconstruct
--format`. Records are synthetic (no engine): the request bodies are the harness fixtures, the ids made up."""

from __future__ import annotations

import json
from itertools import count
from pathlib import Path
from typing import Any

import pytest
from datasets import Dataset, load_dataset

from nemo_polar.cli import main
from nemo_polar.proxy.store.records import CallRecord
from nemo_polar.reconstruct.builders import prefix_merging
from nemo_polar.reconstruct.export import (
    FORMATS,
    SFTRow,
    _arrow_schema,
    export,
    gym_rows,
    sft_rows,
    write_jsonl,
    write_parquet,
)
from nemo_polar.reconstruct.gym import check_contiguous
from nemo_polar.reconstruct.trace import Trace
from nemo_polar.rewards.advantages import assign
from tests.conftest import load_fixture

EOT = 151645
_clock = count(1)

LS_CALL = '<tool_call>\n{"name": "run_shell_command", "arguments": {"command": "ls"}}\n</tool_call>'
DONE = "Done. I ran ls and saw the files."


def record(call_id: str, api: str, body: Any, prompt: list[int], sampled: list[int], text: str, **kw: Any):
    fields: dict[str, Any] = {
        "call_id": call_id,
        "session_id": "s",
        "api": api,
        "mode": "continuation",
        "request": body,
        "prompt_token_ids": prompt,
        "sampled_token_ids": sampled,
        "sampled_logprobs": [-0.25 * (i + 1) for i in range(len(sampled))],
        "finish_reason": "stop",
        "output_text": text,
        "started_at": float(next(_clock)),
        "complete": True,
        "render_reason": "first_call",
    }
    fields.update(kw)
    return CallRecord(**fields)


def qwen_code_session(session_id: str = "s") -> list[CallRecord]:
    """Qwen Code's tool run: a shell call, then the final answer after the tool result."""
    first = record(
        "t1", "chat", load_fixture("qwen-code", "tool_turn1.json")["body"], [1, 2, 3], [10, 11, EOT], LS_CALL
    )
    second = record(
        "t2",
        "chat",
        load_fixture("qwen-code", "tool_turn2.json")["body"],
        [1, 2, 3, 10, 11, EOT, 20, 21],
        [12, 13, EOT],
        DONE,
        parent_call_id="t1",
        render_reason="continuation",
    )
    return [r.model_copy(update={"session_id": session_id}) for r in (first, second)]


def one_row(records: list[CallRecord], **kw: Any) -> tuple[SFTRow, Trace]:
    [trace] = prefix_merging(records).traces
    [row] = sft_rows([trace], records, **kw)
    return row, trace


def messages(row: SFTRow) -> list[dict[str, Any]]:
    return [m.model_dump() for m in row.messages]


def test_chat_request_and_output_become_messages_and_exact_token_fields() -> None:
    records = qwen_code_session()
    meta = {"s": {"harness": "qwen-code", "instance_id": "repo__issue-1"}}
    row, trace = one_row(records, metadata=meta)
    msgs = messages(row)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "assistant"]
    assert msgs[2]["tool_calls"] == [
        {"id": "call_2", "type": "function", "function": {"name": "run_shell_command", "arguments": '{"command":"ls"}'}}
    ]
    assert msgs[3]["tool_call_id"] == "call_2" and msgs[3]["content"].startswith("Command: ls")
    assert msgs[4] == {
        "role": "assistant",
        "content": DONE,
        "reasoning_content": None,
        "tool_calls": [],
        "tool_call_id": None,
    }
    tools = json.loads(row.tools)
    assert len(tools) == 14 and set(tools[0]) == {"type", "function"} and tools[0]["type"] == "function"
    assert "run_shell_command" in {t["function"]["name"] for t in tools}
    assert row.prompt_token_ids == [1, 2, 3] and row.response_ids == [10, 11, EOT, 20, 21, 12, 13, EOT]
    assert row.loss_mask == [1, 1, 1, 0, 0, 1, 1, 1] and row.call_ids == ["t1", "t2"]
    assert row.logprobs[3:5] == [None, None] and row.logprobs[5] == pytest.approx(-0.25)
    assert (row.role, row.segment, row.break_reason, row.weight) == ("main", 0, None, 1.0)
    assert row.response_ids == trace.response_ids and row.session_id == "s" and row.trace_id == trace.trace_id
    assert json.loads(row.metadata) == {
        "api": "chat",
        "mode": "continuation",
        "model": "local-model",
        "finish_reason": "stop",
        "policy_versions": [],
        "harness": "qwen-code",
        "instance_id": "repo__issue-1",
    }


def test_responses_request_and_reasoning_tool_output() -> None:
    body = load_fixture("codex", "reasoning_turn2.json")["body"]
    call = '{"name": "exec_command", "arguments": {"cmd": "ls -a"}}'
    text = f"<think>\nI should look again.\n</think>\n\n<tool_call>\n{call}\n</tool_call>"
    row, _ = one_row([record("c2", "responses", body, [5, 6], [30, EOT], text)])
    msgs = messages(row)
    assert [m["role"] for m in msgs] == ["system", "system", "user", "user", "assistant", "tool", "assistant"]
    assert msgs[0]["content"].startswith("You are Codex")  # the developer message
    echoed = msgs[4]
    assert echoed["reasoning_content"] == "Let me think about this briefly."
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in echoed["tool_calls"]] == [
        ("call_2", "exec_command", '{"cmd": "ls"}')
    ]
    assert msgs[5]["tool_call_id"] == "call_2"
    out = msgs[6]
    assert out["reasoning_content"] == "I should look again." and out["content"] == ""
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in out["tool_calls"]] == [
        ("exec_command", '{"cmd": "ls -a"}')
    ]
    assert out["tool_calls"][0]["id"] == "call_c2_0"
    tool_names = {t["function"]["name"] for t in json.loads(row.tools)}
    assert "apply_patch" in tool_names and "web_search" not in tool_names  # hosted tools are not rendered
    assert json.loads(row.metadata)["ignored"] == ["tool type 'tool_search'", "tool type 'web_search'"]


def test_the_assistant_turn_is_the_one_the_harness_was_answered_with() -> None:
    """A record carries the turn as the proxy read it in the model's format (here gpt-oss's harmony, which no
    in-process parser reads) and answered the harness, tool-call id included: the export takes that turn."""
    body = load_fixture("codex", "reasoning_turn2.json")["body"]
    harmony = (
        "<|channel|>analysis<|message|>Look again.<|end|><|start|>assistant to=functions.exec_command"
        '<|channel|>commentary json<|message|>{"cmd": "ls -a"}<|call|>'
    )
    call = {"id": "call_9f2", "name": "exec_command", "arguments": '{"cmd": "ls -a"}'}
    output = {"content": "", "reasoning": "Look again.", "tool_calls": [call]}
    row, _ = one_row([record("c2", "responses", body, [5, 6], [30, EOT], harmony, output=output)])
    out = messages(row)[-1]
    assert out["reasoning_content"] == "Look again." and out["content"] == ""
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in out["tool_calls"]] == [
        ("call_9f2", "exec_command", '{"cmd": "ls -a"}')
    ]


def test_a_call_id_the_model_wrote_replaces_the_harnesss_in_the_row() -> None:
    """Mistral's format carries the call's id: the record keeps the id the model wrote beside the one the harness
    got (``template_id``, never sent to the harness), and the row's call and the tool result answering it carry the
    model's, as a trainer re-rendering the row with the model's template must see them."""
    from nemo_polar.proxy.conversation import Message, ToolCall

    call = ToolCall(id="call_2", name="run_shell_command", arguments='{"command":"ls"}', template_id="Ab3dE6gH9")
    turn = Message(role="assistant", tool_calls=[call])
    recorded = turn.recorded()
    assert recorded["tool_calls"][0]["template_id"] == "Ab3dE6gH9"
    assert "template_id" not in turn.model_dump()["tool_calls"][0]  # the harness's view is unchanged
    assert Message.model_validate({"role": "assistant", **recorded}).tool_calls[0].template_id == "Ab3dE6gH9"

    first, second = qwen_code_session()
    records = [first.model_copy(update={"output": recorded}), second]
    row, _ = one_row(records)
    [assistant] = [m for m in messages(row) if m["tool_calls"]]
    [tool] = [m for m in messages(row) if m["role"] == "tool"]
    assert assistant["tool_calls"][0]["id"] == tool["tool_call_id"] == "Ab3dE6gH9"
    plain, _ = one_row(qwen_code_session())  # no id of the model's own: the harness's stays
    assert [m["tool_call_id"] for m in messages(plain) if m["role"] == "tool"] == ["call_2"]


def test_anthropic_request_with_thinking_and_tool_result() -> None:
    body = load_fixture("claude-code", "reasoning_turn2.json")["body"]
    row, _ = one_row([record("m2", "anthropic", body, [7], [40, EOT], DONE)])
    msgs = messages(row)
    assert [m["role"] for m in msgs] == ["system", "user", "system", "assistant", "tool", "assistant"]
    assert "x-anthropic-billing-header" not in msgs[0]["content"]
    assert msgs[3]["reasoning_content"] == "Let me think about this briefly."
    assert msgs[3]["tool_calls"][0]["id"] == "toolu_002"
    assert json.loads(msgs[3]["tool_calls"][0]["function"]["arguments"]) == {"command": "ls"}
    assert msgs[4] == {
        "role": "tool",
        "content": "README.md\nhello.py",
        "reasoning_content": None,
        "tool_calls": [],
        "tool_call_id": "toolu_002",
    }
    assert msgs[5]["content"] == DONE and json.loads(row.metadata)["api"] == "anthropic"


def test_tool_choice_none_exports_no_tools() -> None:
    body = {**load_fixture("pi", "text_turn1.json")["body"], "tool_choice": "none"}
    row, _ = one_row([record("p1", "chat", body, [1], [2, EOT], "hi")])
    assert row.tools == "[]" and row.messages[-1].content == "hi"


def all_shapes() -> tuple[list[Trace], list[CallRecord]]:
    won = qwen_code_session("won")
    lost = [
        record("c1", "responses", load_fixture("codex", "tool_turn2.json")["body"], [5], [6, EOT], DONE),
        record(
            "a1",
            "anthropic",
            load_fixture("claude-code", "tool_turn2.json")["body"],
            [8],
            [9],
            "",
            finish_reason="length",
        ),
    ]
    lost = [r.model_copy(update={"session_id": "lost"}) for r in lost]
    traces = prefix_merging(won).traces + prefix_merging(lost).traces
    assign(traces, {"won": 1.0, "lost": 0.0}, {"won": 0.5, "lost": -0.5})
    return traces, won + lost


def test_parquet_and_jsonl_load_back_equal_to_the_rows(tmp_path: Path) -> None:
    traces, records = all_shapes()
    rows = sft_rows(traces, records)
    assert len(rows) == 3 and {r.advantage for r in rows} == {0.5, -0.5}
    dumped = [r.model_dump() for r in rows]

    write_parquet(rows, tmp_path / "sft.parquet")
    cache = str(tmp_path / "hf-cache")
    assert Dataset.from_parquet(str(tmp_path / "sft.parquet"), cache_dir=cache).to_list() == dumped
    loaded = load_dataset("parquet", data_files=str(tmp_path / "sft.parquet"), split="train", cache_dir=cache)
    assert loaded.to_list() == dumped
    assert [SFTRow.model_validate(r) for r in loaded] == rows

    write_jsonl(rows, tmp_path / "sft.jsonl")
    lines = (tmp_path / "sft.jsonl").read_text().splitlines()
    assert [SFTRow.model_validate_json(line) for line in lines] == rows


def test_arrow_schema_has_every_row_field_in_order() -> None:
    assert _arrow_schema().names == list(SFTRow.model_fields)


def write_session(path: Path, records: list[CallRecord]) -> Path:
    path.write_text("".join(r.model_dump_json() + "\n" for r in records))
    return path


def test_cli_writes_every_format(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = write_session(tmp_path / "s.jsonl", qwen_code_session())
    outputs = {}
    for fmt in FORMATS:
        out = tmp_path / f"out-{fmt}"
        assert main(["reconstruct", str(src), "-o", str(out), "--format", fmt]) == 0
        summary = json.loads(capsys.readouterr().out)
        assert summary["traces"] == 1 and summary["format"] == fmt
        outputs[fmt] = out
    assert main(["reconstruct", str(src), "-o", str(tmp_path / "default.jsonl")]) == 0  # default: traces
    assert (tmp_path / "default.jsonl").read_text() == outputs["traces"].read_text()

    [trace] = [Trace.model_validate_json(line) for line in outputs["traces"].read_text().splitlines()]
    assert trace.call_ids == ["t1", "t2"]
    [gym] = [json.loads(line) for line in outputs["gym"].read_text().splitlines()]
    items = gym["response"]["output"]
    check_contiguous(items)
    assert [i["generation_token_ids"] for i in items] == [[10, 11, EOT], [12, 13, EOT]]
    assert gym["trace_id"] == trace.trace_id and gym["weight"] == 1.0
    [row] = [SFTRow.model_validate_json(line) for line in outputs["sft-jsonl"].read_text().splitlines()]
    assert row.messages[-1].content == DONE and row.response_ids == trace.response_ids
    parquet = Dataset.from_parquet(str(outputs["sft-parquet"]), cache_dir=str(tmp_path / "hf-cache")).to_list()
    assert parquet == [row.model_dump()]


def test_bad_format_and_unwritable_path_fail_clearly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records = qwen_code_session()
    traces = prefix_merging(records).traces
    with pytest.raises(ValueError, match=r"unknown export format 'csv'; expected one of traces, gym, sft-jsonl"):
        export(traces, records, tmp_path / "x.csv", "csv")
    src = write_session(tmp_path / "s.jsonl", records)
    with pytest.raises(SystemExit) as exited:
        main(["reconstruct", str(src), "-o", str(tmp_path / "x"), "--format", "csv"])
    assert exited.value.code == 2 and "invalid choice: 'csv'" in capsys.readouterr().err

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for fmt in FORMATS:
        target = blocker / f"out.{fmt}"  # its parent is a regular file
        with pytest.raises(OSError, match=rf"cannot write {target}"):
            export(traces, records, target, fmt)
        with pytest.raises(SystemExit, match=rf"polar reconstruct: cannot write {target}"):
            main(["reconstruct", str(src), "-o", str(target), "--format", fmt])
    with pytest.raises(SystemExit, match=r"polar reconstruct: .*missing\.jsonl: no such records file"):
        main(["reconstruct", str(tmp_path / "missing.jsonl"), "-o", str(tmp_path / "o")])


def test_bad_records_name_the_call(tmp_path: Path) -> None:
    records = qwen_code_session()
    traces = prefix_merging(records).traces
    with pytest.raises(ValueError, match=r"trace s/t1: no record for call t2"):
        sft_rows(traces, records[:1])
    with pytest.raises(ValueError, match=r"trace s/t1: no record for call t2"):
        gym_rows(traces, records[:1])
    # a body the proxy could not parse is recorded verbatim as text
    garbled = [records[0], records[1].model_copy(update={"request": "{not json"})]
    with pytest.raises(ValueError, match=r"record t2: chat request cannot be parsed: request body must be a JSON"):
        sft_rows(traces, garbled)
    src = write_session(tmp_path / "s.jsonl", garbled)
    with pytest.raises(SystemExit, match=r"polar reconstruct: record t2: chat request cannot be parsed"):
        main(["reconstruct", str(src), "-o", str(tmp_path / "o.jsonl"), "--format", "sft-jsonl"])
    assert not (tmp_path / "o.jsonl").exists()  # nothing half-written
