import pytest

from lrucache import LRUCache


def test_get_missing_returns_default():
    cache = LRUCache(2)
    assert cache.get("nope") is None
    assert cache.get("nope", 0) == 0


def test_put_overwrites_and_counts_hits():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("a", 2)
    assert cache.get("a") == 2
    assert cache.get("b") is None
    assert (cache.hits, cache.misses) == (1, 1)


def test_capacity_must_be_positive():
    with pytest.raises(ValueError):
        LRUCache(0)
