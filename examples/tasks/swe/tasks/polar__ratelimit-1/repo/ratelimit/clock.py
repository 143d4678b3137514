"""Clocks: callables returning seconds as a float, like ``time.monotonic``."""


class ManualClock:
    """A clock that only moves when told to, for tests and simulations."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock cannot go back")
        self.now += seconds
