"""The proxy's JSON for context-sized payloads (nemo_polar/proxy/fastjson.py) writes and reads what the standard
library does, including what orjson alone refuses."""

from __future__ import annotations

import json

import pytest

from nemo_polar.proxy import fastjson

ODD = [
    {"content": "lone \ud800 surrogate", "n": 1},  # a harness's JSON may escape one; orjson refuses to write it
    {"id": 2**70},  # past 64 bits
    {"b": [1, 2.5, None, True], "a": "Ünïcode <tags> \u2028"},
]


@pytest.mark.parametrize("obj", ODD)
def test_dumps_round_trips_what_the_standard_library_does(obj):
    data = fastjson.dumps(obj)
    data.decode("utf-8")  # valid UTF-8 on the wire, whichever writer wrote it
    assert json.loads(data) == obj
    assert fastjson.loads(data) == obj


def test_sorted_keys_give_one_text_for_equal_objects():
    one = fastjson.dumps({"b": 1, "a": {"d": 2, "c": 3}}, sort_keys=True)
    two = fastjson.dumps({"a": {"c": 3, "d": 2}, "b": 1}, sort_keys=True)
    assert one == two and one.index(b'"a"') < one.index(b'"b"')


def test_loads_reads_a_lone_surrogate_escape_and_rejects_invalid_json():
    assert fastjson.loads(b'{"t": "\\ud800"}') == {"t": "\ud800"}
    with pytest.raises(ValueError):
        fastjson.loads(b'{"t": ')


def test_dumps_with_takes_fields_already_written():
    ids = [151644, 872, 198]
    data = fastjson.dumps_with({"model": "m", "prompt": "replaced", "stream": False}, {"prompt": fastjson.dumps(ids)})
    assert json.loads(data) == {"model": "m", "stream": False, "prompt": ids}
    assert json.loads(fastjson.dumps_with({}, {"prompt": b"[1]"})) == {"prompt": [1]}
    assert json.loads(fastjson.dumps_with({"lone": "\ud800"}, {"prompt": b"[1]"})) == {"lone": "\ud800", "prompt": [1]}


def test_loads_echo_marks_only_a_byte_for_byte_echo():
    sent = fastjson.dumps([5, 6, 7])
    compact = b'{"choices":[{"prompt_token_ids":[5,6,7],"text":"[5,6,7]"}]}'
    assert fastjson.loads_echo(compact, "prompt_token_ids", sent) == {
        "choices": [{"prompt_token_ids": fastjson.AS_SENT, "text": "[5,6,7]"}]
    }
    # equal ids written otherwise, other ids, a longer list, the ids under another key: parsed as they stand
    for data in (
        b'{"choices": [{"prompt_token_ids": [5, 6, 7]}]}',
        b'{"choices":[{"prompt_token_ids":[5,6,8]}]}',
        b'{"choices":[{"prompt_token_ids":[5,6,7,8]}]}',
        b'{"choices":[{"token_ids":[5,6,7]}]}',
    ):
        assert fastjson.loads_echo(data, "prompt_token_ids", sent) == json.loads(data)
    # a string that spells the field out is escaped JSON: never taken for the field
    quoted = json.dumps({"text": '"prompt_token_ids":[5,6,7]'}).encode()
    assert fastjson.loads_echo(quoted, "prompt_token_ids", sent) == json.loads(quoted)
    # every choice that echoes it
    two = b'[{"prompt_token_ids":[5,6,7]},{"prompt_token_ids":[5,6,7]}]'
    assert fastjson.loads_echo(two, "prompt_token_ids", sent) == [{"prompt_token_ids": fastjson.AS_SENT}] * 2
