"""Proxy worker processes side by side: sustained calls/s of ``--sessions`` concurrent sessions at 32k-token contexts
through one worker process and through two (``ProxyWorkers``: each a whole proxy, the sessions split between them
by the pool), in blocks of the same number of calls alternating ABBA, so both arms meet the same machine and the
same histories. The engine is a stub (vLLM's answers in shape, the prompt's ids echoed, no model work), so the figure
is the proxy's own; the load generator (this process: a keep-alive connection per session, as a harness holds one)
and the stub engine (a process of its own) run on the same cores as the workers, and the CPU each side took is
printed beside the rates. The last line is the ratio.

    python -m bench.proxy_workers [--sessions 256] [--context 32768] [--blocks 8] [--calls 4000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import cast
from urllib.parse import urlsplit

import httptools
import uvloop

from bench.common import cpu_seconds, report
from bench.session_scale import stub_engine_process, tool_output
from nemo_polar.proxy import fastjson
from nemo_polar.proxy.http.config import ProxyConfig
from nemo_polar.proxy.http.pool import ProxyPool
from nemo_polar.proxy.http.workers import ProxyWorkers


class Arm:
    """One pool of worker processes and its sessions' histories, already at the context."""

    def __init__(self, name: str, workers: ProxyWorkers, sessions: int, context: int) -> None:
        self.name, self.workers, self.pool = name, workers, workers.pool
        rng = random.Random(1)
        opened = [_open(self.pool) for _ in range(sessions)]
        self.targets = [(worker_url, key) for worker_url, key in opened]
        # Each history's messages as the JSON a harness sends, less the closing bracket: a call appends its turns'
        # JSON, so the load generator's work per call stays what the call adds
        self.histories = [
            bytearray(
                fastjson.dumps(
                    [
                        {"role": "system", "content": "You are a coding agent."},
                        {"role": "user", "content": tool_output(rng, context)},
                    ]
                )[:-1]
            )
            for _ in range(sessions)
        ]
        # Each session's request line and headers, less its length; its connection once the measuring loop runs
        self.heads = [
            f"POST /v1/chat/completions HTTP/1.1\r\nhost: {urlsplit(url).netloc}\r\nauthorization: Bearer {key}\r\n"
            "content-type: application/json\r\n".encode()
            for url, key in self.targets
        ]
        self.connections: list[Connection] = []
        self.rates: list[float] = []
        self.block_ms: list[float] = []  # the workers' CPU per call in each block
        self.cpu_s = self.wall_s = 0.0
        self.calls = 0
        self.machine = [0, 0]  # the machine's busy and all clock ticks during the arm's timed blocks (drains not)

    def pids(self) -> list[int]:
        return [r.pid for r in self.workers.ready]


def cpu_times() -> tuple[int, int]:
    """The machine's CPU time so far, in clock ticks: busy (everything but idle and I/O wait) and in all."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)


def _open(pool: ProxyPool) -> tuple[str, str]:
    _, key, worker = pool.create_session({"mode": "continuation"})
    return worker.url, key


class Connection(asyncio.Protocol):
    """One session's keep-alive HTTP/1.1 connection to its worker, the answers read by httptools' parser (uvicorn's):
    the load generator shares the workers' cores, and aiohttp's client took ~0.5 ms of CPU a call, this ~0.15."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.body: list[bytes] = []
        self.answer: asyncio.Future[tuple[int, bytes]] | None = None
        self.transport: asyncio.Transport | None = None

    @classmethod
    async def open(cls, url: str) -> Connection:
        where = urlsplit(url)
        _, connection = await asyncio.get_running_loop().create_connection(cls, where.hostname, where.port)
        return connection

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not asyncio's classes

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:  # an answer that is not HTTP: the call fails rather than wait
            self.connection_lost(exc)

    def on_body(self, chunk: bytes) -> None:
        self.body.append(chunk)

    def on_message_complete(self) -> None:
        if self.answer is not None and not self.answer.done():
            self.answer.set_result((self.parser.get_status_code(), b"".join(self.body)))

    def connection_lost(self, exc: Exception | None) -> None:
        if self.answer is not None and not self.answer.done():
            self.answer.set_exception(ConnectionError(f"the worker closed the connection: {exc!r}"))

    async def post(self, head: bytes, *body: bytes) -> bytes:
        if self.transport is None or self.transport.is_closing():
            raise ConnectionError("the worker closed the connection before this call")
        self.body, self.answer = [], asyncio.get_running_loop().create_future()
        size = sum(len(part) for part in body)
        self.transport.writelines([head, b"content-length: %d\r\n\r\n" % size, *body])
        status, answer = await self.answer
        if status != 200:
            raise RuntimeError(f"the worker answered {status}: {answer[:300]!r}")
        return answer


async def _call(arm: Arm, i: int) -> None:
    connection, head = arm.connections[i], arm.heads[i]
    answer = await connection.post(head, b'{"model":"local-model","max_tokens":16,"messages":', arm.histories[i], b"]}")
    reply = fastjson.loads(answer)["choices"][0]["message"]["content"]
    turns = [{"role": "assistant", "content": reply}, {"role": "user", "content": "ok, next"}]
    arm.histories[i] += b"," + fastjson.dumps(turns)[1:-1]


async def _block(arm: Arm, calls: int) -> tuple[float, list[int], int]:
    """Every session calls again as soon as its call returns, each on its own (no round waits for the slowest
    session), until ``calls`` calls are answered: the seconds that took, the machine's busy and all clock ticks over
    them, and the calls answered in all. The calls in flight then finish, untimed, before it returns,
    so blocks do not overlap. Every arm does the same work: a block of fixed length would hand the faster arm more
    calls, and so longer histories in its later blocks."""
    t0, ticks0 = time.perf_counter(), cpu_times()
    done, took, ticks = 0, 0.0, [0, 0]

    async def session(i: int) -> None:
        nonlocal done, took, ticks
        while done < calls:
            await _call(arm, i)
            done += 1
            if done == calls:
                took, ticks = time.perf_counter() - t0, [a - b for a, b in zip(cpu_times(), ticks0, strict=True)]

    await asyncio.gather(*(session(i) for i in range(len(arm.targets))))
    return took, ticks, done


async def measure(arms: list[Arm], blocks: int, calls: int, stub: int) -> tuple[dict[str, float], list[float]]:
    """Each arm warmed, then ``blocks`` blocks each, ABBA; the CPU this process and the stub engine (``stub``, its
    pid) and each arm's workers took during the timed blocks."""
    busy = {"wall": 0.0, "client": 0.0, "stub": 0.0}
    load_ms: list[float] = []  # the load side's CPU per call in each block, in the order they ran

    def load() -> tuple[float, float]:
        return cpu_seconds(os.getpid()), cpu_seconds(stub)

    for arm in arms:
        arm.connections = [await Connection.open(url) for url, _ in arm.targets]
    try:
        for arm in arms:  # warmed: the first calls render whole histories, and one untimed block settles what follows
            await asyncio.gather(*(_call(arm, i) for i in range(len(arm.targets))))
            await _block(arm, calls)
        for block in range(blocks):
            for arm in arms if block % 4 in (0, 3) else arms[::-1]:
                cpu0, load0 = sum(cpu_seconds(p) for p in arm.pids()), load()
                t0 = time.perf_counter()
                took, ticks, answered = await _block(arm, calls)
                arm.machine = [arm.machine[0] + ticks[0], arm.machine[1] + ticks[1]]
                wall = time.perf_counter() - t0  # the block and the drain of the calls in flight at its end
                arm.rates.append(calls / took)
                cpu = sum(cpu_seconds(p) for p in arm.pids()) - cpu0
                arm.block_ms.append(1000 * cpu / max(answered, 1))
                arm.cpu_s += cpu
                arm.calls += answered
                arm.wall_s += wall
                busy["wall"] += wall
                (client1, stub1), (client0, stub0) = load(), load0
                busy["client"] += client1 - client0
                busy["stub"] += stub1 - stub0
                load_ms.append(1000 * (client1 - client0 + stub1 - stub0) / max(answered, 1))
    finally:
        for arm in arms:
            for connection in arm.connections:
                connection.close()
    return busy, load_ms


def _arms(stack: ExitStack, engine_url: str, counts: list[int], sessions: int, context: int) -> Iterator[Arm]:
    for count in counts:
        record_dir = Path(tempfile.mkdtemp(prefix=f"polar-bench-workers{count}-"))
        config = ProxyConfig(
            engine_url=engine_url, record_dir=record_dir, model_aliases=["local-model"], freeze_heap=True
        )
        workers = stack.enter_context(ProxyWorkers(config, count))
        yield Arm(f"{count} worker{'s' * (count > 1)}", workers, sessions, context)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=256)
    parser.add_argument("--context", type=int, default=32768)
    parser.add_argument("--workers", type=int, nargs=2, default=[1, 2], help="the two arms' worker counts")
    parser.add_argument("--blocks", type=int, default=8, help="timed blocks per arm (ABBA)")
    parser.add_argument("--calls", type=int, default=4000, help="calls answered in a timed block")
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    with stub_engine_process() as stub, ExitStack() as stack:
        arms = list(_arms(stack, stub.url, args.workers, args.sessions, args.context))
        busy, load_ms = uvloop.run(measure(arms, args.blocks, args.calls, stub.pid))  # the loop the proxy serves on
    figures: dict[str, float] = {}
    for arm in arms:
        mean = sum(arm.rates) / len(arm.rates)
        figures[f"calls_per_s_{len(arm.pids())}"] = mean
        rates, block_ms = (", ".join(f"{x:.1f}" for x in xs) for xs in (arm.rates, arm.block_ms))
        print(
            f"{arm.name}: {mean:.1f} calls/s (blocks {rates}), worker CPU {1000 * arm.cpu_s / arm.calls:.1f} ms/call "
            f"(blocks {block_ms}), the workers busy {arm.cpu_s / arm.wall_s:.2f} cores, the machine's cores "
            f"{100 * arm.machine[0] / arm.machine[1]:.0f}% (all processes, the kernel's network work included)"
        )
        figures[f"worker_cores_{len(arm.pids())}"] = arm.cpu_s / arm.wall_s
        figures[f"machine_busy_{len(arm.pids())}"] = arm.machine[0] / arm.machine[1]
    client_share, stub_share = (busy[side] / (busy["wall"] * cores) for side in ("client", "stub"))
    load_share = client_share + stub_share
    calls = sum(arm.calls for arm in arms)
    print(
        f"the load side per call: client {1000 * busy['client'] / calls:.2f} ms, stub engine "
        f"{1000 * busy['stub'] / calls:.2f} ms ({100 * client_share:.0f}% and {100 * stub_share:.0f}% of the cores); "
        f"both, block by block: {', '.join(f'{ms:.2f}' for ms in load_ms)}"
    )
    print(f"load average over the last 5 minutes: {os.getloadavg()[1]:.2f} on {cores} cores (all processes)")
    figures["load_generator_cpu_share"] = load_share
    (one, two), (n1, n2) = [figures[f"calls_per_s_{n}"] for n in args.workers], args.workers
    figures["ratio"] = two / one
    c1, c2 = (figures[f"worker_cores_{n}"] for n in args.workers)
    m1, m2 = (figures[f"machine_busy_{n}"] for n in args.workers)
    report(
        "proxy_workers",
        {k: round(v, 3) for k, v in figures.items()},
        f"sustained calls/s at {args.sessions} sessions of {args.context // 1024}k: {n1} worker {one:.1f}, {n2} "
        f"workers {two:.1f} ({two / one:.2f}x) on {cores} cores shared with the load generator and stub engine "
        f"({100 * load_share:.0f}% of them); the workers got {c1:.2f} and {c2:.2f} cores, the machine's cores were "
        f"{100 * m1:.0f}% and {100 * m2:.0f}% busy",
    )


if __name__ == "__main__":
    main()
