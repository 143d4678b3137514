"""Token-bucket rate limiting, per process or per key."""

from ratelimit.bucket import TokenBucket
from ratelimit.clock import ManualClock
from ratelimit.keyed import KeyedLimiter

__all__ = ["KeyedLimiter", "ManualClock", "TokenBucket"]
