"""What "the logprobs are the engine's" means, measured on this machine's engine.

A record's logprobs are what the engine returned for that request, bit for bit (test_fixture_replay.py). Re-sending
the same prompt reproduces them bit for bit only when it is prefilled the same way: on CPUs whose matmul kernels
depend on the batch shape (AVX-512/AMX), a long prompt prefilled cold and the same prompt served from the prefix
cache give the same distribution only up to float error. docs/proxy.md states the bound asserted here.
"""

from __future__ import annotations

import random
import uuid
from typing import Any

from tests.helpers.clients import loopback

PROMPT_TOKENS = 6_000
TOP = 5
# The bound docs/proxy.md states on re-scoring the same prompt prefilled another way (nats, any top-k token's logprob).
RESCORE_BOUND = 0.05


def _first_position(engine_url: str, prompt: list[int], salt: str) -> dict[str, Any]:
    """The greedy first token and its top-k logprobs, keyed by token id (text keys can collide)."""
    choice = loopback.post(
        f"{engine_url}/v1/completions",
        json={
            "model": "tiny-qwen3",
            "prompt": prompt,
            "max_tokens": 1,
            "temperature": 0.0,
            "logprobs": TOP,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "cache_salt": salt,  # requests share prefix-cache blocks only with requests of the same salt
        },
        timeout=300,
    ).json()["choices"][0]
    return {"token_ids": choice["token_ids"], "top": choice["logprobs"]["top_logprobs"][0]}


def test_long_prompt_cold_and_warm_prefill(engine_url: str) -> None:
    rng = random.Random(27)
    prompt = [rng.randrange(1_000, 100_000) for _ in range(PROMPT_TOKENS)]
    salt = uuid.uuid4().hex  # nothing this engine has cached before: the first request prefills from scratch
    cold = _first_position(engine_url, prompt, salt)
    warm = _first_position(engine_url, prompt, salt)
    warm_again = _first_position(engine_url, prompt, salt)

    # Prefilled the same way (from the prefix cache both times): bit-equal, ids and logprobs.
    assert warm_again == warm

    # Prefilled another way: the same distribution up to float error, within the documented bound.
    common = cold["top"].keys() & warm["top"].keys()
    assert len(common) >= TOP - 1  # a near-tie at the k-th place may swap one token in or out of the top k
    delta = max(abs(cold["top"][t] - warm["top"][t]) for t in common)
    print(f"cold vs warm prefill of {PROMPT_TOKENS} tokens: max |Δ logprob| over the top {TOP} = {delta:.6f}")
    assert delta <= RESCORE_BOUND
    if cold["token_ids"] != warm["token_ids"]:  # only a near-tie can flip the greedy token
        top_two = sorted(warm["top"].values(), reverse=True)[:2]
        assert top_two[0] - top_two[1] <= 2 * delta
