import pytest

from ratelimit import ManualClock, TokenBucket


def test_burst_up_to_capacity():
    bucket = TokenBucket(rate=3, clock=ManualClock())
    assert [bucket.try_acquire() for _ in range(4)] == [True, True, True, False]


def test_tokens_refill_over_time():
    clock = ManualClock()
    bucket = TokenBucket(rate=10, per=1, clock=clock)
    assert bucket.try_acquire(10)
    clock.advance(0.5)
    assert bucket.try_acquire(5)
    assert not bucket.try_acquire()


def test_refill_is_capped_at_capacity():
    clock = ManualClock()
    bucket = TokenBucket(rate=2, capacity=4, clock=clock)
    clock.advance(100)
    assert bucket.try_acquire(4)
    assert not bucket.try_acquire()


def test_invalid_rate():
    with pytest.raises(ValueError):
        TokenBucket(rate=0)
