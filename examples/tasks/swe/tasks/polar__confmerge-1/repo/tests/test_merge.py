from confmerge import deep_merge, layered


def test_deep_merge_nested_keys():
    base = {"server": {"host": "localhost", "port": 80}, "debug": False}
    merged = deep_merge(base, {"server": {"port": 8080}})
    assert merged == {"server": {"host": "localhost", "port": 8080}, "debug": False}


def test_deep_merge_leaves_inputs_alone():
    base = {"a": {"b": 1}}
    deep_merge(base, {"a": {"c": 2}})
    assert base == {"a": {"b": 1}}


def test_layered_priority():
    assert layered({"x": 1, "y": 1}, {"y": 2}, {"y": 3}) == {"x": 1, "y": 3}
