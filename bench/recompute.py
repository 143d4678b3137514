"""Trainer-side logprob agreement: sessions recorded through the proxy on the real engine, reconstructed (prefix
merging), and every trainable token's logprob recomputed with transformers under the same weights, as a trainer
would; printed as mean and max |Δ| and the KL (k3) between the engine's and the trainer's distributions. A real
model (SmolLM2-135M-Instruct, real weights) so the logprobs are not those of a random network.

    python -m bench.recompute [--model smollm2-135m-instruct] [--sessions 8] [--turns 4]
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import httpx

from bench.common import engine, proxy, report
from bench.merge import record
from nemo_polar.reconstruct.builders import prefix_merging
from nemo_polar.reconstruct.io import load_records
from nemo_polar.reconstruct.recompute import recompute_logprobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--turns", type=int, default=4)
    args = parser.parse_args()
    info: dict[str, object] = {}
    with engine(args.model) as engine_url, proxy(engine_url, info) as proxy_client:  # type: ignore[arg-type]
        model_dir = Path(httpx.get(f"{engine_url}/v1/models", timeout=10).json()["data"][0]["root"])
        asyncio.run(record(proxy_client, args.sessions, args.turns))
        sessions = load_records(sorted(Path(str(info["record_dir"])).glob("*.jsonl")))
    traces = [t for recs in sessions.values() for t in prefix_merging(recs).traces]
    result = recompute_logprobs(traces, model_dir)
    print(f"{len(sessions)} sessions, {len(traces)} traces, {result['tokens']} trainable tokens, model {args.model}")
    report(
        "recompute",
        {k: result[k] for k in ("tokens", "mean_abs_logprob_delta", "max_abs_logprob_delta", "kl_k3")},
        f"trainer recompute vs engine logprobs: mean |Δ| {result['mean_abs_logprob_delta']:.5f}, "
        f"max |Δ| {result['max_abs_logprob_delta']:.4f}, KL (k3) {result['kl_k3']:.2e} over {result['tokens']} tokens",
    )


if __name__ == "__main__":
    main()
