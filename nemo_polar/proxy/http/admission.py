"""Weight-sync admission: ``pause`` stops admitting new generations and waits (bounded) for in-flight ones to
drain, so the trainer can swap weights; ``resume`` reopens with the new policy version, which is stamped on every
record from then on. Harness requests that arrive while paused simply wait: the CLI sees a slow model, not an error.

``pause(keep=True)`` is for an engine that pauses in-flight generations itself and resumes them under the new
weights (vLLM's keep mode, NeMo-RL PR #3839): nothing is drained, and a generation that is still in flight when
``resume`` changes the version records where it changed (:meth:`Ticket.version_changed`), so one call is never
silently taken for one version.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from pydantic import BaseModel


class VersionChange(BaseModel):
    """A weight update during a generation: tokens ``[0, at_token)`` were sampled before it."""

    at_token: int
    policy_version: int


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
        # Set once the engine has the request: how many tokens it has sampled so far.
        self.sampled: Callable[[], int] | None = None
        self.changes: list[VersionChange] = []

    def version_changed(self, version: int) -> None:
        """The policy changed while this generation was admitted: before the engine had the request, it simply runs
        under the new version; after, the change is recorded at the token count reached (its KV cache, at least,
        is the old policy's)."""
        if self.sampled is None:
            self.version = version
        else:
            self.changes.append(VersionChange(at_token=self.sampled(), policy_version=version))

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._admission._leave(self)


class Admission:
    def __init__(self, version: int | None = None) -> None:
        self.version = version
        self.in_flight = 0
        self._live: set[Ticket] = set()
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
        ticket = Ticket(self)
        self._live.add(ticket)
        return ticket

    def _leave(self, ticket: Ticket) -> None:
        self._live.discard(ticket)
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()

    async def pause(self, timeout_s: float, keep: bool = False) -> AdmissionState:
        self._open.clear()
        if keep:  # the engine keeps in-flight generations paused and resumes them under the new weights
            return self.state(drained=self.in_flight == 0, waited_s=0.0)
        t0 = time.monotonic()
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
            drained = True
        except TimeoutError:
            drained = False
        return self.state(drained=drained, waited_s=time.monotonic() - t0)

    def resume(self, policy_version: int | None = None) -> AdmissionState:
        if policy_version is not None and policy_version != self.version:
            self.version = policy_version
            for ticket in self._live:
                ticket.version_changed(policy_version)
        self._open.set()
        return self.state()

    def state(self, **extra: object) -> AdmissionState:
        return AdmissionState(paused=self.paused, policy_version=self.version, in_flight=self.in_flight, **extra)  # type: ignore[arg-type]
