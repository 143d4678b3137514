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

import httpx

from bench.common import engine, proxy
from nemo_polar.env.gateway import Gateway, GatewayConfig, SessionRequest, _Job
from nemo_polar.env.session import ProxyClient, SessionResult
from nemo_polar.rewards import bundled_instances
from nemo_polar.rewards.grader import GradeResult


class _Instant:
    def grade(self, patch: str) -> GradeResult:
        return GradeResult(instance_id="cap", reward=1.0, resolved=True, status="resolved", mask_sample=False)

    def close(self) -> None:
        pass


class CapacityGateway(Gateway):
    turns: int

    def _prepare(self, job: _Job) -> _Instant:  # type: ignore[override]
        return _Instant()

    def _run_harness(self, job: _Job, budget: float) -> SessionResult:
        session_id, key = self.proxy.create_session({"sampling_overrides": {"max_tokens": 8}})
        history = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "Fix it."}]
        with httpx.Client(base_url=f"{self.proxy.url}/v1", timeout=600) as client:
            for turn in range(self.turns):
                body = {"model": "local-model", "messages": history, "stream": turn % 2 == 0}
                resp = client.post("/chat/completions", json=body, headers={"authorization": f"Bearer {key}"})
                resp.raise_for_status()
                text = _content(resp)
                history += [{"role": "assistant", "content": text}, {"role": "user", "content": f"result {turn}"}]
        records = self.proxy.records(session_id)
        return SessionResult(
            session_id=session_id, harness="light", harness_version="0", runtime="none", instance_id="cap",
            status="completed", exit_code=0, session_dir=job.dir, records=records, calls=len(records),
        )  # fmt: skip


def _content(resp: httpx.Response) -> str:
    if resp.headers.get("content-type", "").startswith("text/event-stream"):
        parts = []
        for line in resp.text.splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for choice in json.loads(line[6:]).get("choices", []):
                    parts.append(choice.get("delta", {}).get("content") or "")
        return "".join(parts)
    return resp.json()["choices"][0]["message"]["content"] or ""


async def run(proxy_url: str, sessions: int, turns: int, state: Path) -> tuple[float, list[str]]:
    config = GatewayConfig(state_dir=state, init_workers=8, run_slots=sessions, post_workers=8, ready_buffer=sessions)
    gw = CapacityGateway(config, ProxyClient(url=proxy_url))
    gw.turns = turns
    inst = bundled_instances()[0]
    t0 = time.monotonic()
    async with gw:
        futures = [
            await gw.submit(SessionRequest(request_id=f"c{i}", harness="light", instance=inst)) for i in range(sessions)
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
    with engine() as url, proxy(url, cpu) as proxy_url, tempfile.TemporaryDirectory(prefix="polar-cap-") as tmp:
        wall, statuses = asyncio.run(run(proxy_url, args.sessions, args.turns, Path(tmp)))
        record_dir = Path(cpu["record_dir"])  # type: ignore[arg-type]
        lines = [json.loads(line) for p in record_dir.glob("*.jsonl") for line in p.read_text().splitlines()]
    complete = sum(1 for r in lines if r["complete"])
    expected = args.sessions * args.turns
    print(f"sessions: {statuses.count('published')}/{args.sessions} published in {wall:.1f} s")
    print(f"records: {len(lines)} written, {complete} complete, {expected} calls made")
    print(f"concurrent sessions sustained: {statuses.count('published')}, lost records: {expected - complete}")


if __name__ == "__main__":
    main()
