"""Real session sizes through the real proxy (``polar proxy`` in its own process, continuation mode, the Qwen
tokenizer and template of tiny-qwen3) in front of a **stub engine**: it answers ``/v1/completions`` like vLLM (the
prompt's ids echoed, a fixed short reply with ids and logprobs) and does no model work, so every figure is the
proxy's own. A 200-call chat session whose history grows to 64k tokens, then one to 128k: the proxy process's CPU
time per call (user + system, from /proc, in 10-call blocks) against the context length, its fitted exponent and the
fit's value at 64k and 128k (a figure from every block, where one block's clock ticks leave it ±1 ms); the memory the
open session holds (the proxy's RSS once it has returned its allocator's free memory); the bytes its records take on
disk per unique session token; prefix merging's calls/s on them; where a call's time goes at 8k, 32k,
64k and 128k tokens (the stages each record timestamps: request read and parsed, admitted, rendered, the stub engine's
round trip, recorded). Then ``--sessions`` concurrent sessions at 32k-token contexts: the proxy's sustained calls/s.
The last line is the per-call CPU at 64k.

    python -m bench.session_scale [--calls 200] [--sessions 256] [--concurrent-context 32768]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import aiohttp
import orjson
from fastapi import FastAPI, Request
from starlette.types import ASGIApp, Receive, Scope, Send

from bench.common import cpu_seconds, fit_at, fit_exponent, new_session, proxy, report, rss_mb
from nemo_polar.paths import cache_dir
from nemo_polar.proxy.http.config import ProxyConfig
from nemo_polar.proxy.http.serve import BackgroundServer
from nemo_polar.proxy.render.renderer import LocalRenderer
from nemo_polar.proxy.store.records import CallRecord
from nemo_polar.reconstruct.builders import prefix_merging
from nemo_polar.reconstruct.io import load_records

MODEL = cache_dir() / "models" / "tiny-qwen3"
# Numbered by the prompt's size: a model's replies differ from call to call (a text the proxy sent twice names no one
# call when a harness echoes it, and is looked up again on every later call)
REPLY = "Ran it; next step {n}."
WORDS = [
    "def",
    "return",
    "self",
    "value",
    "error",
    "path",
    "test",
    "file",
    "line",
    "import",
    "class",
    "assert",
    "none",
    "true",
    "false",
    "raise",
]


def stub_engine(local: LocalRenderer) -> ASGIApp:
    """A stub engine (no model): vLLM's answers, in shape, for what the proxy asks. ``/v1/completions``, the one
    route of every call, is served as a bare ASGI app in front of FastAPI's routing and request objects: the stub's
    work on the cores the proxy runs on stays small beside the proxy's."""
    app = FastAPI()
    complete = _completion(local)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"data": [{"id": "tiny-qwen3", "max_model_len": 1 << 20, "root": str(MODEL)}]}

    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict[str, Any]:
        body = await request.json()
        if "messages" in body:  # the proxy's probe of its local renderer
            return {"tokens": local.render_sync(body["messages"], body.get("tools"), {})}
        return {"tokens": local.encode(body["prompt"])}

    async def serve(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != "/v1/completions":
            return await app(scope, receive, send)
        chunks, more = [], True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        answer = complete(b"".join(chunks))
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(answer))]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": answer})

    return serve


def _completion(local: LocalRenderer) -> Callable[[bytes], bytes]:
    """The stub's answer to a ``/v1/completions`` body: a fixed short reply, with the prompt's ids echoed as the
    bytes they came in (vLLM parses them and writes them back compact, as the proxy wrote them: the same bytes), and
    only the rest of the body parsed."""
    encode = local.tokenizer.backend_tokenizer.encode_batch_fast  # its reply's ids: the Rust tokenizer, no wrapper

    def complete(raw: bytes) -> bytes:
        at = raw.find(PROMPT_IDS)
        if at >= 0:
            end = raw.index(b"]", at) + 1
            prompt = raw[at + len(PROMPT_IDS) - 1 : end]
        else:  # a text prompt: echoed as it came
            prompt = orjson.dumps(orjson.loads(raw)["prompt"])
        text = REPLY.format(n=len(prompt))  # not its ids counted: that took a third of the stub's time
        ids = [*encode([text], add_special_tokens=False)[0].ids, 151645]
        choice = {
            "index": 0,
            "text": text,
            "token_ids": ids,
            "prompt_token_ids": ECHO,
            "finish_reason": "stop",
            "logprobs": {"token_logprobs": [-0.5] * len(ids)},
        }
        answer = orjson.dumps({"choices": [choice]})  # no usage: the proxy counts a prompt's ids itself
        return answer.replace(orjson.dumps(ECHO), prompt, 1)

    return complete


PROMPT_IDS = b'"prompt":['
ECHO = "stub-echo-of-the-prompt"  # where the answer's prompt_token_ids go, written as they came


class Stub(NamedTuple):
    url: str
    pid: int


@contextmanager
def stub_engine_process() -> Iterator[Stub]:
    """The stub engine served by a process of its own: its work shares no interpreter lock with the load
    generator's."""
    context = multiprocessing.get_context("spawn")
    urls = context.Queue()
    process = context.Process(target=_serve_stub, args=(urls,), daemon=True)
    process.start()
    try:
        url = urls.get(timeout=300)
        assert process.pid is not None
        yield Stub(url, process.pid)
    finally:
        process.terminate()
        process.join(30)


def _serve_stub(urls: Any) -> None:
    with BackgroundServer(stub_engine(LocalRenderer(MODEL))) as server:
        urls.put(server.url)
        threading.Event().wait()


def tool_output(rng: random.Random, tokens: int) -> str:
    lines, n = [], 0
    while n < tokens:
        words = [rng.choice(WORDS) for _ in range(rng.randrange(4, 12))]
        lines.append(" ".join(words))
        n += len(words) + 1
    return "\n".join(lines)


async def call(http: aiohttp.ClientSession, url: str, key: str, messages: list[dict[str, Any]]) -> str:
    body = {"model": "local-model", "messages": messages, "max_tokens": 16}
    async with http.post(f"{url}/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"}) as resp:
        resp.raise_for_status()
        return (await resp.json())["choices"][0]["message"]["content"]


async def one_session(
    url: str, key: str, pid: int, calls: int, context: int, seed: int
) -> list[tuple[int, float, float]]:
    """(context tokens at the call, proxy CPU seconds of the call, its wall seconds as the harness waited) per call."""
    rng = random.Random(seed)
    step = context // calls
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. " + tool_output(rng, 1000)},
        {"role": "user", "content": "Fix the failing test."},
    ]
    points = []
    async with aiohttp.ClientSession() as http:
        for i in range(calls):
            before, t0 = cpu_seconds(pid), time.perf_counter()
            reply = await call(http, url, key, messages)
            points.append((1000 + i * step, cpu_seconds(pid) - before, time.perf_counter() - t0))
            messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": tool_output(rng, step)}]
    return points


async def sustained(url: str, keys: list[str], context: int, rounds: int) -> float:
    """Calls/s over ``rounds`` rounds of one call per session, every session's history already at ``context``."""
    rng = random.Random(1)
    histories = [
        [
            {"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": tool_output(rng, context)},
        ]
        for _ in keys
    ]
    connector = aiohttp.TCPConnector(limit=len(keys))
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=3600)) as http:

        async def step(i: int) -> None:
            reply = await call(http, url, keys[i], histories[i])
            histories[i] += [{"role": "assistant", "content": reply}, {"role": "user", "content": "ok, next"}]

        await asyncio.gather(*(step(i) for i in range(len(keys))))  # the first calls render whole histories
        t0 = time.perf_counter()
        for _ in range(rounds):
            await asyncio.gather(*(step(i) for i in range(len(keys))))
        return rounds * len(keys) / (time.perf_counter() - t0)


# A call's stages in order (CallRecord.stages: seconds from the request's arrival), and what each span holds.
SPANS = {
    "parsed": "read + parse",  # the body read, decoded, parsed into a Conversation, echoed turns restored
    "admitted": "admit",  # the weight-sync gate
    "rendered": "render",  # traits, parent, new messages rendered, the prompt's ids
    "engine_accepted": "engine",  # the request to the (stub) engine and its answer
}


def settled_rss(pid: int) -> float:
    """The proxy's RSS (MB) once it has handed back the memory its allocator held free (``ProxyConfig.trim_heap_s``)."""
    time.sleep((ProxyConfig.model_fields["trim_heap_s"].default or 0) + 1)
    return rss_mb(pid)


def stage_breakdown(records: list[CallRecord], at: list[int], window: int = 10) -> dict[int, dict[str, float]]:
    """Mean milliseconds per stage of the ``window`` calls whose prompt is nearest each context in ``at`` (the
    stages as each record timestamps them, and ``record`` from the last stage to the record's completion)."""
    done = [r for r in records if r.complete and r.finished_at is not None and "engine_accepted" in r.stages]
    table: dict[int, dict[str, float]] = {}
    for context in at:
        near = sorted(done, key=lambda r: abs(len(r.prompt_token_ids) - context))[:window]
        if not near or abs(len(near[0].prompt_token_ids) - context) > context / 4:
            continue  # the session never came near this size
        spans: dict[str, float] = {}
        for r in near:
            last = 0.0
            for stage, name in SPANS.items():
                spans[name] = spans.get(name, 0.0) + r.stages[stage] - last
                last = r.stages[stage]
            spans["record"] = spans.get("record", 0.0) + (r.finished_at or 0.0) - r.started_at - last
        table[context] = {name: 1000 * total / len(near) for name, total in spans.items()}
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--contexts", type=int, nargs="+", default=[65536, 131072])
    parser.add_argument("--sessions", type=int, default=256)
    parser.add_argument("--concurrent-context", type=int, default=32768)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    figures: dict[str, float] = {}
    cpu: dict[str, Any] = {}
    stages: dict[int, dict[str, float]] = {}
    with stub_engine_process() as stub, proxy(stub.url, cpu) as client:
        pid = cpu["proxy_pid"]
        for context in args.contexts:
            session_id, key = client.create_session({"mode": "continuation"})
            rss_before = settled_rss(pid)
            points = asyncio.run(one_session(client.url, key, pid, args.calls, context, context))
            rss_growth = settled_rss(pid) - rss_before  # the session is still open: all it holds in memory
            # /proc counts CPU in clock ticks (10 ms): per-call figures are means over blocks of 10 calls, and the one
            # at the context is the power law fitted to the blocks from context/8 on, read there (one block's mean is
            # within a tick of its 10 calls, ±1 ms a call; the fit reads every block's ticks)
            blocks = [points[i : i + 10] for i in range(0, len(points) - 9, 10)]
            means = [(sum(p[0] for p in b) / len(b), sum(p[1] for p in b) / len(b)) for b in blocks]
            wall_ms = 1000 * sum(p[2] for p in points[-10:]) / 10  # the harness's wait, the stub engine's included
            fitted = [m for m in means if m[0] >= context / 8]
            exponent = fit_exponent(fitted)
            last_ms = 1000 * fit_at(fitted, context)
            path = Path(cpu["record_dir"]) / f"{session_id}.jsonl"
            [records] = load_records([path]).values()
            unique = len(records[-1].prompt_token_ids) + len(records[-1].sampled_token_ids)
            t0 = time.perf_counter()
            prefix_merging(records)
            merge_calls_s = len(records) / (time.perf_counter() - t0)
            k = f"{context // 1024}k"
            figures |= {
                f"cpu_ms_per_call_{k}": last_ms,
                f"cpu_exponent_{k}": exponent,
                f"bytes_per_unique_token_{k}": path.stat().st_size / unique,
                f"merge_calls_per_s_{k}": merge_calls_s,
                f"proxy_rss_mb_per_session_{k}": rss_growth,
                f"wall_ms_per_call_{k}": wall_ms,
            }
            print(
                f"{args.calls} calls to {unique:,} tokens: proxy CPU {1000 * fitted[0][1]:.1f} ms/call at "
                f"{fitted[0][0] / 1024:.0f}k, {last_ms:.1f} ms/call at {k} (fitted; the last 10 calls: "
                f"{1000 * means[-1][1]:.1f}; a call's wall time {wall_ms:.1f} ms), "
                f"~ context^{exponent:.2f}; records {path.stat().st_size / unique:.1f} bytes per unique token; "
                f"prefix merging {merge_calls_s:,.0f} calls/s; the open session holds {rss_growth:.0f} MB of the "
                "proxy's memory"
            )
            stages |= stage_breakdown(records, [c for c in (8192, 32768, 65536, 131072) if c <= context])
        print("where a call's time goes (wall ms, mean of the 10 calls nearest each context; stub engine):")
        print("  context  " + "".join(f"{name:>14}" for name in [*SPANS.values(), "record"]))
        for context, spans in sorted(stages.items()):
            print(f"  {context // 1024:>5}k  " + "".join(f"{ms:>14.1f}" for ms in spans.values()))
            figures |= {f"stage_ms_{name.split()[0]}_{context // 1024}k": ms for name, ms in spans.items()}
        keys = [new_session(client, mode="continuation") for _ in range(args.sessions)]
        rate = asyncio.run(sustained(client.url, keys, args.concurrent_context, args.rounds))
        figures["sustained_calls_per_s"] = rate
        print(f"{args.sessions} concurrent sessions at {args.concurrent_context:,}-token contexts: {rate:.1f} calls/s")
    k = f"{args.contexts[0] // 1024}k"
    report(
        "session_scale",
        {name: round(value, 3) for name, value in figures.items()},
        f"proxy CPU per call at {k}: {figures[f'cpu_ms_per_call_{k}']:.1f} ms (~ context^"
        f"{figures[f'cpu_exponent_{k}']:.2f}), records {figures[f'bytes_per_unique_token_{k}']:.1f} B/token, "
        f"{rate:.0f} calls/s at {args.sessions} sessions",
    )


if __name__ == "__main__":
    main()
