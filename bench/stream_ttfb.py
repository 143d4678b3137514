"""Streaming latency through the proxy vs straight from vLLM: time to first byte and to first text delta.

The same streamed chat requests go to vLLM and through the proxy (continuation mode), each pair submitted
together so both see the same load. The figure is the median ratio proxy/direct.

    python -m bench.stream_ttfb [--requests 48] [--concurrency 8]
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

from bench.common import engine, new_session, percentile, proxy

SYSTEM = "You are a careful coding agent working in a git repository. " * 40
CAPTURE = {"logprobs": True, "top_logprobs": 0, "return_token_ids": True}  # what a training client asks vLLM for


async def timed_stream(
    client: aiohttp.ClientSession, url: str, key: str | None, body: dict[str, Any]
) -> tuple[float, float]:
    """Seconds to the first response byte and to the first chunk carrying text."""
    headers = {"authorization": f"Bearer {key}"} if key else {}
    start = time.perf_counter()
    first_byte = first_text = None
    async with client.post(f"{url}/v1/chat/completions", json=body, headers=headers) as resp:
        resp.raise_for_status()
        async for raw in resp.content:
            if first_byte is None:
                first_byte = time.perf_counter() - start
            line = raw.decode().strip()
            if first_text is None and line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if any((c.get("delta") or {}).get("content") for c in chunk.get("choices") or []):
                    first_text = time.perf_counter() - start
    assert first_byte is not None and first_text is not None
    return first_byte, first_text


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    info: dict[str, float] = {}
    with engine() as engine_url, proxy(engine_url, info) as proxy_client:
        model = httpx.get(f"{engine_url}/v1/models").json()["data"][0]["id"]
        pinned = {"temperature": 0.0, "max_tokens": 16}
        results: dict[str, list[tuple[float, float]]] = {"direct": [], "proxy": []}
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(keepalive_timeout=3.0)) as client:
            sem = asyncio.Semaphore(args.concurrency)

            async def pair(i: int) -> None:
                messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"task {i}"}]
                body = {"model": model, "stream": True, "max_tokens": 16, "temperature": 0.0, "messages": messages}
                key = await asyncio.to_thread(new_session, proxy_client, sampling_overrides=pinned)
                async with sem:
                    direct, proxied = await asyncio.gather(
                        timed_stream(client, engine_url, None, {**body, **CAPTURE}),
                        timed_stream(client, proxy_client.url, key, {**body, "model": "local-model"}),
                    )
                if i >= args.concurrency:  # the first wave warms both paths up
                    results["direct"].append(direct)
                    results["proxy"].append(proxied)

            await asyncio.gather(*(pair(i) for i in range(args.requests + args.concurrency)))
    ratios = {}
    for what, idx in (("first byte", 0), ("first text delta", 1)):
        d = percentile([r[idx] for r in results["direct"]], 0.5)
        p = percentile([r[idx] for r in results["proxy"]], 0.5)
        ratios[what] = p / d
        print(f"{what:<17} median: direct {d * 1000:7.1f} ms   proxy {p * 1000:7.1f} ms   ratio {p / d:.3f}x")
    renders = [json.loads(line)["render_s"] for f in Path(info["record_dir"]).glob("*.jsonl") for line in f.open()]
    build = percentile(renders, 0.5) * 1000
    print(f"requests per side: {len(results['direct'])}; proxy request building p50 {build:.1f} ms")
    print(
        f"proxy/direct time to first streamed byte: {ratios['first byte']:.3f}x "
        f"(first text delta {ratios['first text delta']:.3f}x)"
    )


if __name__ == "__main__":
    asyncio.run(main())
