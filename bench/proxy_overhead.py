"""Latency the proxy adds: the same multi-turn requests sent straight to vLLM and through the proxy.

64 concurrent sessions per side; each round sends the next turn of every session straight to vLLM and through
the proxy (continuation mode: /tokenize + token-in /v1/completions, ids and logprobs captured), all submitted
together and interleaved, so both sides meet the same engine load. The figure is the ratio of latency
percentiles, proxy/direct.

Engine and proxy share the 2 cores here: as in ``bench.stream_ttfb``, blocks of ``--rounds`` rounds alternate (ABBA,
``--reps`` blocks each) between the engine at its default priority and at ``--nice`` (``polar engine up --nice``,
the deployment docs/proxy.md recommends for a CPU machine shared with the proxy); the figures are for the
latter, the default's beside them (``*_nice0``). A first round warms both paths up.

    python -m bench.proxy_overhead [--sessions 64] [--rounds 3] [--reps 2] [--nice 10] [--max-tokens 32]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx

from bench.common import engine, new_session, percentile, priorities, proxy, report

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
    parser.add_argument("--rounds", type=int, default=3, help="rounds per block")
    parser.add_argument("--reps", type=int, default=2, help="blocks per engine priority")
    parser.add_argument("--nice", type=int, default=10, help="the deprioritised engine's niceness")
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
        lat: dict[int, dict[str, list[float]]] = {n: {"direct": [], "proxy": []} for n in (0, args.nice)}
        connector = aiohttp.TCPConnector(limit=4 * args.sessions, keepalive_timeout=3.0)
        async with aiohttp.ClientSession(connector=connector) as client:
            blocks = (n for n in priorities(engine_url, args.nice, args.reps) for _ in range(args.rounds))
            for rnd, nice in enumerate(itertools.chain([None], blocks)):  # None: the warm-up round
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
                    if nice is not None:
                        lat[nice][side].append(elapsed)
    print(f"proxy mode: {args.mode}")
    figures: dict[str, float | int | str] = {"mode": args.mode}
    for nice, suffix in ((args.nice, ""), (0, "_nice0")):
        sides = lat[nice]
        d50, p50 = percentile(sides["direct"], 0.5), percentile(sides["proxy"], 0.5)
        d99, p99 = percentile(sides["direct"], 0.99), percentile(sides["proxy"], 0.99)
        print(f"engine niceness {nice}: {len(sides['direct'])} requests per side ({args.sessions} concurrent sessions)")
        print(f"  direct  p50 {d50 * 1000:8.1f} ms   p99 {d99 * 1000:8.1f} ms")
        print(f"  proxy   p50 {p50 * 1000:8.1f} ms   p99 {p99 * 1000:8.1f} ms")
        figures |= {f"p50{suffix}": p50 / d50, f"p99{suffix}": p99 / d99, f"requests{suffix}": len(sides["direct"])}
    renders = [json.loads(line)["render_s"] for f in Path(cpu["record_dir"]).glob("*.jsonl") for line in f.open()]
    print(f"proxy request building (render) p50 {percentile(renders, 0.5) * 1000:.1f} ms")
    requests = args.sessions * (1 + 2 * args.reps * args.rounds)
    print(f"proxy process CPU: {cpu['proxy_cpu_s'] * 1000 / requests:.1f} ms per request")
    report(
        "proxy_overhead" if args.mode == "continuation" else f"proxy_overhead_{args.mode}",
        figures,
        f"proxy/direct latency ratio ({args.mode}, engine at nice {args.nice}): p50 {figures['p50']:.3f}x  "
        f"p99 {figures['p99']:.3f}x; at its default priority p50 {figures['p50_nice0']:.3f}x",
    )


if __name__ == "__main__":
    asyncio.run(main())
