"""Records grow with a session's new tokens: a prompt that extends an earlier record's prompt (+ its sampled ids) is
stored as what it adds (``prompt_from``), and every reader gets the full record back, checked against the digest it
was written with. Full (version 1) records still load; a damaged delta is an error naming file and line."""

from __future__ import annotations

import asyncio
import copy
import hashlib
import itertools
import json
import random
from pathlib import Path

import pytest

from nemo_polar.proxy.store.records import (
    CallRecord,
    RecordWriter,
    RequestDelta,
    pack_ids,
    prompt_digest,
    read_records,
    unpack_ids,
)
from nemo_polar.proxy.store.request_text import request_text, written_text
from nemo_polar.reconstruct.builders import prefix_merging
from nemo_polar.reconstruct.io import load_records

EOT = 151645


TOOLS = [{"type": "function", "function": {"name": f"tool{i}", "description": "does things " * 40}} for i in range(8)]


def grown_session(calls: int, step: int, seed: int = 0) -> list[CallRecord]:
    """A continuation-mode session as a harness drives it: each request resends the whole history (tools and options
    after it, Ünïcode in it), each prompt is the last prompt + its sampled ids + a tool result."""
    rng = random.Random(seed)
    prompt = [rng.randrange(1000, 150000) for _ in range(500)]
    messages: list[dict] = [{"role": "system", "content": "You are a coding agent. Ünïcode ✓"}]
    records: list[CallRecord] = []
    for i in range(calls):
        messages.append({"role": "user" if i == 0 else "tool", "content": f"result {i} " + "x" * (3 * step)})
        sampled = [rng.randrange(1000, 150000) for _ in range(step // 4)] + [EOT]
        records.append(
            CallRecord(
                call_id=f"c{i:03d}",
                session_id="s",
                api="chat",
                mode="continuation",
                request={"model": "m", "messages": list(messages), "tools": TOOLS, "stream": True},
                prompt_token_ids=prompt,
                sampled_token_ids=sampled,
                sampled_logprobs=[-0.25] * len(sampled),
                finish_reason="stop",
                started_at=float(i),
                complete=True,
                parent_call_id=records[-1].call_id if records else None,
            )
        )
        prompt = prompt + sampled + [rng.randrange(1000, 150000) for _ in range(step)]
        messages.append({"role": "assistant", "content": f"turn {i} " + "y" * step})
    return records


def write(records: list[CallRecord], path: Path) -> Path:
    writer = RecordWriter(path)

    async def go() -> None:
        for rec in records:
            await writer.append(rec)

    asyncio.run(go())
    return path


def test_records_are_stored_as_deltas_and_read_back_whole(tmp_path: Path) -> None:
    records = grown_session(60, 200)
    path = write(records, tmp_path / "s.jsonl")
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert "prompt_token_ids" in lines[0] and all("prompt_from" in line for line in lines[1:])
    assert all("prompt_token_ids" not in line and "request" not in line for line in lines[1:])
    new_text = [RequestDelta.model_validate(line["request_from"]).middle() for line in lines[1:]]
    assert all(text.count('"role"') == 2 for text in new_text)  # the two new messages
    assert all("text_z" in line["request_from"] for line in lines[1:])  # compressed: these texts repeat words
    assert [r.model_dump() for r in read_records(path)] == [r.model_dump() for r in records]
    [loaded] = load_records([path]).values()
    assert len(prefix_merging(loaded).traces) == 1
    # The reader proved each prefix while rebuilding it: the builders need not compare the whole lists again. The
    # proof is of the lists as read; a record changed since (a new prompt) is compared as any other.
    assert all(b.extends(a) for a, b in itertools.pairwise(loaded))
    changed = loaded[5].model_copy(update={"prompt_token_ids": [*loaded[5].prompt_token_ids[:-1], 1]})
    assert changed.extends(loaded[4]) is None and loaded[5].extends(loaded[3]) is None
    built = prefix_merging([*loaded[:5], changed, *loaded[6:]])
    assert len(built.traces) > 1 and built.break_reasons  # the change is seen, not vouched for
    full = sum(len(r.model_dump_json()) + 1 for r in records)
    unique = len(records[-1].prompt_token_ids) + len(records[-1].sampled_token_ids)
    stored = path.stat().st_size
    print(f"{stored / unique:.1f} bytes per unique token stored, {full / unique:.1f} as full records")
    assert stored < full / 10  # 60 calls: the full records repeat the context ~30 times


def test_a_line_built_on_the_loop_is_the_line_built_in_a_thread(tmp_path: Path) -> None:
    """Where no core is spare (ProxyConfig.helper_threads off) the record's line is built on the event loop, only
    the write and fsync in a thread: the same file either way."""
    records = grown_session(8, 40)
    files = []
    for in_thread in (True, False):
        writer = RecordWriter(tmp_path / f"{in_thread}.jsonl", line_in_thread=in_thread)

        async def go(writer: RecordWriter = writer) -> None:
            for rec in records:
                await writer.append(rec)

        asyncio.run(go())
        files.append((tmp_path / f"{in_thread}.jsonl").read_bytes())
    assert files[0] == files[1] and files[0].count(b"\n") == len(records)


def test_only_what_extends_is_stored_as_a_delta(tmp_path: Path) -> None:
    """A prompt that keeps the parent's prompt but not its sampled ids (the history re-rendered) keeps only the
    prompt; one that shares nothing, or names no written parent, is stored whole."""
    a, b, c, d = grown_session(4, 40)
    b = b.model_copy(update={"prompt_token_ids": [*a.prompt_token_ids, 7, 8, 9]})
    c = c.model_copy(update={"prompt_token_ids": [5, 6], "parent_call_id": b.call_id})
    d = d.model_copy(update={"parent_call_id": "never-written"})
    path = write([a, b, c, d], tmp_path / "s.jsonl")
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[1]["prompt_from"] == {
        "call": a.call_id,
        "keep": len(a.prompt_token_ids),
        "tail_z": pack_ids([7, 8, 9]),
        "sha256": prompt_digest(b.prompt_token_ids),
    }
    assert "prompt_from" not in lines[2] and "prompt_from" not in lines[3]
    assert [r.model_dump() for r in read_records(path)] == [r.model_dump() for r in (a, b, c, d)]
    # A parent whose request changed in memory after it was written: the child's request is stored against what was
    # written (what a reader has), whether the writer still holds that text or has to serialise the parent again.
    for held in (2, 0):
        e, f = grown_session(2, 40, seed=1)
        written = copy.deepcopy(e.request)
        path = tmp_path / f"changed-{held}.jsonl"
        writer = RecordWriter(path)
        writer._texts.size = held
        with path.open("w") as fh:
            fh.write(writer.line(e))
            e.request["messages"].append({"role": "user", "content": "added after the write"})
            fh.write(line := writer.line(f))
        assert ('"request_from"' in line) == bool(held) and '"prompt_from"' in line
        assert [r.request for r in read_records(path)] == [written, f.request]


def test_a_damaged_delta_is_named_not_misread(tmp_path: Path) -> None:
    records = grown_session(3, 40)
    path = write(records, tmp_path / "s.jsonl")
    lines = path.read_text().splitlines()
    second = json.loads(lines[1])
    plain = {k: v for k, v in second["request_from"].items() if k != "text_z"}
    cases = {
        "tail": (
            {**second, "prompt_from": {**second["prompt_from"], "tail_z": pack_ids([1, 2, 3])}},
            "does not match",
        ),
        "packed": ({**second, "prompt_from": {**second["prompt_from"], "tail_z": "AAA"}}, "ids do not unpack"),
        "keep": ({**second, "prompt_from": {**second["prompt_from"], "keep": 10**6}}, "keeps 1000000 ids of call c000"),
        "call": ({**second, "prompt_from": {**second["prompt_from"], "call": "zz"}}, "extends call zz, which is not"),
        "request": ({**second, "request_from": {**plain, "text": "{}"}}, "request does not match"),
        "zipped": ({**second, "request_from": {**second["request_from"], "text_z": "AAAA"}}, "text does not unpack"),
    }
    for name, (bad, message) in cases.items():
        broken = tmp_path / f"{name}.jsonl"
        broken.write_text("\n".join([lines[0], json.dumps(bad), lines[2]]) + "\n")
        with pytest.raises(ValueError, match=rf"{name}\.jsonl:2: its .*{message}"):
            read_records(broken)


def test_version_2_files_still_load(tmp_path: Path) -> None:
    """Schema 2 stored the new ids as a JSON list and the request's new text as is; such files read back whole."""
    records = grown_session(5, 40)
    path = write(records, tmp_path / "s.jsonl")
    old = []
    for line in map(json.loads, path.read_text().splitlines()):
        line["schema_version"] = 2
        if "prompt_from" in line:
            delta = line["prompt_from"]
            delta["tail"] = unpack_ids(delta.pop("tail_z"))
        if "request_from" in line:
            delta = line["request_from"]
            delta["text"] = RequestDelta.model_validate(delta).middle()
            delta.pop("text_z", None)
        old.append(json.dumps(line))
    v2 = tmp_path / "v2.jsonl"
    v2.write_text("\n".join(old) + "\n")
    assert [r.model_dump(exclude={"schema_version"}) for r in read_records(v2)] == [
        r.model_dump(exclude={"schema_version"}) for r in records
    ]
    assert {r.schema_version for r in read_records(v2)} == {2}


def test_a_continuation_s_proof_spares_the_comparison_and_a_void_one_is_compared(tmp_path: Path) -> None:
    """The proxy notes that a continuation's prompt is its parent's prompt + sampled ids + more (``prove_extends``):
    written as the same delta, digested by what it adds. A proof whose lists were replaced since is void: the prompt
    is compared, and one that no longer extends its parent is stored whole."""
    a, b, c = grown_session(3, 40)
    b.prove_extends(a)
    c.prove_extends(b)
    c.prompt_token_ids = [*b.prompt_token_ids[:-1], 1, *c.prompt_token_ids[len(b.prompt_token_ids) :]]
    path = write([a, b, c], tmp_path / "s.jsonl")
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[1]["prompt_from"]["keep"] == len(a.prompt_token_ids) + len(a.sampled_token_ids)
    assert lines[1]["prompt_from"]["sha256"] == prompt_digest(b.prompt_token_ids)
    assert "prompt_from" not in lines[2] and lines[2]["prompt_token_ids"] == c.prompt_token_ids
    assert [r.model_dump() for r in read_records(path)] == [r.model_dump() for r in (a, b, c)]


def test_a_request_s_text_written_from_the_one_before_is_the_standard_library_s() -> None:
    """``written_text`` reuses the text of the request before where their fields' JSON agrees; the text is always
    ``request_text``'s, whatever changed between the two."""
    history = [{"role": "system", "content": "Ünïcode ✓ \u2028 \x7f"}, {"role": "user", "content": "go"}]
    steps = [
        {"model": "m", "messages": history, "tools": TOOLS, "temperature": 1e-05},
        {
            "model": "m",
            "messages": [*history, {"role": "assistant", "content": "a"}],
            "tools": TOOLS,
            "temperature": 1e-05,
        },
        {"model": "m", "messages": [*history, {"role": "assistant", "content": "a"}, {"n": 1}], "tools": TOOLS},
        {"model": "m", "messages": [*history, {"role": "assistant", "content": "a"}, {"n": True}], "tools": TOOLS},
        {"model": "m", "messages": [*history, {"role": "assistant", "content": "a"}, {"n": 1.0}], "stream": True},
        {"messages": [history[1]], "model": "m", "lone": "\ud800", "big": 2**70},
        {"messages": [history[1], {"role": "tool", "content": "\ud800"}], "model": "m", "lone": "\ud800"},
        {"messages": []},
        {"messages": [history[0]]},
        ["not", "an", "object"],
        "a request that never parsed",
    ]
    before = None
    for request in steps:
        written = written_text(request, before)
        assert written.text == request_text(request)
        # what it says it shares with the text before (known from what it reused, not compared) is that text's, and
        # its digest, hashed on from the one before's where it shares what that one hashed, is the whole text's
        assert before is None or written.text[: written.same] == before.text[: written.same]
        assert written.digest(before) == hashlib.sha256(written.text.encode()).hexdigest()
        before = written
    # what agreed was taken, not written again: the same tools' text, the history's text extended
    first = written_text(steps[0])
    second = written_text(steps[1], first)
    assert second.fields["tools"].text is first.fields["tools"].text
    assert second.fields["messages"].text.startswith(first.fields["messages"].text[:-1])
    # the history extended: the text is known to be the first's up to where its messages ended, and the digest's
    # running hash goes on from there (what it hashes is the new message and what follows the list)
    first.digest(None)
    assert second.same == first.item_ends[0] < second.item_ends[0]
    assert second.digest(first) == hashlib.sha256(second.text.encode()).hexdigest()
    # its running hash is kept where the first's messages ended (hashed on from), then where each of its lists end
    assert second._marks[0][1] is first._marks[0][1] and [n for n, _ in second._marks] == [
        first.item_ends[0],
        *second.item_ends,
    ]
