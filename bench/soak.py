"""Soak: thousands of sessions through one gateway and one proxy, and whether either process keeps growing.

Lightweight sessions (``ChatLoopGateway``: a real proxy session, ``--turns`` real chat calls to the real engine,
its records fetched and the session closed, an instant grade) are fed to one gateway with ``--window`` of them
unfinished at a time, in GRPO groups of ``--group`` (group bookkeeping included), the way a long training run feeds
it. Resident memory (``VmRSS`` from ``/proc``) of the gateway's process (this one) and of the proxy's (a separate
``polar proxy`` process) is read at ``--baseline`` finished sessions and at the end; everything in between is
steady state, so a store that keeps finished sessions shows up as growth. The last line is the growth from the
baseline to the end; ``flat`` means under ``--flat`` percent for both processes.

    python -m bench.soak [--sessions 5000] [--baseline 1000] [--turns 2] [--max-tokens 4] [--window 16]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import tempfile
import time
from pathlib import Path

from bench.common import cpu_seconds, engine, proxy, report, rss_mb
from nemo_polar.env.gateway import GatewayConfig, SessionOutcome, SessionRequest
from nemo_polar.env.gateway.testing import ChatLoopGateway
from nemo_polar.proxy.http.client import ProxyClient
from nemo_polar.rewards import bundled_instances


class Soak:
    def __init__(self, args: argparse.Namespace, proxy_client: ProxyClient, proxy_pid: int, state: Path) -> None:
        self.args, self.proxy_client, self.proxy_pid, self.state = args, proxy_client, proxy_pid, state
        self.rss: dict[str, tuple[float, float]] = {}  # checkpoint -> (gateway MB, proxy MB)
        self.statuses: dict[str, int] = {}
        self.calls = 0

    def sample(self, name: str, done: int, t0: float) -> None:
        gc.collect()  # the figure is what stays alive, not garbage awaiting a collection
        self.rss[name] = (rss_mb(), rss_mb(self.proxy_pid))
        gw_mb, px_mb = self.rss[name]
        rate = done / max(time.monotonic() - t0, 1e-9)
        print(f"{done:>6} sessions ({rate:4.1f}/s): gateway RSS {gw_mb:6.1f} MB, proxy RSS {px_mb:6.1f} MB", flush=True)

    async def run(self) -> float:
        a = self.args
        config = GatewayConfig(
            state_dir=self.state, init_workers=2, run_slots=a.window, post_workers=2, ready_buffer=a.window
        )
        gw = ChatLoopGateway(config, self.proxy_client)
        inst = bundled_instances()[0]
        options = {"turns": a.turns, "max_tokens": a.max_tokens}
        pending: set[asyncio.Future[SessionOutcome]] = set()
        done = submitted = 0
        t0 = time.monotonic()
        async with gw:
            while done < a.sessions:
                while submitted < a.sessions and len(pending) < a.window:
                    request = SessionRequest(
                        request_id=f"s{submitted}",
                        harness="chat_loop",
                        instance=inst,
                        harness_options=options,
                        group_id=f"g{submitted // a.group}",
                        group_needed=a.group,
                    )
                    pending.add(await gw.submit(request))
                    submitted += 1
                finished, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for fut in finished:
                    outcome = fut.result()
                    self.statuses[outcome.status] = self.statuses.get(outcome.status, 0) + 1
                    self.calls += outcome.metrics.get("calls", 0)
                    done += 1
                    if done == a.baseline or done % a.every == 0 or done == a.sessions:
                        self.sample("baseline" if done == a.baseline else "end", done, t0)
            left = len(gw.jobs)
        wall = time.monotonic() - t0
        print(f"gateway: {left} jobs held after the run; proxy /health: {self.proxy_client.health()}")
        return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=5000)
    parser.add_argument("--baseline", type=int, default=1000, help="finished sessions at the baseline RSS reading")
    parser.add_argument("--every", type=int, default=1000, help="print RSS every N finished sessions")
    parser.add_argument("--turns", type=int, default=2, help="chat calls per session (every second one streams)")
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--window", type=int, default=16, help="unfinished sessions at a time (= run slots)")
    parser.add_argument("--group", type=int, default=4, help="sessions per GRPO group (group_needed = group)")
    parser.add_argument("--flat", type=float, default=10.0, help="growth threshold in percent")
    args = parser.parse_args()
    if not 0 < args.baseline < args.sessions:
        parser.error("--baseline must be between 0 and --sessions")
    cpu: dict[str, float] = {}
    with engine() as url, proxy(url, cpu) as client, tempfile.TemporaryDirectory(prefix="polar-soak-") as tmp:
        pooled_client = client
        soak = Soak(args, pooled_client, int(cpu["proxy_pid"]), Path(tmp))
        cpu0 = (cpu_seconds(os.getpid()), cpu_seconds(soak.proxy_pid))
        wall = asyncio.run(soak.run())
        cpu1 = (cpu_seconds(os.getpid()), cpu_seconds(soak.proxy_pid))
        record_dir = Path(cpu["record_dir"])  # type: ignore[arg-type]
        complete = sum(
            json.loads(line)["complete"] for p in record_dir.glob("*.jsonl") for line in p.read_text().splitlines()
        )
    expected = args.sessions * args.turns
    print(f"{args.sessions} sessions x {args.turns} calls in {wall:.0f} s ({args.sessions / wall:.1f} sessions/s)")
    per = [1000 * (b - a) / args.sessions for a, b in zip(cpu0, cpu1, strict=True)]
    print(f"CPU per session: gateway process {per[0]:.0f} ms, proxy process {per[1]:.0f} ms")
    print(f"outcomes: {soak.statuses}; records: {complete}/{expected} complete on disk ({soak.calls} in outcomes)")
    growth = []
    for i, name in enumerate(("gateway", "proxy")):
        base, end = soak.rss["baseline"][i], soak.rss["end"][i]
        growth.append((name, end - base, 100 * (end - base) / base))
    verdict = "flat" if all(pct < args.flat for _, _, pct in growth) else "GROWING"
    span = args.sessions - args.baseline
    figures = ", ".join(
        f"{name} {mb:+.1f} MB ({pct:+.1f}%, {1024 * mb / span:+.2f} KB/session)" for name, mb, pct in growth
    )
    report(
        "soak",
        {"sessions": args.sessions, **{f"{name}_growth_pct": pct for name, _, pct in growth}},
        f"RSS growth from {args.baseline} to {args.sessions} sessions: {figures} -> {verdict} (threshold {args.flat}%)",
    )


if __name__ == "__main__":
    main()
