"""Gateway capacity: how many concurrent sessions one gateway process sustains on this machine, with lightweight
harness sessions (a small agent loop of chat calls through a real proxy session to the real engine, instead of a
Node CLI per session), and whether any record is lost. Every session is in RUN at once; each makes ``--turns``
calls with a tool-result turn in between. Records are counted from the proxy's durable record files.

    python -m bench.capacity [--sessions 256] [--turns 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

from bench.common import engine, proxy
from nemo_polar.env.gateway import GatewayConfig, SessionRequest
from nemo_polar.env.gateway.testing import ChatLoopGateway
from nemo_polar.proxy.client import ProxyClient
from nemo_polar.rewards import bundled_instances


async def run(proxy_client: ProxyClient, sessions: int, turns: int, state: Path) -> tuple[float, list[str]]:
    config = GatewayConfig(state_dir=state, init_workers=8, run_slots=sessions, post_workers=8, ready_buffer=sessions)
    gw = ChatLoopGateway(config, proxy_client)
    inst = bundled_instances()[0]
    options = {"turns": turns, "max_tokens": 8}
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
    print(f"peak sessions in RUN at once: {peak}")
    return time.monotonic() - t0, [o.status for o in outcomes]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=256)
    parser.add_argument("--turns", type=int, default=3)
    args = parser.parse_args()
    cpu: dict[str, float] = {}
    with engine() as url, proxy(url, cpu) as proxy_client, tempfile.TemporaryDirectory(prefix="polar-cap-") as tmp:
        wall, statuses = asyncio.run(run(proxy_client, args.sessions, args.turns, Path(tmp)))
        record_dir = Path(cpu["record_dir"])  # type: ignore[arg-type]
        lines = [json.loads(line) for p in record_dir.glob("*.jsonl") for line in p.read_text().splitlines()]
    complete = sum(1 for r in lines if r["complete"])
    expected = args.sessions * args.turns
    print(f"sessions: {statuses.count('published')}/{args.sessions} published in {wall:.1f} s")
    print(f"records: {len(lines)} written, {complete} complete, {expected} calls made")
    print(f"concurrent sessions sustained: {statuses.count('published')}, lost records: {expected - complete}")


if __name__ == "__main__":
    main()
