"""End-to-end demo: a real vLLM engine, the proxy, and a two-turn streamed conversation, recorded exactly.

Run with ``.venv/bin/python examples/streaming_chat.py``. Uses SmolLM2-135M-Instruct (real weights) so the text is
real; set ``POLAR_DEMO_ENGINE_URL`` to use an engine that is already running.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import anthropic

from nemo_polar.engine.launcher import EngineProcess, EngineSpec, free_port
from nemo_polar.proxy.http.client import ProxyClient
from nemo_polar.proxy.http.config import ProxyConfig
from nemo_polar.proxy.http.serve import ProxyServer
from nemo_polar.proxy.store.records import read_records


def run(engine_url: str, record_dir: Path) -> None:
    with ProxyServer(
        ProxyConfig(engine_url=engine_url, record_dir=record_dir, model_aliases=["local-model"])
    ) as server:
        converse(server.client(), record_dir)


def converse(proxy: ProxyClient, record_dir: Path) -> None:
    print(f"proxy   {proxy.url}  (records in {record_dir})")

    session_id, api_key = proxy.create_session({"sampling_overrides": {"temperature": 0.0}})
    client = anthropic.Anthropic(base_url=proxy.url, api_key=api_key, max_retries=0)
    messages: list[dict] = []
    for question in ("What is the capital of France? Answer in one sentence.", "And of Italy?"):
        messages.append({"role": "user", "content": question})
        print(f"\nuser    {question}\nmodel   ", end="", flush=True)
        with client.messages.stream(model="local-model", max_tokens=60, messages=messages) as stream:
            for text in stream.text_stream:  # printed as the engine generates it
                print(text, end="", flush=True)
            reply = stream.get_final_message()
        print()
        messages.append({"role": "assistant", "content": reply.content[0].text})

    records = read_records(record_dir / f"{session_id}.jsonl")
    print("\nrecorded calls:")
    for rec in records:
        mean_lp = sum(rec.sampled_logprobs) / max(1, len(rec.sampled_logprobs))
        print(
            f"  {rec.call_id}  {rec.render_reason:<12} prompt={len(rec.prompt_token_ids):>4} ids  "
            f"sampled={len(rec.sampled_token_ids):>3} ids  mean logprob={mean_lp:.3f}  finish={rec.finish_reason}"
        )
    first, second = records
    head = first.prompt_token_ids + first.sampled_token_ids
    exact = second.prompt_token_ids[: len(head)] == head
    print(f"\nsecond prompt starts with first prompt + first sampled ids: {exact}")
    if not exact:
        sys.exit("continuation was not token-exact")


def main() -> None:
    record_dir = Path(os.environ.get("POLAR_DEMO_RECORDS") or tempfile.mkdtemp(prefix="polar-demo-"))
    url = os.environ.get("POLAR_DEMO_ENGINE_URL")
    if url:
        run(url, record_dir)
        return
    print("engine  starting vLLM with smollm2-135m-instruct (CPU: ~20-90 s) ...", flush=True)
    with EngineProcess(EngineSpec(model="smollm2-135m-instruct", port=free_port())) as engine:
        print(f"engine  {engine.spec.url}")
        run(engine.spec.url, record_dir)


if __name__ == "__main__":
    main()
