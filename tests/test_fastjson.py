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
