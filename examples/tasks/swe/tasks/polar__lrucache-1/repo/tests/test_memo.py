from lrucache import memoize


def test_memoize_calls_function_once_per_argument():
    calls = []

    @memoize(capacity=4)
    def square(x):
        calls.append(x)
        return x * x

    assert [square(3), square(3), square(4)] == [9, 9, 16]
    assert calls == [3, 4]
