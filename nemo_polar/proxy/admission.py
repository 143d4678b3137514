"""Weight-sync admission: ``pause`` stops admitting new generations and waits (bounded) for in-flight ones to
drain, so the trainer can swap weights; ``resume`` reopens with the new policy version, which is stamped on every
record from then on. Harness requests that arrive while paused simply wait: the CLI sees a slow model, not an error.
"""

from __future__ import annotations

import asyncio
import time

from pydantic import BaseModel


class AdmissionState(BaseModel):
    paused: bool
    policy_version: int | None
    in_flight: int
    drained: bool | None = None
    waited_s: float | None = None


class Ticket:
    """One admitted generation; released exactly once, whichever way the call ends."""

    def __init__(self, admission: Admission) -> None:
        self._admission = admission
        self.version = admission.version
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._admission._leave()


class Admission:
    def __init__(self, version: int | None = None) -> None:
        self.version = version
        self.in_flight = 0
        self._open = asyncio.Event()
        self._open.set()
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def paused(self) -> bool:
        return not self._open.is_set()

    async def enter(self) -> Ticket:
        while not self._open.is_set():  # loop: a pause may begin between the wake-up and the increment
            await self._open.wait()
        self.in_flight += 1
        self._idle.clear()
        return Ticket(self)

    def _leave(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()

    async def pause(self, timeout_s: float) -> AdmissionState:
        self._open.clear()
        t0 = time.monotonic()
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
            drained = True
        except TimeoutError:
            drained = False
        return self.state(drained=drained, waited_s=time.monotonic() - t0)

    def resume(self, policy_version: int | None = None) -> AdmissionState:
        if policy_version is not None:
            self.version = policy_version
        self._open.set()
        return self.state()

    def state(self, **extra: object) -> AdmissionState:
        return AdmissionState(paused=self.paused, policy_version=self.version, in_flight=self.in_flight, **extra)  # type: ignore[arg-type]
