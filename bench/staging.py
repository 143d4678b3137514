"""Engine busy fraction: serially staged sessions vs the gateway's pipelined stages, on the same real engine.

Both sides run ``--slots`` sessions at a time. Each simulated session spends ``--init`` seconds preparing its
runtime (INIT), ``--run`` seconds as a harness calling the engine back to back (RUN: real generations), and
``--eval`` seconds grading (POSTRUN). Serially, the engine idles through every INIT and POSTRUN; the gateway (its
real pools and queues, with these three stage bodies) overlaps them with other sessions' RUN. The engine is busy
while at least one generation is in flight. The last line is the pipelined busy fraction.

    python -m bench.staging [--sessions 24] [--slots 2] [--init 1.0] [--run 3.0] [--eval 1.0]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import threading
import time
from pathlib import Path

import httpx

from bench.common import engine
from nemo_polar.env.attempt import AttemptDir
from nemo_polar.env.gateway import Gateway, GatewayConfig, SessionRequest
from nemo_polar.env.session import SessionResult
from nemo_polar.proxy.client import ProxyClient
from nemo_polar.rewards import bundled_instances
from nemo_polar.rewards.grader import GradeResult


class Busy:
    """Union of the intervals during which at least one engine generation was in flight."""

    def __init__(self) -> None:
        self.active = 0
        self.since = 0.0
        self.total = 0.0

    def enter(self) -> None:
        if self.active == 0:
            self.since = time.monotonic()
        self.active += 1

    def leave(self) -> None:
        self.active -= 1
        if self.active == 0:
            self.total += time.monotonic() - self.since


class Workload:
    def __init__(self, engine_url: str, init_s: float, run_s: float, eval_s: float) -> None:
        self.url, self.init_s, self.run_s, self.eval_s = engine_url, init_s, run_s, eval_s
        self.busy = Busy()
        self.model = httpx.get(f"{engine_url}/v1/models").json()["data"][0]["id"]

    def init(self) -> None:
        time.sleep(self.init_s)

    def run(self) -> None:
        with httpx.Client(timeout=60) as client:
            end = time.monotonic() + self.run_s
            while time.monotonic() < end:
                body = {"model": self.model, "prompt": "def main():", "max_tokens": 16, "ignore_eos": True}
                self.busy.enter()
                try:
                    client.post(f"{self.url}/v1/completions", json=body).raise_for_status()
                finally:
                    self.busy.leave()

    def evaluate(self) -> None:
        time.sleep(self.eval_s)


class _Graded:
    def __init__(self, work: Workload) -> None:
        self.work = work

    def grade(self, patch: str) -> GradeResult:
        self.work.evaluate()
        return GradeResult(instance_id="sim", reward=1.0, resolved=True, status="resolved", mask_sample=False)

    def close(self) -> None:
        pass


class SimulatedGateway(Gateway):
    """The real gateway's pools and queues with simulated stage bodies."""

    work: Workload

    def prepare(self, request: SessionRequest, attempt: AttemptDir) -> _Graded:
        self.work.init()
        return _Graded(self.work)

    def run_harness(
        self, request: SessionRequest, attempt: AttemptDir, budget: float, cancel: threading.Event
    ) -> SessionResult:
        self.work.run()
        return SessionResult(
            session_id=request.request_id, harness="sim", harness_version="0", runtime="sim",
            instance_id="sim", status="completed", exit_code=0, session_dir=attempt.root,
        )  # fmt: skip


def serial(work: Workload, sessions: int) -> float:
    t0 = time.monotonic()
    for _ in range(sessions):
        work.init()
        work.run()
        work.evaluate()
    return time.monotonic() - t0


async def pipelined(work: Workload, sessions: int, state: Path) -> float:
    gw = SimulatedGateway(
        GatewayConfig(state_dir=state, init_workers=2, run_slots=1, post_workers=2), ProxyClient(url="", admin_url="")
    )
    gw.work = work
    inst = bundled_instances()[0]
    t0 = time.monotonic()
    async with gw:
        futures = [
            await gw.submit(SessionRequest(request_id=f"s{i}", harness="pi", instance=inst)) for i in range(sessions)
        ]
        await asyncio.gather(*futures)
    return time.monotonic() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=24)
    parser.add_argument("--init", type=float, default=1.0)
    parser.add_argument("--run", type=float, default=3.0)
    parser.add_argument("--eval", type=float, default=1.0)
    parser.add_argument("--slots", type=int, default=2, help="sessions in RUN at once, the same on both sides")
    args = parser.parse_args()
    with engine() as url, tempfile.TemporaryDirectory(prefix="polar-bench-staging-") as tmp:
        fractions = {}
        for name in ("serial", "pipelined"):
            work = Workload(url, args.init, args.run, args.eval)
            wall = (
                serial(work, args.sessions)
                if name == "serial"
                else asyncio.run(pipelined(work, args.sessions, Path(tmp)))
            )
            fractions[name] = work.busy.total / wall
            print(f"{name:<10} {args.sessions} sessions in {wall:5.1f} s, engine busy {work.busy.total:5.1f} s")
    print(
        f"stage times: init {args.init} s, run {args.run} s, eval {args.eval} s; {args.slots} sessions in RUN at once"
    )
    print(f"engine busy fraction: serial {fractions['serial']:.1%}, pipelined {fractions['pipelined']:.1%}")


if __name__ == "__main__":
    main()
