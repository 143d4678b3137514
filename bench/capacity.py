"""Gateway capacity: how many sessions one gateway process and one proxy hold in RUN at the same time on this
machine, with lightweight harness sessions (a small agent loop of chat calls through a real proxy session to the
real engine, instead of a Node CLI per session), and whether any record is lost. Each session makes ``--turns``
calls and waits ``--hold`` seconds after each (simulated tool time: a real agent spends most of its session in its
tools, which is what lets many sessions share one engine). The peak is sampled from the gateway's own stage depths;
records are counted from the proxy's durable record files. The last line is the peak and the lost records.

    python -m bench.capacity [--sessions 1000] [--turns 3] [--hold 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

from bench.common import engine, proxy, report
from nemo_polar.env.gateway import GatewayConfig, SessionOutcome, SessionRequest
from nemo_polar.env.gateway.testing import ChatLoopGateway
from nemo_polar.proxy.http.client import ProxyClient
from nemo_polar.rewards import bundled_instances


async def run(
    proxy_client: ProxyClient, sessions: int, turns: int, hold: float, state: Path
) -> tuple[float, int, list[SessionOutcome]]:
    config = GatewayConfig(state_dir=state, init_workers=8, run_slots=sessions, post_workers=8, ready_buffer=sessions)
    gw = ChatLoopGateway(config, proxy_client)
    inst = bundled_instances()[0]
    options = {"turns": turns, "max_tokens": 8, "hold_s": hold}
    t0 = time.monotonic()
    async with gw:
        futures = [
            await gw.submit(
                SessionRequest(request_id=f"c{i}", harness="chat_loop", instance=inst, harness_options=options)
            )
            for i in range(sessions)
        ]
        peak = 0
        while not all(f.done() for f in futures):
            peak = max(peak, gw.depths()["run"])
            await asyncio.sleep(0.05)
        outcomes = [f.result() for f in futures]
    for o in outcomes:
        if o.status != "published":
            print(f"{o.request_id}: {o.status} ({o.verdict.kind}): {o.verdict.reason}")
    return time.monotonic() - t0, peak, outcomes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--hold", type=float, default=4.0, help="seconds after each call (simulated tool time)")
    args = parser.parse_args()
    cpu: dict[str, float] = {}
    with engine() as url, proxy(url, cpu) as proxy_client, tempfile.TemporaryDirectory(prefix="polar-cap-") as tmp:
        wall, peak, outcomes = asyncio.run(run(proxy_client, args.sessions, args.turns, args.hold, Path(tmp)))
        record_dir = Path(cpu["record_dir"])  # type: ignore[arg-type]
        published = [o for o in outcomes if o.status == "published"]
        # Every call a published session made must be a complete record in its session's durable file.
        complete = 0
        for o in published:
            path = record_dir / f"{o.metrics['session_id']}.jsonl"
            lines = path.read_text().splitlines() if path.exists() else []
            complete += sum(1 for line in lines if json.loads(line)["complete"])
    expected = len(published) * args.turns
    print(f"sessions: {len(published)}/{args.sessions} published in {wall:.1f} s")
    print(f"records of published sessions: {complete} complete of {expected} calls made")
    report(
        "capacity",
        {
            "sessions": args.sessions,
            "published": len(published),
            "peak_in_run": peak,
            "lost_records": expected - complete,
        },
        f"peak sessions in RUN at once: {peak} of {args.sessions} ({len(published)} published), "
        f"lost records: {expected - complete}",
    )


if __name__ == "__main__":
    main()
