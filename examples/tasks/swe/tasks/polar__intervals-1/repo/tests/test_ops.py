import pytest

from intervals import Interval, gaps, merge, total_length


def test_merge_overlapping():
    assert merge([(1, 3), (2, 6), (8, 10)]) == [(1, 6), (8, 10)]


def test_merge_touching_and_unsorted():
    assert merge([(5, 7), (1, 5)]) == [Interval(1, 7)]


def test_total_length_counts_overlap_once():
    assert total_length([(0, 4), (2, 6), (10, 11)]) == 7


def test_gaps():
    assert gaps([(0, 1), (3, 4), (4, 6), (9, 10)]) == [(1, 3), (6, 9)]


def test_reversed_interval_is_rejected():
    with pytest.raises(ValueError):
        merge([(3, 1)])
