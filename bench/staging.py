"""Engine busy fraction: serially staged sessions vs the gateway's pipelined stages, on the same real engine.

Both sides run ``--slots`` sessions at a time. Each session spends ``--init`` seconds preparing its runtime (INIT,
simulated: a sleep), ``--run`` seconds as a harness calling the engine back to back (RUN: real generations on the
real engine), and ``--eval`` seconds grading (POSTRUN, simulated: a sleep). Serially, each of the ``--slots``
workers stages its sessions one after another, so the engine idles whenever every worker is in INIT or POSTRUN;
the gateway (its real pools and queues, ``run_slots = --slots``, with these stage bodies) overlaps them with other
sessions' RUN. The engine is busy while at least one generation is in flight. The two arms alternate in
``--rounds`` rounds (they cannot share the engine at once without measuring each other), so both meet the same
machine. The last line is the pipelined busy fraction.

    python -m bench.staging [--sessions 24] [--slots 2] [--rounds 2] [--init 1.0] [--run 3.0] [--eval 1.0]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import threading
import time
from pathlib import Path

import httpx

from bench.common import engine, report
from nemo_polar.env.gateway import Gateway, GatewayConfig, SessionRequest
from nemo_polar.env.runtime.attempt import AttemptDir
from nemo_polar.env.runtime.session import SessionResult
from nemo_polar.proxy.http.client import ProxyClient
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


def serial(work: Workload, sessions: int, slots: int) -> float:
    """``slots`` workers, each staging its share of the sessions one after another."""

    def worker(n: int) -> None:
        for _ in range(n):
            work.init()
            work.run()
            work.evaluate()

    shares = [sessions // slots + (1 if i < sessions % slots else 0) for i in range(slots)]
    threads = [threading.Thread(target=worker, args=(n,)) for n in shares]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.monotonic() - t0


async def pipelined(work: Workload, sessions: int, slots: int, state: Path) -> float:
    config = GatewayConfig(state_dir=state, init_workers=2, run_slots=slots, post_workers=2, ready_buffer=slots)
    gw = SimulatedGateway(config, ProxyClient(url="", admin_url=""))
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
    parser.add_argument("--sessions", type=int, default=24, help="per arm, over all rounds")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--init", type=float, default=1.0)
    parser.add_argument("--run", type=float, default=3.0)
    parser.add_argument("--eval", type=float, default=1.0)
    parser.add_argument("--slots", type=int, default=2, help="sessions in RUN at once, the same on both sides")
    args = parser.parse_args()
    per_round = max(args.sessions // args.rounds, 1)
    busy = {"serial": 0.0, "pipelined": 0.0}
    wall = {"serial": 0.0, "pipelined": 0.0}
    with engine() as url, tempfile.TemporaryDirectory(prefix="polar-bench-staging-") as tmp:
        for r in range(args.rounds):
            for name in ("serial", "pipelined") if r % 2 == 0 else ("pipelined", "serial"):
                work = Workload(url, args.init, args.run, args.eval)
                if name == "serial":
                    took = serial(work, per_round, args.slots)
                else:
                    took = asyncio.run(pipelined(work, per_round, args.slots, Path(tmp) / f"r{r}"))
                busy[name] += work.busy.total
                wall[name] += took
                print(
                    f"round {r} {name:<10} {per_round} sessions in {took:5.1f} s, engine busy {work.busy.total:5.1f} s"
                )
    fractions = {name: busy[name] / wall[name] for name in busy}
    print(
        f"stage times: INIT {args.init} s (simulated: sleep), RUN {args.run} s (real generations), "
        f"POSTRUN {args.eval} s (simulated: sleep); {args.slots} sessions in RUN at once on both sides"
    )
    report(
        "staging",
        {"slots": args.slots, "serial_busy": fractions["serial"], "pipelined_busy": fractions["pipelined"]},
        f"engine busy fraction at {args.slots} run slots: serial {fractions['serial']:.1%}, "
        f"pipelined {fractions['pipelined']:.1%}",
    )


if __name__ == "__main__":
    main()
