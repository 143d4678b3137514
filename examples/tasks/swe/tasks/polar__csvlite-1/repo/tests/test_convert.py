from csvlite import coerce, typed


def test_coerce():
    assert [coerce(v) for v in ["", "42", "2.5", "TRUE", "n/a"]] == [None, 42, 2.5, True, "n/a"]


def test_typed_records():
    assert typed([{"id": "7", "ok": "false"}]) == [{"id": 7, "ok": False}]
