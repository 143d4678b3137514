"""Prefix merging vs per-request traces on multi-turn sessions recorded through the proxy on the real engine.

Records ``--sessions`` agent sessions of ``--turns`` calls each (an agent loop with tool results, continuation
mode), then builds both kinds of traces and prints trainer updates per request, tokens the trainer processes
(trainable + context), and reconstruction throughput. A third row cross-checks NeMo Gym's ``prefix_merging``
(nemo-gym's ``token_id_capture/builder.py``) over the sessions exported as Gym ``TokenEntry`` records: its chains,
the sessions where its chains, token sequences and trainable tokens equal ours, and its throughput (skipped without
nemo-gym). The last line is the merged/per-request update ratio.

    python -m bench.merge [--sessions 16] [--turns 8] [--repeat 20]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

import aiohttp

from bench.common import engine, new_session, proxy, report
from nemo_polar.proxy.http.client import ProxyClient
from nemo_polar.proxy.store.records import CallRecord
from nemo_polar.reconstruct.audit import audit
from nemo_polar.reconstruct.builders import per_request, prefix_merging
from nemo_polar.reconstruct.io import load_records

SYSTEM = "You are a coding agent. Use the bash tool to inspect and fix the repository. " * 10


async def agent(client: aiohttp.ClientSession, url: str, key: str, turns: int, i: int) -> None:
    history = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Fix issue {i}."}]
    for turn in range(turns):
        body = {"model": "local-model", "messages": history}
        async with client.post(
            f"{url}/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"}
        ) as r:
            r.raise_for_status()
            text = (await r.json())["choices"][0]["message"]["content"] or ""
        history += [
            {"role": "assistant", "content": text},
            {"role": "user", "content": f"<tool_response>\nexit code 0, step {turn}\n</tool_response>"},
        ]


async def record(proxy: ProxyClient, sessions: int, turns: int) -> None:
    url = proxy.url
    keys = [new_session(proxy, sampling_overrides={"max_tokens": 24}) for _ in range(sessions)]
    async with aiohttp.ClientSession() as client:
        await asyncio.gather(*(agent(client, url, k, turns, i) for i, k in enumerate(keys)))


def gym_row(sessions: dict[str, list[CallRecord]], repeat: int) -> str:
    """Gym's builder over the exported entries, against ours over the records (``nemo_polar.env.gym.token_check``)."""
    try:
        from nemo_gym.token_id_capture.builder import prefix_merging as gym_prefix_merging

        from nemo_polar.env.gym.token_check import cross_check
        from nemo_polar.env.gym.tokens import export_rollout
    except ImportError as exc:
        return f"{'gym_prefix_merging':<15} skipped: nemo-gym is not installed ({exc})"
    calls = sum(len(r) for r in sessions.values())
    start = time.perf_counter()
    exports = {sid: export_rollout(recs, sid) for sid, recs in sessions.items()}
    export_s = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(repeat):
        for export in exports.values():
            gym_prefix_merging(export.entries)
    build_s = time.perf_counter() - start
    checks = [cross_check(recs) for recs in sessions.values()]
    agree = sum(c.same_chains and c.same_tokens for c in checks)
    return (
        f"{'gym_prefix_merging':<15} chains {sum(len(c.gym) for c in checks):>5}  same chains and tokens as ours in "
        f"{agree}/{len(checks)} sessions (trainable {sum(c.gym_trainable for c in checks)})  "
        f"{calls * repeat / build_s:,.0f} calls/s (export to TokenEntry {calls / export_s:,.0f} calls/s)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=20, help="builds per builder for the throughput figure")
    args = parser.parse_args()
    info: dict[str, object] = {}
    with engine() as engine_url, proxy(engine_url, info) as proxy_client:  # type: ignore[arg-type]
        asyncio.run(record(proxy_client, args.sessions, args.turns))
        paths = sorted(Path(str(info["record_dir"])).glob("*.jsonl"))
    sessions = load_records(paths)
    calls = sum(len(r) for r in sessions.values())
    figures = {}
    for name, build in (("per_request", per_request), ("prefix_merging", prefix_merging)):
        start = time.perf_counter()
        for _ in range(args.repeat):
            results = {sid: build(recs) for sid, recs in sessions.items()}
        elapsed = time.perf_counter() - start
        traces = [t for r in results.values() for t in r.traces]
        assert all(audit(r.traces, sessions[sid]).ok for sid, r in results.items())
        tokens = sum(len(t.prompt_ids) + len(t.response_ids) for t in traces)
        trainable = sum(t.trainable_tokens for t in traces)
        figures[name] = len(traces)
        print(
            f"{name:<15} traces {len(traces):>5}  updates/request {len(traces) / calls:.3f}  "
            f"tokens {tokens:>9} (trainable {trainable})  {calls * args.repeat / elapsed:,.0f} calls/s"
        )
    print(gym_row(sessions, args.repeat))
    print(f"sessions {len(sessions)} x {args.turns} calls = {calls} calls; audit passed for both builders")
    ratio = figures["prefix_merging"] / figures["per_request"]
    report(
        "merge",
        {"updates_ratio": ratio, "calls": calls, "traces": figures["prefix_merging"]},
        f"prefix_merging/per_request trainer updates: {ratio:.3f} "
        f"({figures['prefix_merging']} traces for {calls} calls)",
    )


if __name__ == "__main__":
    main()
