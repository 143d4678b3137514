from ratelimit import KeyedLimiter, ManualClock, TokenBucket


def test_keys_have_separate_buckets():
    clock = ManualClock()
    limiter = KeyedLimiter(lambda: TokenBucket(rate=1, per=1, clock=clock))
    assert limiter.try_acquire("alice")
    assert not limiter.try_acquire("alice")
    assert limiter.try_acquire("bob")
    assert len(limiter) == 2
