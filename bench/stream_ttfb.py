"""Streaming latency through the proxy vs straight from vLLM: time to the first **text** delta, the event a
harness shows and acts on (the first byte is not comparable: the proxy sends its own role/created event at once).

The same conversations stream from vLLM's chat API and through the proxy (continuation mode) over each provider
API a harness uses — Chat Completions, Responses, Messages — each pair submitted together so both see the same
load, the three APIs interleaved. ``--reps`` rounds of it: per API the p50, p95 and p99 of proxy/direct are the
median over the rounds, printed with their range. Then where a proxied call's time goes (request arrival to each
stage, from the records) and how late the proxy's event loop ran (its lag histogram). The last line is the worst
p50 and p95 ratios (targets ≤ 1.05× and ≤ 1.5×).

Engine and proxy share the 2 cores here, and vLLM's engine core and worker keep both busy: the proxy's ~1 ms of work
per request waits for a core. So the rounds alternate (ABBA) between the engine at its default priority and the
engine deprioritised as ``polar engine up --nice 10`` does (``set_niceness``: its autogroup and its threads); the
figures are for the latter, the deployment docs/proxy.md recommends for a CPU machine shared with the proxy, and the
default's are printed beside them (``*_nice0``).

    python -m bench.stream_ttfb [--requests 32] [--concurrency 8] [--reps 3] [--nice 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.common import engine, new_session, percentile, priorities, proxy, report
from nemo_polar.proxy.http.client import ProxyClient
from nemo_polar.proxy.store.records import STAGES

SYSTEM = "You are a careful coding agent working in a git repository. " * 40
QUANTILES = (0.5, 0.95, 0.99)
CAPTURE = {"logprobs": True, "top_logprobs": 0, "return_token_ids": True}  # what a training client asks vLLM for


PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "anthropic": "/v1/messages"}


def is_text(api: str, event: dict[str, Any]) -> bool:
    """Whether one streamed event carries assistant text, in that API's own shape."""
    if api == "chat":
        return any((c.get("delta") or {}).get("content") for c in event.get("choices") or [])
    if api == "responses":
        return event.get("type") == "response.output_text.delta" and bool(event.get("delta"))
    delta = event.get("delta") or {}
    return event.get("type") == "content_block_delta" and delta.get("type") == "text_delta" and bool(delta.get("text"))


def request_body(api: str, model: str, system: str, user: str) -> dict[str, Any]:
    common = {"model": model, "stream": True, "temperature": 0.0}
    if api == "chat":
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        return {**common, "max_tokens": 16, "messages": messages}
    if api == "responses":
        return {**common, "max_output_tokens": 16, "instructions": system, "input": user}
    return {**common, "max_tokens": 16, "system": system, "messages": [{"role": "user", "content": user}]}


async def first_text(client: aiohttp.ClientSession, url: str, api: str, key: str | None, body: dict[str, Any]) -> float:
    """Seconds to the first event carrying text."""
    headers = {"authorization": f"Bearer {key}"} if key else {}
    if api == "anthropic":
        headers["anthropic-version"] = "2023-06-01"
    start = time.perf_counter()
    async with client.post(f"{url}{PATHS[api]}", json=body, headers=headers) as resp:
        resp.raise_for_status()
        async for raw in resp.content:
            line = raw.decode().strip()
            if line.startswith("data: {") and is_text(api, json.loads(line[6:])):
                elapsed = time.perf_counter() - start
                async for _ in resp.content:  # drain: the connection is reused
                    pass
                return elapsed
    raise AssertionError(f"{api}: the stream ended without a text delta")


def stage_table(record_dir: Path) -> list[str]:
    """Per stage of the proxied calls (request arrival to it, from their records): p50 and p95, in ms."""
    stages: dict[str, list[float]] = {name: [] for name in STAGES}
    for f in record_dir.glob("*.jsonl"):
        for line in f.open():
            for name, seconds in json.loads(line).get("stages", {}).items():
                stages.setdefault(name, []).append(seconds)
    return [
        f"  {name:<17} p50 {percentile(v, 0.5) * 1000:6.1f} ms  p95 {percentile(v, 0.95) * 1000:6.1f} ms"
        for name, v in stages.items()
        if v
    ]


def loop_lag(client: ProxyClient) -> dict[str, float]:
    """The proxy's event-loop lag histogram (its /metrics): observations, and the share later than 5 and 25 ms."""
    buckets: dict[float, float] = {}
    for family in text_string_to_metric_families(client.metrics()):
        if family.name == "polar_event_loop_lag_seconds":
            for sample in family.samples:
                if sample.name.endswith("_bucket"):
                    buckets[float(sample.labels["le"])] = sample.value
    total = buckets.get(float("inf"), 0.0)
    late = {f"late_{ms}ms": (total - buckets.get(ms / 1000, total)) / total if total else 0.0 for ms in (5, 25)}
    return {"observations": total, **late}


async def one_round(
    engine_url: str, proxy_client: ProxyClient, model: str, args: argparse.Namespace, rep: int
) -> dict[str, list[tuple[float, float]]]:
    """(direct, proxied) seconds to the first text delta per measured pair, by API."""
    apis = list(PATHS)
    pinned = {"temperature": 0.0, "max_tokens": 16}
    results: dict[str, list[tuple[float, float]]] = {api: [] for api in apis}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(keepalive_timeout=3.0)) as client:
        sem = asyncio.Semaphore(args.concurrency)

        async def pair(i: int) -> None:
            api = apis[i % len(apis)]  # interleaved: every API meets the same load over the run
            user = f"task {rep}.{i}"  # a new prompt every round: no round is served from another's prefix cache
            direct_body = {**request_body("chat", model, SYSTEM, user), **CAPTURE}
            key = await asyncio.to_thread(new_session, proxy_client, sampling_overrides=pinned)
            async with sem:
                direct, proxied = await asyncio.gather(
                    first_text(client, engine_url, "chat", None, direct_body),
                    first_text(client, proxy_client.url, api, key, request_body(api, "local-model", SYSTEM, user)),
                )
            if i >= args.concurrency:  # the first wave warms both paths up
                results[api].append((direct, proxied))

        total = args.requests * len(apis) + args.concurrency
        await asyncio.gather(*(pair(i) for i in range(total)))
    return results


def ratios(rounds: list[dict[str, list[tuple[float, float]]]], api: str, suffix: str) -> tuple[dict[str, float], str]:
    """Per quantile the median over rounds of proxy/direct (and its spread), and the line that prints them."""
    figures: dict[str, float] = {}
    cells = []
    for q in QUANTILES:
        values = [percentile([p / d for d, p in r[api]], q) for r in rounds]
        name = f"{api}_p{round(q * 100)}{suffix}"
        figures[name] = statistics.median(values)
        figures[f"{name}_spread"] = max(values) - min(values)
        cells.append(f"p{round(q * 100)} {figures[name]:.3f}x [{min(values):.3f}-{max(values):.3f}]")
    direct = statistics.median(percentile([d for d, _ in r[api]], 0.5) for r in rounds) * 1000
    proxied = statistics.median(percentile([p for _, p in r[api]], 0.5) for r in rounds) * 1000
    line = (
        f"{api:<10} first text delta p50: direct {direct:6.1f} ms, proxy {proxied:6.1f} ms; proxy/direct "
        + ", ".join(cells)
        + f" (median [range] of {len(rounds)} x {len(rounds[0][api])} pairs)"
    )
    return figures, line


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=32, help="measured pairs per API per repetition")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--reps", type=int, default=3, help="repetitions per engine priority: figures are medians")
    parser.add_argument("--nice", type=int, default=10, help="the deprioritised engine's niceness")
    args = parser.parse_args()
    info: dict[str, float] = {}
    apis = list(PATHS)
    rounds: dict[int, list[dict[str, list[tuple[float, float]]]]] = {0: [], args.nice: []}
    with engine() as engine_url, proxy(engine_url, info) as proxy_client:
        model = httpx.get(f"{engine_url}/v1/models").json()["data"][0]["id"]
        for rep, nice in enumerate(priorities(engine_url, args.nice, args.reps)):
            rounds[nice].append(await one_round(engine_url, proxy_client, model, args, rep))
        lag = loop_lag(proxy_client)
    figures: dict[str, float] = {}
    for nice, suffix in ((args.nice, ""), (0, "_nice0")):
        print(f"engine niceness {nice}:")
        for api in apis:
            found, line = ratios(rounds[nice], api, suffix)
            figures |= found
            print("  " + line)
    print("proxied calls (both priorities), request arrival to each stage:")
    print("\n".join(stage_table(Path(info["record_dir"]))))
    figures |= {f"loop_lag_{k}": round(v, 4) for k, v in lag.items()}
    print(
        f"proxy event loop: {lag['observations']:.0f} wake-ups, {lag['late_5ms'] * 100:.1f}% later than 5 ms, "
        f"{lag['late_25ms'] * 100:.1f}% later than 25 ms"
    )
    worst50 = max(apis, key=lambda a: figures[f"{a}_p50"])
    worst95 = max(apis, key=lambda a: figures[f"{a}_p95"])
    report(
        "stream_ttfb",
        figures,
        f"proxy/direct time to first text delta (engine at nice {args.nice}), worst p50 "
        f"{figures[f'{worst50}_p50']:.3f}x ({worst50}), worst p95 {figures[f'{worst95}_p95']:.3f}x ({worst95}); "
        f"p95 at the engine's default priority: " + ", ".join(f"{a} {figures[f'{a}_p95_nice0']:.3f}x" for a in apis),
    )


if __name__ == "__main__":
    asyncio.run(main())
