import pytest

from confmerge import flatten, get_path, with_value


def test_get_path():
    config = {"db": {"pool": {"size": 5}}}
    assert get_path(config, "db.pool.size") == 5
    assert get_path(config, "db.pool.timeout", 30) == 30
    with pytest.raises(KeyError):
        get_path(config, "db.user")


def test_with_value_creates_levels():
    assert with_value({"a": 1}, "b.c", 2) == {"a": 1, "b": {"c": 2}}


def test_flatten():
    assert flatten({"a": {"b": 1, "c": {}}, "d": 2}) == {"a.b": 1, "a.c": {}, "d": 2}
