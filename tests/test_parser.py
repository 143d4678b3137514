"""The incremental parser gives the same result however the text is split, and releases events early."""

from __future__ import annotations

import json

import pytest

from nemo_polar.proxy.parse.parser import ParseEvent, StreamParser


def run(
    text: str, step: int | None = None, types: dict[str, str] | None = None, reasoning_open: bool = False
) -> list[tuple[str, str]]:
    parser = StreamParser(param_types=lambda f, p: (types or {}).get(p), reasoning_open=reasoning_open)
    events: list[ParseEvent] = []
    chunks = [text] if step is None else [text[i : i + step] for i in range(0, len(text), step)]
    for chunk in chunks:
        events += parser.feed(chunk)
    events += parser.finish()
    merged: list[tuple[str, str]] = []
    for ev in events:
        value = f"{ev.call.name}|{ev.call.arguments}" if ev.call else ev.text
        if merged and ev.kind != "tool_call" and merged[-1][0] == ev.kind:
            merged[-1] = (ev.kind, merged[-1][1] + value)
        else:
            merged.append((ev.kind, value))
    return merged


CASES = {
    "plain": ("Hello world.", [("text", "Hello world.")]),
    "think_then_text": ("<think>\nhmm\n</think>\n\nHi!", [("reasoning", "hmm"), ("text", "Hi!")]),
    "hermes_call": (
        'Sure.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call>',
        [("text", "Sure."), ("tool_call", 'bash|{"command": "ls -la"}')],
    ),
    "two_calls": (
        '<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n<tool_call>\n{"name": "b", "arguments": {"x": 1}}\n'
        "</tool_call>",
        [("tool_call", "a|{}"), ("tool_call", 'b|{"x": 1}')],
    ),
    "qwen3_coder_call": (
        "<tool_call>\n<function=bash>\n<parameter=command>\nls\n</parameter>\n<parameter=timeout>\n5\n</parameter>\n"
        "</function>\n</tool_call>",
        [("tool_call", 'bash|{"command": "ls", "timeout": 5}')],
    ),
    "malformed_call_stays_text": (
        "<tool_call>\n{not json}\n</tool_call>",
        [("text", "<tool_call>\n{not json}\n</tool_call>")],
    ),
    "unterminated_call_stays_text": (
        'ok <tool_call>\n{"name": "bash", "argu',
        [("text", 'ok <tool_call>\n{"name": "bash", "argu')],
    ),
    "angle_brackets_in_text": ("a < b and <tool> x", [("text", "a < b and <tool> x")]),
    "unterminated_think": ("<think>\nstill thinking", [("reasoning", "still thinking")]),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("step", [None, 1, 3, 7])
def test_parse_is_split_invariant(name: str, step: int | None) -> None:
    text, expected = CASES[name]
    assert run(text, step, types={"timeout": "integer"}) == expected


def test_arguments_keep_the_sampled_spelling() -> None:
    text = '<tool_call>\n{"name": "f", "arguments": {"b":2,  "a": [1, 2]}}\n</tool_call>'
    [(_kind, value)] = run(text)
    assert value == 'f|{"b":2,  "a": [1, 2]}'  # not re-serialised
    assert json.loads(value.split("|", 1)[1]) == {"b": 2, "a": [1, 2]}


def test_text_is_released_before_the_generation_ends() -> None:
    parser = StreamParser()
    assert [e.text for e in parser.feed("Hello wor")] == ["Hello wor"]
    # a possible tag start is held back, nothing else is
    assert [e.text for e in parser.feed("ld <tool_")] == ["ld"]
    assert [e.text for e in parser.feed("box>")] == [" <tool_box>"]


def test_tool_call_is_released_when_its_closing_tag_arrives() -> None:
    parser = StreamParser()
    assert parser.feed('<tool_call>\n{"name": "f", "arguments": {}}\n') == []
    events = parser.feed("</tool_call>")
    assert events and events[0].kind == "tool_call" and events[0].call.name == "f"


@pytest.mark.parametrize("step", [None, 1, 3])
def test_a_prompt_that_opened_reasoning_starts_the_text_inside_it(step: int | None) -> None:
    """Qwen3.5's generation prompt ends with "<think>\n": the sample starts inside the block, and its first
    "</think>" closes it (a later "<think>" is text, as it would be anywhere else)."""
    sampled = (
        "I will list the files.\n</think>\n\n<tool_call>\n<function=bash>\n<parameter=command>\nls\n</parameter>\n"
        "</function>\n</tool_call>"
    )
    assert run(sampled, step, reasoning_open=True) == [
        ("reasoning", "I will list the files."),
        ("tool_call", 'bash|{"command": "ls"}'),
    ]
    assert run("no close yet", step, reasoning_open=True) == [("reasoning", "no close yet")]
    assert run("a\n</think>\n\nDone. <think>x</think>", step, reasoning_open=True) == [
        ("reasoning", "a"),
        ("text", "Done. <think>x</think>"),
    ]
    # Without the prompt's opening, the same text is plain text.
    assert run("I will list.\n</think>\n\nok", step)[0] == ("text", "I will list.\n</think>\n\nok")
