"""What a real CLI session costs: scripted sessions of a real coding CLI (default Pi) on the bundled SWE tasks,
through the rollout gateway, a real proxy and the real engine, graded by swebench — bwrap vs docker.

Per runtime: session setup (sandbox start, proxy session, CLI config; ``setup_s`` of each session) p50, peak
resident memory of one agent sandbox (sampled every 0.2 s: the processes of each agent sandbox — bwrap's tree, or
the container's cgroup — not the grader's), sessions per minute at 1, 2 and 4 run slots,
and the engine busy fraction (the share of samples where vLLM reports a request running). The scripted policy makes
the CLI's turns deterministic; the CLI, sandbox, proxy, engine and grader are all real. The last line compares
sessions per minute at the most run slots.

    python -m bench.cli_sessions [--harness pi] [--sessions 6] [--slots 1 2 4] [--runtimes bwrap docker]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

from bench.common import engine, proxy, report
from nemo_polar.env.gateway import Gateway, GatewayConfig, SessionRequest
from nemo_polar.env.harness.base import HARNESS_MOUNT
from nemo_polar.proxy.http.client import ProxyClient
from nemo_polar.rewards import bundled_instances
from nemo_polar.sandbox.docker import LABEL, docker_client

RUNNING = re.compile(r"^vllm:num_requests_running\{[^}]*\} ([0-9.e+]+)$", re.M)


def _rss(p: psutil.Process) -> int:
    try:
        return p.memory_info().rss
    except psutil.Error:  # it exited between the listing and the reading
        return 0


def agent_sandboxes_rss(runtime: str) -> list[int]:
    """Resident memory of each agent sandbox (it mounts the harness; the grader's sandboxes do not): a bwrap
    sandbox's process tree, or every process in the container's cgroup (``docker exec`` processes are not children
    of the container's init)."""
    if runtime == "docker":
        ids = [
            c.id
            for c in docker_client().containers.list(filters={"label": LABEL})
            if any(m.get("Destination") == HARNESS_MOUNT for m in c.attrs.get("Mounts", []))
        ]
        totals = dict.fromkeys(ids, 0)
        for p in psutil.process_iter():
            try:
                cgroup = Path(f"/proc/{p.pid}/cgroup").read_text()
            except OSError:
                continue
            for cid in ids:
                if cid in cgroup:
                    totals[cid] += _rss(p)
        return list(totals.values())
    roots = []
    for p in psutil.process_iter(["name", "cmdline", "ppid"]):
        if p.info["name"] == "bwrap" and HARNESS_MOUNT in (p.info["cmdline"] or []):
            roots.append(p)
    pids = {r.pid for r in roots}
    outer = [r for r in roots if r.info["ppid"] not in pids]  # the outermost bwrap of each sandbox
    sizes = []
    for root in outer:
        try:
            tree = [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        sizes.append(sum(_rss(p) for p in tree))
    return sizes


class Sampler:
    """Polls the agent sandboxes' memory and the engine's running requests until stopped."""

    def __init__(self, runtime: str, engine_url: str) -> None:
        self.runtime, self.metrics_url = runtime, f"{engine_url}/metrics"
        self.peak_per_session = 0.0
        self.busy = self.samples = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def loop(self) -> None:
        with httpx.Client(timeout=5) as client:
            while not self.stop.wait(0.2):
                sizes = [x for x in agent_sandboxes_rss(self.runtime) if x]
                if sizes:
                    self.peak_per_session = max(self.peak_per_session, max(sizes))
                try:
                    running = sum(float(v) for v in RUNNING.findall(client.get(self.metrics_url).text))
                except httpx.HTTPError:
                    continue
                self.samples += 1
                self.busy += running > 0


async def batch(proxy_client: ProxyClient, runtime: str, slots: int, sessions: int, harness: str, state: Path) -> float:
    config = GatewayConfig(state_dir=state, runtime=runtime, run_slots=slots, init_workers=2, post_workers=2)
    instances = [i for i in bundled_instances() if i.script]
    t0 = time.monotonic()
    async with Gateway(config, proxy_client) as gw:
        futures = [
            await gw.submit(
                SessionRequest(
                    request_id=f"{runtime}-{slots}-{k}", harness=harness, instance=instances[k % len(instances)],
                    scripted=True,
                )
            )
            for k in range(sessions)
        ]  # fmt: skip
        outcomes = await asyncio.gather(*futures)
    wall = time.monotonic() - t0
    bad = [o for o in outcomes if not o.verdict.trainable]
    assert not bad, [(o.request_id, o.verdict.kind, o.verdict.reason) for o in bad]
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--harness", default="pi")
    parser.add_argument("--sessions", type=int, default=6, help="per runtime and slot count")
    parser.add_argument("--slots", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--runtimes", nargs="+", default=["bwrap", "docker"])
    args = parser.parse_args()
    figures: dict[str, float] = {}
    info: dict[str, object] = {}
    with engine() as url, proxy(url, info) as proxy_client, tempfile.TemporaryDirectory(prefix="polar-cli-") as tmp:  # type: ignore[arg-type]
        for slots in args.slots:
            for runtime in args.runtimes:  # interleaved: both runtimes meet the machine at each slot count
                sampler = Sampler(runtime, url)
                sampler.thread.start()
                state = Path(tmp) / f"{runtime}-{slots}"
                try:
                    wall = asyncio.run(batch(proxy_client, runtime, slots, args.sessions, args.harness, state))
                finally:
                    sampler.stop.set()
                    sampler.thread.join()
                setups = [float(json.loads(p.read_text())["timings"]["setup_s"]) for p in state.glob("*/session.json")]
                key = f"{runtime}_{slots}"
                figures[f"{key}_sessions_per_min"] = 60 * args.sessions / wall
                figures[f"{key}_setup_p50_s"] = statistics.median(setups)
                figures[f"{key}_peak_rss_mb"] = sampler.peak_per_session / 2**20
                figures[f"{key}_engine_busy"] = sampler.busy / max(sampler.samples, 1)
                print(
                    f"{runtime:<6} {slots} slots: {figures[f'{key}_sessions_per_min']:5.1f} sessions/min, setup p50 "
                    f"{figures[f'{key}_setup_p50_s']:.2f} s, peak RSS {figures[f'{key}_peak_rss_mb']:.0f} MB/session, "
                    f"engine busy {figures[f'{key}_engine_busy']:.0%}",
                    flush=True,
                )
    top = max(args.slots)
    line = ", ".join(
        f"{rt} {figures[f'{rt}_{top}_sessions_per_min']:.1f}/min (setup {figures[f'{rt}_{top}_setup_p50_s']:.2f} s, "
        f"{figures[f'{rt}_{top}_peak_rss_mb']:.0f} MB)"
        for rt in args.runtimes
    )
    report("cli_sessions", figures, f"{args.harness} sessions at {top} run slots: {line}")


if __name__ == "__main__":
    main()
