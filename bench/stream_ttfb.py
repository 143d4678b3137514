"""Streaming latency through the proxy vs straight from vLLM: time to the first **text** delta, the event a
harness shows and acts on (the first byte is not comparable: the proxy sends its own role/created event at once).

The same conversations stream from vLLM's chat API and through the proxy (continuation mode) over each provider
API a harness uses — Chat Completions, Responses, Messages — each pair submitted together so both see the same
load, the three APIs interleaved. Per API the p50 and p95 of proxy/direct are printed; the last line is the worst
p50 ratio (target ≤ 1.15×).

    python -m bench.stream_ttfb [--requests 32] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx

from bench.common import engine, new_session, percentile, proxy, report

SYSTEM = "You are a careful coding agent working in a git repository. " * 40
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


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=32, help="measured pairs per API")
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    info: dict[str, float] = {}
    apis = list(PATHS)
    with engine() as engine_url, proxy(engine_url, info) as proxy_client:
        model = httpx.get(f"{engine_url}/v1/models").json()["data"][0]["id"]
        pinned = {"temperature": 0.0, "max_tokens": 16}
        results: dict[str, list[tuple[float, float]]] = {api: [] for api in apis}
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(keepalive_timeout=3.0)) as client:
            sem = asyncio.Semaphore(args.concurrency)

            async def pair(i: int) -> None:
                api = apis[i % len(apis)]  # interleaved: every API meets the same load over the run
                user = f"task {i}"
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
    figures: dict[str, float] = {}
    for api in apis:
        ratios = [p / d for d, p in results[api]]
        d50 = percentile([d for d, _ in results[api]], 0.5) * 1000
        p50 = percentile([p for _, p in results[api]], 0.5) * 1000
        figures[f"{api}_p50"], figures[f"{api}_p95"] = percentile(ratios, 0.5), percentile(ratios, 0.95)
        print(
            f"{api:<10} first text delta p50: direct {d50:6.1f} ms, proxy {p50:6.1f} ms; proxy/direct "
            f"p50 {figures[f'{api}_p50']:.3f}x p95 {figures[f'{api}_p95']:.3f}x ({len(ratios)} pairs)"
        )
    renders = [json.loads(line)["render_s"] for f in Path(info["record_dir"]).glob("*.jsonl") for line in f.open()]
    print(f"proxy request building p50 {percentile(renders, 0.5) * 1000:.1f} ms")
    worst = max(apis, key=lambda a: figures[f"{a}_p50"])
    report(
        "stream_ttfb",
        figures,
        f"proxy/direct time to first text delta, worst p50: {figures[f'{worst}_p50']:.3f}x ({worst}); "
        + ", ".join(f"{a} {figures[f'{a}_p50']:.3f}x" for a in apis),
    )


if __name__ == "__main__":
    asyncio.run(main())
