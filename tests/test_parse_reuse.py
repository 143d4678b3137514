"""A harness resends its whole history on every call; the proxy parses only what a request adds to a history it
parsed before (``PrefixMemo``: the items' JSON compared as bytes), and the conversation is the one a whole parse
gives. Histories are compared by digests each message and tool keeps (``fingerprint``). A continuation's prompt
extends its parent's: its JSON and its end-of-turn count are the parent's plus what it adds (``PromptMemo``)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from nemo_polar.proxy import fastjson
from nemo_polar.proxy.apis import chat
from nemo_polar.proxy.conversation import Message, Tool, ToolCall, fingerprint
from nemo_polar.proxy.errors import ProxyError
from nemo_polar.proxy.generate.generation import _continue
from nemo_polar.proxy.render.renderer import _keys
from nemo_polar.proxy.render.template_segments import TemplateCache
from nemo_polar.proxy.store.memos import ParseMemos
from nemo_polar.proxy.store.records import CallRecord, RecordWriter
from nemo_polar.proxy.store.sessions import CallState, PromptMemo, Session, SessionConfig

TOOLS = [
    {"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {}}}},
    {"type": "custom", "custom": {"name": "apply_patch"}},  # not a function: gives no tool
]


def body(messages: list[dict[str, Any]], tools: list[dict[str, Any]] = TOOLS) -> dict[str, Any]:
    return {"model": "m", "messages": copy.deepcopy(messages), "tools": copy.deepcopy(tools)}


def call(i: int, call_id: Any = None) -> list[dict[str, Any]]:
    ident = call_id if call_id is not None else f"call_{i}"
    turn = {"role": "assistant", "content": "", "tool_calls": [
        {"id": ident, "type": "function", "function": {"name": "bash", "arguments": f'{{"n":{i}}}'}}]}  # fmt: skip
    return [turn, {"role": "tool", "tool_call_id": ident, "content": f"output {i} Ünïcode"}]


def test_a_growing_history_parses_only_what_it_adds_and_gives_the_same_conversation() -> None:
    memos = ParseMemos()
    history = [{"role": "system", "content": "sys"}, {"role": "user", "content": "fix it"}]
    side = [{"role": "user", "content": "a title for this session"}]  # a side call between main calls
    last: list[Message] = []
    for i in range(6):
        history += call(i)
        conv = chat.parse(body(history), memos)
        assert conv == chat.parse(body(history))
        assert all(a is b for a, b in zip(conv.messages, last, strict=False))  # what was parsed before is reused
        assert conv.messages[len(last)] is not (last[-1] if last else None)
        last = conv.messages
        assert chat.parse(body(side), memos) == chat.parse(body(side))
    # history rewritten mid-way, or an item the same as a Python value but not as JSON: parsed afresh
    for changed in (
        [*history[:3], {**history[3], "content": "compacted"}, *history[4:]],
        [*history[:2], *call(0, call_id=1), *history[4:]],
        [*history[:2], *call(0, call_id=True), *history[4:]],
    ):
        conv = chat.parse(body(changed), memos)
        assert conv == chat.parse(body(changed))
        assert conv.messages[2] is not last[2]
    assert chat.parse(body(history[:2], tools=[]), memos).tools == []


def test_a_request_that_fails_to_parse_keeps_nothing() -> None:
    memos = ParseMemos()
    good = [{"role": "user", "content": "hi"}]
    first = chat.parse(body(good), memos).messages[0]
    with pytest.raises(ProxyError):
        chat.parse(body([*good, {"role": "robot", "content": "x"}]), memos)
    assert chat.parse(body([*good, {"role": "user", "content": "again"}]), memos).messages[0] is first


def test_fingerprints_tell_histories_apart_by_every_message_and_tool() -> None:
    conv = chat.parse(body([{"role": "user", "content": "hi"}, *call(0), *call(1)]))
    same = chat.parse(body([{"role": "user", "content": "hi"}, *call(0), *call(1)]))
    assert fingerprint(conv.messages, conv.tools) == fingerprint(same.messages, same.tools)
    base = fingerprint(conv.messages, conv.tools)
    assert fingerprint(conv.messages[:-1], conv.tools) != base
    assert fingerprint(conv.messages, []) != base
    assert fingerprint(conv.messages[1:], conv.tools) != base
    other = [*conv.messages[:-1], Message(role="tool", content="output 1 changed", tool_call_id="call_1")]
    assert fingerprint(other, conv.tools) != base
    swapped = [conv.messages[0], conv.messages[3], conv.messages[4], conv.messages[1], conv.messages[2]]
    assert fingerprint(swapped, conv.tools) != base
    assert fingerprint(conv.messages, [Tool(name="bash", description="runs")]) != base
    # the harness's own ids are no part of a history
    renamed = [m.model_copy(update={"echo_ids": ["x"], "source_call_id": "c"}) for m in conv.messages]
    assert fingerprint(renamed, conv.tools) == base


EOT = 9


@pytest.mark.parametrize("sampled", [[5, 6, EOT], [5, 6]])  # a turn the engine closed, and one cut short
def test_a_continuation_s_prompt_json_and_count_extend_its_parent_s(sampled: list[int]) -> None:
    parent_prompt = [1, EOT, 2, 3, EOT, 4]
    rec = CallRecord(
        call_id="c1", session_id="s", api="chat", mode="continuation", request=None, started_at=0.0,
        prompt_token_ids=parent_prompt, sampled_token_ids=sampled, complete=True,
    )  # fmt: skip
    state = CallState(rec, "", Message(role="assistant", content="x"))
    full = [1, EOT, 2, 3, EOT, 4, 5, 6, EOT, 7, 8, EOT, 10]  # the whole history rendered afresh
    memo = PromptMemo(parent_prompt, fastjson.dumps(parent_prompt), EOT, parent_prompt.count(EOT), len(parent_prompt))
    unknown = PromptMemo(list(parent_prompt), b"[0]", EOT, 0, 6)  # another list: not this parent's prompt
    results = [_continue(state, full, EOT, "<eot>", last) for last in (memo, None, unknown)]
    ends = [i + 1 for i, t in enumerate(full) if t == EOT]  # the render's ends of turn, as its cache knows them
    results.append(_continue(state, full, EOT, "<eot>", memo, ends))
    # Committed with its records on disk, the parent shares its prompt's list: the first continuation extends that
    # list in place, a second one (a branch) copies, and the parent's prompt reads the same throughout.
    rec.share_prompt()
    shared = rec.prompt_view()[0]
    assert rec.prompt_token_ids == [] and rec.prompt_view() == (parent_prompt, 6)
    shared_memo = PromptMemo(shared, fastjson.dumps(shared), EOT, shared.count(EOT), len(shared))
    for _ in range(2):
        results.append(_continue(state, full, EOT, "<eot>", shared_memo))
        assert rec.prompt_view()[0][: rec.prompt_view()[1]] == parent_prompt
    assert results[-2][0] is not None and results[-2][0].ids is shared  # the first: the parent's list, extended
    assert results[-1][0] is not None and results[-1][0].ids is not shared
    expected = [*parent_prompt[:6], *sampled, *([] if sampled[-1] == EOT else [EOT]), 7, 8, EOT, 10]
    for made, reason in results:
        assert reason == "continuation" and made is not None
        assert made.ids == expected and made.json == fastjson.dumps(expected) and made.length == len(expected)
        assert made.count == expected.count(EOT) and made.token == EOT


def test_a_message_hands_the_template_one_dict_and_the_next_render_writes_only_new_ones() -> None:
    conv = chat.parse(body([{"role": "user", "content": "hi"}, *call(0)]))
    dicts = conv.template_messages()
    assert [m.to_template() for m in conv.messages] == dicts and conv.template_messages()[1] is dicts[1]
    assert dicts[1] == {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "call_0", "type": "function", "function": {"name": "bash", "arguments": '{"n":0}'}}],
    }
    last = TemplateCache()
    first = _keys(dicts, last)
    assert first == [fastjson.dumps(m) for m in dicts]
    last.written = (dicts, first)
    changed = {**dicts[2], "content": "other"}  # an equal-looking position, another dict: written again
    again = _keys([*dicts[:2], changed, {"role": "user", "content": "new"}], last)
    assert again[0] is first[0] and again[1] is first[1]
    assert again[2] == fastjson.dumps(changed) and again[3] == fastjson.dumps({"role": "user", "content": "new"})


def test_a_copy_with_changed_fields_is_digested_and_templated_afresh() -> None:
    message = Message(role="user", content="hi")
    tool = Tool(name="bash")
    before = fingerprint([message], [tool]), message.to_template()
    edited, renamed = message.model_copy(update={"content": "bye"}), tool.model_copy(update={"name": "sh"})
    assert edited.to_template() == {"role": "user", "content": "bye"} and before[1] == {"role": "user", "content": "hi"}
    assert fingerprint([edited], [tool]) != before[0] and fingerprint([message], [renamed]) != before[0]
    assert fingerprint([message.model_copy(deep=True)], [tool.model_copy()]) == before[0]


def _commit(session: Session, conv: Any, n: int, content: str, calls: list[str]) -> None:
    """Commit call ``n`` of ``session`` answering ``conv`` with ``content`` and tool calls ``calls`` (their ids)."""
    rec = CallRecord(
        call_id=f"call-{n}", session_id=session.id, api="chat", mode="continuation", request=None, started_at=0.0,
        prompt_token_ids=[1, n], sampled_token_ids=[EOT], complete=True,
    )  # fmt: skip
    output = Message(role="assistant", content=content, reasoning=f"thought {n}")
    output.tool_calls = [ToolCall(id=ident, name="bash", arguments="{}") for ident in calls]
    session.commit(rec, conv, output, [])


def _as_restored(conv: Any) -> list[tuple[Any, ...]]:
    return [(m.model_dump(), m.source_call_id) for m in conv.messages]


def _assert_restored_as_whole(session: Session, conv: Any, history: list[dict[str, Any]]) -> None:
    """``conv`` (restored by ``session``, reusing its last request's) has the turns, calls and running fingerprints
    that a restore of the whole ``history`` gives, by a session in the same state with no last request."""
    whole = chat.parse(body(history))
    reference = Session("s", "k", SessionConfig(), RecordWriter(None))
    reference.__dict__.update({k: v for k, v in session.__dict__.items() if k not in ("history", "memos")})
    reference.restore(whole)
    assert _as_restored(conv) == _as_restored(whole)
    assert [conv.fingerprint(k) for k in range(len(history) + 1)] == [
        fingerprint(whole.messages[:k], whole.tools) for k in range(len(history) + 1)
    ]


def test_a_growing_history_is_restored_and_digested_as_a_whole_restore_does() -> None:
    """``Session.restore`` reuses the last request's restored turns and running fingerprints where the history starts
    with the same parsed messages; the turns and fingerprints must be those a restore of the whole history gives, also
    when a later call gives a reply text again (the text's turns point at the later call) and when a turn's call was
    still in flight at the last request."""
    session = Session("s", "k", SessionConfig(), RecordWriter(None))
    memos = ParseMemos()
    history: list[dict[str, Any]] = [{"role": "user", "content": "fix it"}]
    replies = ["looking", "done", "looking", "again", "done"]  # texts given again: remapped
    looked: list[Message] = []
    lookup = session._restored
    session._restored = lambda m: looked.append(m) or lookup(m)  # type: ignore[method-assign]
    for n, text in enumerate(replies):
        conv = chat.parse(body(history), memos)
        looked.clear()
        session.restore(conv)
        if n in (1, 2, 4):  # nothing pointed at another call since the last request: only its new turn is looked up
            assert [m.content for m in looked] == [replies[n - 1]]
        elif n:  # call 2 gave "looking" again: every turn is looked up afresh
            assert len(looked) == n + 1
        _assert_restored_as_whole(session, conv, history)
        if n == 2:  # a turn the harness already has while its call is in flight: not restored until it commits
            history += [{"role": "assistant", "content": "", "tool_calls": [
                {"id": "call_late", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "call_late", "content": "ran"}]  # fmt: skip
            conv = chat.parse(body(history), memos)
            session.restore(conv)
            assert conv.messages[-2].source_call_id is None
            _commit(session, conv, 100, "", ["call_late"])
        _commit(session, conv, n, text, [])
        history += [{"role": "assistant", "content": text}, {"role": "user", "content": f"step {n}"}]
    conv = chat.parse(body(history), memos)
    session.restore(conv)
    sources = [m.source_call_id for m in conv.messages if m.role == "assistant"]
    assert sources == ["call-2", "call-4", "call-100", "call-2", "call-3", "call-4"]  # a text's last call; the late one


def test_a_text_given_again_restores_afresh_only_from_its_first_turn() -> None:
    """A reply text given again points its turns at the later call (``Session.remapped``): the next request restores
    afresh from the first turn with that text, and reuses every turn before it as it was restored. Ids given again
    likewise. The turns, their calls and the fingerprints are those a restore of the whole history gives."""
    session = Session("s", "k", SessionConfig(), RecordWriter(None))
    memos = ParseMemos()
    history: list[dict[str, Any]] = [{"role": "user", "content": "fix it"}]
    looked: list[Message] = []
    lookup = session._restored
    session._restored = lambda m: looked.append(m) or lookup(m)  # type: ignore[method-assign]
    steps = [("a", []), ("b", []), ("", ["call_x"]), ("c", []), ("d", []), ("c", []), ("", ["call_x"]), ("e", [])]
    for n, (text, ids) in enumerate(steps):
        conv = chat.parse(body(history), memos)
        looked.clear()
        session.restore(conv)
        asked = [m.content or m.tool_calls[0].id for m in looked]
        if n == 6:  # call 5 gave "c" again: from the first "c" on
            assert asked == ["c", "d", "c"]
        elif n == 7:  # call 6 gave the id call_x again: from its first turn on
            assert asked == ["call_x", "c", "d", "c", "call_x"]
        elif n:
            assert len(asked) == 1  # only the turn added
        _assert_restored_as_whole(session, conv, history)
        _commit(session, conv, n, text, ids)
        if ids:
            history += [{"role": "assistant", "content": "", "tool_calls": [{"id": ids[0], "type": "function",
                        "function": {"name": "bash", "arguments": "{}"}}]},
                        {"role": "tool", "tool_call_id": ids[0], "content": f"ran {n}"}]  # fmt: skip
        else:
            history += [{"role": "assistant", "content": text}, {"role": "user", "content": f"step {n}"}]
    sources = [m.source_call_id for m in conv.messages if m.role == "assistant"]
    assert sources == ["call-0", "call-1", "call-6", "call-5", "call-4", "call-5", "call-6"]
