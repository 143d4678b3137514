"""An engine without ``/v1/models`` or ``/v1/completions`` — the routes NeMo-RL's vLLM HTTP server does not serve
(it has ``/v1/chat/completions`` and ``/tokenize``) — in front of the real engine: with ``served_model`` set, the
proxy serves ``chat_prefix`` sessions through it and records exact ids; without it, the call fails saying so."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from fastapi import FastAPI, Request, Response

from nemo_polar.proxy.serve import BackgroundServer
from tests.conftest import ProxyHandle, make_proxy

pytestmark = pytest.mark.engine


def nemo_rl_like(engine_url: str) -> FastAPI:
    """Only the two routes NeMo-RL's server has, forwarded to the real engine (non-streaming calls only)."""
    app = FastAPI()

    async def forward(request: Request) -> Response:
        async with httpx.AsyncClient(base_url=engine_url, timeout=120) as client:
            headers = {"content-type": "application/json"}
            resp = await client.post(request.url.path, content=await request.body(), headers=headers)
        return Response(resp.content, resp.status_code, media_type="application/json")

    app.post("/tokenize")(forward)
    app.post("/v1/chat/completions")(forward)
    return app


@pytest.fixture(scope="module")
def front(engine_url: str) -> Iterator[str]:
    with BackgroundServer(nemo_rl_like(engine_url)) as server:
        yield server.url


def chat(proxy: ProxyHandle, history: list[dict]) -> str:
    key = proxy.session(mode="chat_prefix", sampling_overrides={"max_tokens": 8})["api_key"]
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=key, max_retries=0, timeout=120)
    return client.chat.completions.create(model="local-model", messages=history).choices[0].message.content or ""


def test_chat_prefix_through_an_engine_without_a_model_list(front: str, engine_url: str, tmp_path: Path) -> None:
    assert httpx.get(f"{front}/v1/models").status_code == 404
    served = httpx.get(f"{engine_url}/v1/models").json()["data"][0]["id"]
    proxy_iter = make_proxy(front, tmp_path, served_model=served)
    proxy = next(proxy_iter)
    try:
        key = proxy.session(mode="chat_prefix", sampling_overrides={"max_tokens": 8})
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=key["api_key"], max_retries=0, timeout=120)
        history = [{"role": "user", "content": "hello"}]
        for turn in range(2):
            reply = client.chat.completions.create(model="local-model", messages=history)
            history += [{"role": "assistant", "content": reply.choices[0].message.content or ""}]
            history += [{"role": "user", "content": f"and {turn}?"}]
        first, second = proxy.records(key["session_id"])
        assert first["complete"] and second["complete"]
        assert first["sampled_token_ids"] and len(first["sampled_token_ids"]) == len(first["sampled_logprobs"])
        head = first["prompt_token_ids"] + first["sampled_token_ids"]
        assert second["prompt_token_ids"][: len(head)] == head  # the exact prefix NeMo-RL's server is asked to keep
    finally:
        proxy_iter.close()


def test_without_served_model_the_error_says_what_to_set(front: str, tmp_path: Path) -> None:
    proxy_iter = make_proxy(front, tmp_path)
    proxy = next(proxy_iter)
    try:
        with pytest.raises(openai.APIStatusError) as err:
            chat(proxy, [{"role": "user", "content": "hello"}])
        assert err.value.status_code == 502 and "set the proxy's served_model" in str(err.value)
    finally:
        proxy_iter.close()
