"""A session's request bodies are parsed as what they add (``BodyMemo``): the items of a kept body's history list that
lie in the bytes the new body starts with are reused, and the rest is parsed with those items cut out. Whatever the
bytes, the result is the whole body's parse (``fastjson.loads``): checked on the real harnesses' bodies of every
dialect, on bodies written in other spacings, with strings that hold brackets, commas, quotes and escapes, duplicate
and nested keys, edits inside earlier items, and on seeded random histories."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import orjson
import pytest

from nemo_polar.proxy import fastjson
from nemo_polar.proxy.apis import ADAPTERS, chat
from nemo_polar.proxy.render.prefix import common_prefix, common_suffix
from nemo_polar.proxy.store.memos import BodyMemo, ParseMemos, PrefixMemo

FIXTURES = Path(__file__).parent / "fixtures" / "harness_requests"
HISTORY = {"responses": "input", "anthropic-messages": "messages", "chat-completions": "messages"}
HISTORY["gemini-generate-content"] = "contents"


def compact(body: Any) -> bytes:
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()  # as JSON.stringify writes


def check(memo: BodyMemo, data: bytes) -> Any:
    """The memo's parse of ``data``, checked against the whole parse."""
    got = memo.loads(data)
    assert got == fastjson.loads(data)
    assert orjson.dumps(got, option=orjson.OPT_PASSTHROUGH_SUBCLASS) == orjson.dumps(fastjson.loads(data))
    return got


def growing(body: dict[str, Any], key: str, start: int = 1) -> list[bytes]:
    """The bodies a harness sends as its history grows to ``body``'s: the same fields, the first n items."""
    return [compact({**body, key: body[key][:n]}) for n in range(start, len(body[key]) + 1)]


def real_bodies() -> list[tuple[str, dict[str, Any], str]]:
    out = []
    for path in sorted(FIXTURES.glob("*/*.json")):
        request = json.loads(path.read_text())
        key = HISTORY[request["api"]]
        if isinstance(request["body"].get(key), list) and len(request["body"][key]) > 1:
            out.append((f"{path.parent.name}/{path.stem}", request["body"], key))
    return out


@pytest.mark.parametrize(("name", "body", "key"), real_bodies(), ids=[b[0] for b in real_bodies()])
def test_a_real_harness_s_growing_history_parses_as_a_whole_parse_reusing_its_items(
    name: str, body: dict[str, Any], key: str
) -> None:
    memo = BodyMemo(key)
    before: list[Any] = []
    for data in growing(body, key):
        got = check(memo, data)
        assert all(a is b for a, b in zip(got[key], before, strict=False))  # the kept items, not copies
        before = got[key]
    assert memo.reused >= len(body[key]) - 1  # every call after the first reused all the items before it


def test_the_adapters_name_the_history_the_fixtures_carry() -> None:
    assert {a.history_field for a in ADAPTERS.values()} == set(HISTORY.values())


TRICKY = [
    'a "quoted" [list], {obj}, and a comma,',
    'back\\slash \\" and \\\\',
    "\\u005d\\u002c",
    "Ünïcode ✓ \u2028 \x7f tab\t newline\n",
    "]",
    ",",
    '{"role":"user","content":"fake item"}',
]


def test_strings_that_look_like_json_structure_do_not_cut_an_item() -> None:
    items: list[Any] = []
    memo = BodyMemo("messages")
    for i, text in enumerate(TRICKY * 2):
        items = [*items, {"role": "user", "content": text, "n": [i, {"deep": [text, None, True, 1.5e-3]}]}]
        check(memo, compact({"model": "m", "messages": items, "tail": {"messages": text}}))
        check(memo, json.dumps({"model": "m", "messages": items}).encode())  # ASCII escapes, spaced
    assert memo.reused > 0


@pytest.mark.parametrize(
    "write",
    [
        lambda b: json.dumps(b).encode(),
        lambda b: json.dumps(b, indent=2).encode(),
        lambda b: json.dumps(b, indent="\t", separators=(" , ", " : ")).encode(),
        lambda b: b"  \n" + compact(b) + b"\n",
    ],
    ids=["spaced", "indented", "odd-spacing", "padded"],
)
def test_any_spacing_parses_as_a_whole_parse(write: Any) -> None:
    memo = BodyMemo("messages")
    items: list[Any] = [{"role": "system", "content": "s"}]
    for i in range(6):
        items = [*items, {"role": "user", "content": f"u{i}"}, [i, [], {}], i, None, "x"]
        check(memo, write({"model": "m", "messages": items, "tools": [{"name": "t"}]}))
    assert memo.reused > 0


def test_an_edit_inside_an_earlier_item_reuses_only_the_items_before_it() -> None:
    memo = BodyMemo("messages")
    items = [{"role": "user", "content": f"m{i}"} for i in range(5)]
    first = check(memo, compact({"messages": items}))
    edited = [*items[:2], {"role": "user", "content": "m2 changed"}, *items[3:], {"role": "user", "content": "m5"}]
    second = check(memo, compact({"messages": edited}))
    assert [a is b for a, b in zip(second["messages"], first["messages"], strict=False)] == [True, True] + [False] * 3


@pytest.mark.parametrize(
    "bodies",
    [
        # a duplicate key: a parser keeps the last value, so the list cut must not be the first one
        [b'{"messages":[1,2,3],"x":0}', b'{"messages":[1,2,3,4],"messages":[9],"x":0}'],
        [b'{"messages":[1,2],"messages":[7,8]}', b'{"messages":[1,2],"messages":[7,8,9]}'],
        # the key nested in another field first, then at the top level
        [b'{"a":{"messages":[1,2]},"messages":[3,4]}', b'{"a":{"messages":[1,2]},"messages":[3,4,5]}'],
        # the key written with an escape
        [b'{"m\\u0065ssages":[1,2]}', b'{"m\\u0065ssages":[1,2,3]}'],
        # the history stops being a list, or the body an object
        [b'{"messages":[1,2]}', b'{"messages":[1,2]]}', b'{"messages":{"a":[1,2]}}'],
        [b'{"messages":[1,2]}', b'[{"messages":[1,2]}]'],
        # a lone surrogate escape, which the standard library reads and orjson does not
        [b'{"messages":["a"]}', b'{"messages":["a","\\ud800"]}', b'{"messages":["a","\\ud800","b"]}'],
        # an integer past 64 bits
        [b'{"messages":[1]}', b'{"messages":[1,18446744073709551616]}'],
        # emptied, then grown again
        [b'{"messages":[1,2]}', b'{"messages":[]}', b'{"messages":[1]}', b'{"messages":[1,2]}'],
    ],
)
def test_bodies_of_unusual_shape_parse_as_a_whole_parse(bodies: list[bytes]) -> None:
    memo = BodyMemo("messages")
    for data in bodies:
        try:
            expected = fastjson.loads(data)
        except ValueError:
            with pytest.raises(ValueError):
                memo.loads(data)
            continue
        assert memo.loads(data) == expected


def test_a_body_that_is_not_json_raises_as_a_whole_parse_does_and_the_memo_still_serves() -> None:
    memo = BodyMemo("messages")
    check(memo, b'{"messages":[{"a":1},{"b":2}]}')
    for bad in (b'{"messages":[{"a":1},{"b":2},', b'{"messages":[{"a":1},{"b":2},{"c":]}', b'{"messages":[{"a":1}'):
        with pytest.raises(ValueError):
            memo.loads(bad)
    got = check(memo, b'{"messages":[{"a":1},{"b":2},{"c":3}]}')
    assert got["messages"][2] == {"c": 3} and memo.reused == 2


def test_side_calls_with_histories_of_their_own_each_reuse_theirs() -> None:
    memo = BodyMemo("messages")
    main = [{"role": "user", "content": f"main {i}"} for i in range(3)]
    side = [{"role": "user", "content": f"title please {i}"} for i in range(3)]
    for n in range(1, 4):
        check(memo, compact({"messages": main[:n]}))
        check(memo, compact({"messages": side[:n]}))
    assert memo.reused == 2 * (1 + 2)  # each history reused its own items on the 2nd and 3rd call


def random_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(8 if depth < 3 else 4)
    if kind == 0:
        return rng.choice(TRICKY) + str(rng.random())
    if kind == 1:
        return rng.choice([None, True, False, 0, -1, 1.25, 10**20])
    if kind == 2:
        return "".join(rng.choice('ab"\\,[]{}:\n\u00e9\u2603 ') for _ in range(rng.randrange(12)))
    if kind == 3:
        return rng.randrange(-1000, 1000)
    if kind < 6:
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice(["role", "content", "messages", "x", 'a"b']): random_value(rng, depth + 1) for _ in range(3)}


def test_seeded_random_histories_parse_as_a_whole_parse() -> None:
    rng = random.Random(20261129)
    writers = [compact, lambda b: json.dumps(b).encode(), lambda b: json.dumps(b, indent=1).encode()]
    reused = 0
    for _ in range(60):
        memo = BodyMemo("messages")
        write = rng.choice(writers)
        items: list[Any] = []
        head = {"model": random_value(rng)}
        for _ in range(12):
            step = rng.random()
            if step < 0.6:
                items = [*items, *(random_value(rng) for _ in range(rng.randrange(1, 3)))]
            elif step < 0.75 and items:
                at = rng.randrange(len(items))
                items = [*items[:at], random_value(rng), *items[at + 1 :]]
            elif step < 0.85 and items:
                items = items[: rng.randrange(len(items))]
            elif step < 0.9:
                head = {"model": random_value(rng)}
            check(memo, write({**head, "messages": items, "tools": random_value(rng)}))
        reused += memo.reused
    assert reused > 500  # the random histories were mostly reused, not parsed whole


def test_the_history_items_a_body_reuses_are_parsed_once_and_known_by_identity() -> None:
    bodies, memos = BodyMemo("messages"), ParseMemos()
    history: list[Any] = [{"role": "system", "content": "sys"}]
    last: list[Any] = []
    for i in range(5):
        history = [*history, {"role": "user", "content": f"do {i}"}, {"role": "assistant", "content": f"did {i}"}]
        data = compact({"model": "m", "messages": history})
        conv = chat.parse(bodies.loads(data), memos)
        assert conv == chat.parse(fastjson.loads(data))
        assert all(a is b for a, b in zip(conv.messages, last, strict=False))
        last = conv.messages
    edited = [*history[:3], {"role": "assistant", "content": "compacted"}, *history[4:]]
    conv = chat.parse(bodies.loads(compact({"model": "m", "messages": edited})), memos)
    assert conv == chat.parse({"model": "m", "messages": edited})
    assert [a is b for a, b in zip(conv.messages, last, strict=True)] == [True] * 3 + [False] * (len(last) - 3)


def test_histories_interleaved_up_to_the_memo_s_size_each_reuse_their_own() -> None:
    memo: PrefixMemo[str] = PrefixMemo(size=4)
    parsed: list[str] = []

    def one(item: Any, i: int) -> str:
        parsed.append(item)
        return item

    lists: list[list[str]] = [[], [], [], []]
    for n in range(3):
        for k, items in enumerate(lists):
            items.append(f"history {k} item {n}")
            assert memo.parse(list(items), one) == items
    assert len(parsed) == 12  # each item parsed once: four histories kept, none pushed out by the others


def test_shared_starts_and_ends_are_found_as_a_walk_finds_them_for_texts_bytes_and_lists() -> None:
    """``common_prefix`` and ``common_suffix`` halve with comparisons in place (bytes) or of one side's slice (text):
    the lengths a walk item by item finds, on seeded random pairs."""
    rng = random.Random(7)

    def walk(a: Any, b: Any, limit: int, backwards: bool) -> int:
        n = 0
        while n < min(len(a), len(b), limit) and a[-1 - n if backwards else n] == b[-1 - n if backwards else n]:
            n += 1
        return n

    for _ in range(2000):
        base = "".join(rng.choice("ab\u00e9") for _ in range(rng.randrange(40)))
        a = base[: rng.randrange(len(base) + 1)] + "".join(rng.choice("ab") for _ in range(rng.randrange(5)))
        b = base + "".join(rng.choice("ab") for _ in range(rng.randrange(5)))
        limit = rng.randrange(50)
        for x, y in ((a, b), (a.encode(), b.encode()), (list(a), list(b))):
            assert common_prefix(x, y) == walk(x, y, len(x) + len(y), False)
            assert common_suffix(x, y, limit) == walk(x, y, limit, True)
            known = rng.randrange(walk(x, y, len(x) + len(y), False) + 1)  # a part known to agree: only the rest read
            assert common_prefix(x, y, known) == walk(x, y, len(x) + len(y), False)
