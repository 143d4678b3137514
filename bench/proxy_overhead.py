"""Latency the proxy adds: the same multi-turn requests sent straight to vLLM and through the proxy.

64 concurrent sessions per side; each round sends the next turn of every session straight to vLLM and through
the proxy (continuation mode: /tokenize + token-in /v1/completions, ids and logprobs captured), all submitted
together and interleaved, so both sides meet the same engine load. The figure is the ratio of latency
percentiles, proxy/direct.

    python -m bench.proxy_overhead [--sessions 64] [--rounds 6] [--max-tokens 32]
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

SYSTEM = "You are a careful coding agent working in a git repository. " * 20


# The direct baseline asks vLLM for the same capture data a training client needs (as NeMo Gym's vllm_model
# does), so the ratio measures the proxy, not the engine's cost of computing logprobs.
CAPTURE = {"logprobs": True, "top_logprobs": 0, "return_token_ids": True}


async def one(client: aiohttp.ClientSession, url: str, key: str | None, body: dict[str, Any]) -> tuple[float, str]:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    start = time.perf_counter()
    async with client.post(f"{url}/v1/chat/completions", json=body, headers=headers) as resp:
        resp.raise_for_status()
        payload = await resp.json()
    return time.perf_counter() - start, payload["choices"][0]["message"]["content"] or ""


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--mode", choices=["continuation", "chat", "chat_prefix"], default="continuation")
    args = parser.parse_args()

    cpu: dict[str, float] = {}
    with engine() as engine_url, proxy(engine_url, cpu) as proxy_client:
        info = httpx.get(f"{engine_url}/v1/models").json()["data"][0]["id"]
        pinned = {"temperature": 0.0, "max_tokens": args.max_tokens}
        keys = [
            new_session(proxy_client, mode=args.mode, sampling_overrides=pinned, extra_body={"ignore_eos": True})
            for _ in range(args.sessions)
        ]
        histories = {
            side: [[{"role": "system", "content": SYSTEM}] for _ in range(args.sessions)]
            for side in ("direct", "proxy")
        }
        lat: dict[str, list[float]] = {"direct": [], "proxy": []}
        connector = aiohttp.TCPConnector(limit=4 * args.sessions, keepalive_timeout=3.0)
        async with aiohttp.ClientSession(connector=connector) as client:
            for rnd in range(args.rounds):
                jobs = []
                for i in range(args.sessions):
                    # direct and proxied turns of the same step are submitted together, interleaved, so both
                    # sides meet the same engine load at the same moment
                    for side in ("direct", "proxy") if (i + rnd) % 2 == 0 else ("proxy", "direct"):
                        hist = histories[side][i]
                        hist.append({"role": "user", "content": f"Step {rnd} of task {i}: list the files."})
                        body = {"model": info if side == "direct" else "local-model", "messages": list(hist),
                                "max_tokens": args.max_tokens, "temperature": 0.0, "ignore_eos": True,
                                **(CAPTURE if side == "direct" else {})}  # fmt: skip
                        url, key = (engine_url, None) if side == "direct" else (proxy_client.url, keys[i])
                        jobs.append((side, hist, one(client, url, key, body)))
                results = await asyncio.gather(*(job for _, _, job in jobs))
                for (side, hist, _), (elapsed, text) in zip(jobs, results, strict=True):
                    hist.append({"role": "assistant", "content": text})
                    if rnd > 0:  # round 0 warms both paths up
                        lat[side].append(elapsed)
    d50, p50 = percentile(lat["direct"], 0.5), percentile(lat["proxy"], 0.5)
    d99, p99 = percentile(lat["direct"], 0.99), percentile(lat["proxy"], 0.99)
    print(f"proxy mode: {args.mode}")
    print(f"requests per side: {len(lat['direct'])} ({args.sessions} concurrent sessions x {args.rounds - 1} rounds)")
    print(f"direct  p50 {d50 * 1000:8.1f} ms   p99 {d99 * 1000:8.1f} ms")
    print(f"proxy   p50 {p50 * 1000:8.1f} ms   p99 {p99 * 1000:8.1f} ms")
    renders = [json.loads(line)["render_s"] for f in Path(cpu["record_dir"]).glob("*.jsonl") for line in f.open()]
    print(f"proxy request building (render) p50 {percentile(renders, 0.5) * 1000:.1f} ms")
    print(f"proxy process CPU: {cpu['proxy_cpu_s'] * 1000 / (args.sessions * args.rounds):.1f} ms per request")
    report(
        "proxy_overhead" if args.mode == "continuation" else f"proxy_overhead_{args.mode}",
        {"mode": args.mode, "p50": p50 / d50, "p99": p99 / d99, "requests": len(lat["direct"])},
        f"proxy/direct latency ratio ({args.mode}): p50 {p50 / d50:.3f}x  p99 {p99 / d99:.3f}x",
    )


if __name__ == "__main__":
    asyncio.run(main())
