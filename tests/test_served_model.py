"""``chat_prefix`` through an engine shaped like NeMo-RL's vLLM HTTP server, and through stock vLLM.

NeMo-RL's server has ``/v1/chat/completions`` and ``/tokenize`` but no ``/v1/models`` (nor ``/v1/completions``), so
the proxy is given ``served_model``. On a call that extends an earlier one it sends the earlier call's exact ids as
``required_prefix_token_ids`` (and ``prompt_token_ids``/``generation_token_ids`` on the last assistant message).
NeMo-RL's server splices those ids into the prompt it re-renders from the messages; stock vLLM ignores them and
re-renders the history canonically. :class:`NemoRlLike` reproduces NeMo-RL's rule in front of the real engine, and
the tests check both behaviours.

The engine has random weights, so nothing here may depend on what it samples: every reply is pinned down with
vLLM's ``allowed_token_ids`` (only the single-character tokens below) plus structured outputs (the session's
``script``). The engine still samples the ids and their logprobs, but the only ids it can sample spell the text one
character per token: a tokenisation the canonical one (``"hello"``, ``" world"``) never matches, which is exactly
where re-rendering the history differs from what the model produced.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from nemo_polar.proxy.http.serve import BackgroundServer
from tests.conftest import ProxyHandle, make_proxy
from tests.helpers.clients import loopback, openai_client

pytestmark = pytest.mark.engine

TEXT = "hello world"


def replace_prefix_tokens(
    eos_token_id: int, model_prefix_token_ids: list[int], template_prefix_token_ids: list[int], template: list[int]
) -> list[int]:
    """NeMo-RL's splice, restated from ``nemo_rl/models/generation/openai_server_utils.py::replace_prefix_tokens``
    (NVIDIA-NeMo/RL @ 7ea279abfbeb698b092856d0dab61e7cf39bc909).

    ``template`` is the server's own render of the request's messages; ``template_prefix_token_ids`` its render of the
    messages up to and including the last assistant message, without a generation prompt. The boundary is found by
    counting EOS tokens (``tokenizer.eos_token_id``), not by position: with N EOS tokens in the prefix render, the
    prompt is the required ids, less a trailing EOS (the model may have stopped on max_tokens instead), followed by
    the template from its N-th EOS on. Too few EOS tokens in the template is an AssertionError.
    """
    if not model_prefix_token_ids:
        return template
    model_cut_end = len(model_prefix_token_ids)
    if model_prefix_token_ids[-1] == eos_token_id:
        model_cut_end -= 1
    count_needed = template_prefix_token_ids.count(eos_token_id)
    count_seen = 0
    for pos, tid in enumerate(template):
        if tid == eos_token_id:
            count_seen += 1
            if count_seen == count_needed:
                return model_prefix_token_ids[:model_cut_end] + template[pos:]
    raise AssertionError(f"EOS token #{count_needed} not found in template_token_ids (only {count_seen} in total)")


def required_prefix(body: dict[str, Any]) -> list[int] | None:
    """NeMo-RL's ``NeMoRLOpenAIChatRequestMixin.model_post_init`` (``nemo_rl/models/generation/vllm/
    vllm_worker_async.py``, same commit): ``required_prefix_token_ids`` if given, else the ``prompt_token_ids`` +
    ``generation_token_ids`` of the last message that carries ``prompt_token_ids`` (how NeMo-Gym echoes them)."""
    prefix = body.get("required_prefix_token_ids")
    if prefix is None:
        for message in reversed(body.get("messages") or []):
            if "prompt_token_ids" in message:
                return message["prompt_token_ids"] + message["generation_token_ids"]
    return prefix


class NemoRlLike:
    """The two routes NeMo-RL's vLLM HTTP server has, in front of the real engine (non-streaming calls only).

    ``honour_prefix=True`` does what NeMo-RL's ``NeMoRLOpenAIServingMixin.preprocess_chat``
    (``vllm_worker_async.py``, same commit) does for a request with a required prefix: render the messages (the
    engine's ``/tokenize``, as vLLM's chat path would), render them up to the last assistant message without a
    generation prompt, splice with :func:`replace_prefix_tokens`, and generate from the spliced ids with the rest of
    the chat path unchanged. Generating from ids goes through the stock engine's ``/v1/chat/completions`` with
    ``kv_transfer_params.prompt_token_ids`` (vLLM's decode-side prompt reuse, vllm-project/vllm#48145), so output
    parsing, logprobs and ``return_token_ids`` are the engine's own; a response whose prompt is not the spliced ids
    fails the call rather than passing as stock behaviour. Also as NeMo-RL: ``return_tokens_as_token_ids`` defaults
    to true, ``logprobs`` then requires ``top_logprobs``, and each message gets ``prompt_token_ids``,
    ``generation_token_ids`` and ``generation_log_probs``. Not reproduced, since they do not touch the prompt: the
    check that sampling equals the trainer's, max_tokens clamping, the logprob floor.

    ``honour_prefix=False`` forwards unchanged: stock vLLM behind NeMo-RL's routes. ``chat_bodies`` keeps every chat
    request as the proxy sent it.
    """

    def __init__(self, engine_url: str, *, honour_prefix: bool) -> None:
        self.engine_url = engine_url
        self.honour_prefix = honour_prefix
        self.chat_bodies: list[dict[str, Any]] = []
        card = loopback.get(f"{engine_url}/v1/models", timeout=30).json()["data"][0]
        tokenizer_config = json.loads((Path(card["root"]) / "tokenizer_config.json").read_text())
        eos = tokenizer_config["eos_token"]
        eos = eos["content"] if isinstance(eos, dict) else eos
        body = {"model": card["id"], "prompt": eos, "add_special_tokens": False}
        (self.eos_token_id,) = loopback.post(f"{engine_url}/tokenize", json=body, timeout=30).json()["tokens"]
        self.app = FastAPI()
        self.app.post("/tokenize")(self.tokenize)
        self.app.post("/v1/chat/completions")(self.chat)

    async def _post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        async with httpx.AsyncClient(base_url=self.engine_url, timeout=120) as client:
            return await client.post(path, json=body)

    async def _tokens(self, body: dict[str, Any]) -> list[int]:
        resp = await self._post("/tokenize", body)
        resp.raise_for_status()
        return resp.json()["tokens"]

    async def _spliced(self, body: dict[str, Any], prefix: list[int]) -> list[int]:
        messages = body["messages"]
        keys = ("model", "tools", "chat_template_kwargs", "add_generation_prompt", "continue_final_message")
        render = {k: body[k] for k in keys if k in body}
        template = await self._tokens({**render, "messages": messages})
        last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=len(messages) - 1)
        upto = {**render, "messages": messages[: last + 1], "add_generation_prompt": False}
        upto.pop("continue_final_message", None)
        return replace_prefix_tokens(self.eos_token_id, prefix, await self._tokens(upto), template)

    async def tokenize(self, request: Request) -> Response:
        body = await request.json()
        prefix = required_prefix(body) if "messages" in body else None
        if not self.honour_prefix or prefix is None:
            resp = await self._post("/tokenize", body)
            return Response(resp.content, resp.status_code, media_type="application/json")
        tokens = await self._spliced(body, prefix)
        return JSONResponse({"count": len(tokens), "max_model_len": None, "tokens": tokens, "token_strs": None})

    async def chat(self, request: Request) -> Response:
        body = await request.json()
        self.chat_bodies.append(copy.deepcopy(body))
        if body.get("stream"):
            return JSONResponse({"error": {"message": "this test server does not stream", "code": 400}}, 400)
        if not self.honour_prefix:
            resp = await self._post("/v1/chat/completions", body)
            return Response(resp.content, resp.status_code, media_type="application/json")
        body.setdefault("return_tokens_as_token_ids", True)
        if body.get("logprobs") and body["return_tokens_as_token_ids"] and body.get("top_logprobs") is None:
            message = "`top_logprobs` must be set when requesting token information from the NeMo-RL chat endpoint."
            return JSONResponse({"error": {"message": message, "code": 400}}, 400)
        prefix = required_prefix(body)
        body.pop("required_prefix_token_ids", None)
        prompt = None
        if prefix is not None:
            try:
                prompt = await self._spliced(body, prefix)
            except AssertionError as exc:
                return JSONResponse({"error": {"message": str(exc), "code": 500}}, 500)
            body["kv_transfer_params"] = {**(body.get("kv_transfer_params") or {}), "prompt_token_ids": prompt}
        resp = await self._post("/v1/chat/completions", body)
        if resp.status_code != 200:
            return Response(resp.content, resp.status_code, media_type="application/json")
        out = resp.json()
        if prompt is not None and (
            out["usage"]["prompt_tokens"] != len(prompt) or out.get("prompt_token_ids", prompt) != prompt
        ):
            message = "the engine did not generate from the spliced prompt (kv_transfer_params.prompt_token_ids)"
            return JSONResponse({"error": {"message": message, "code": 500}}, 500)
        for choice in out["choices"]:
            content = (choice.get("logprobs") or {}).get("content")
            if content is not None and "prompt_token_ids" in out and "token_ids" in choice:
                choice["message"]["prompt_token_ids"] = out["prompt_token_ids"]
                choice["message"]["generation_token_ids"] = choice["token_ids"]
                choice["message"]["generation_log_probs"] = [entry["logprob"] for entry in content]
        return JSONResponse(out)


def serve(engine_url: str, *, honour_prefix: bool) -> Iterator[tuple[str, NemoRlLike]]:
    front = NemoRlLike(engine_url, honour_prefix=honour_prefix)
    with BackgroundServer(front.app) as server:
        assert loopback.get(f"{server.url}/v1/models").status_code == 404
        assert loopback.post(f"{server.url}/v1/completions", json={}).status_code in (404, 405)
        yield server.url, front


@pytest.fixture(scope="module")
def nemo_rl(engine_url: str) -> Iterator[tuple[str, NemoRlLike]]:
    yield from serve(engine_url, honour_prefix=True)


@pytest.fixture(scope="module")
def stock(engine_url: str) -> Iterator[tuple[str, NemoRlLike]]:
    yield from serve(engine_url, honour_prefix=False)


def tokenize(engine_url: str, **body: Any) -> list[int]:
    return loopback.post(f"{engine_url}/tokenize", json={"model": "tiny-qwen3", **body}, timeout=30).json()["tokens"]


def detokenize(engine_url: str, tokens: list[int]) -> str:
    return loopback.post(f"{engine_url}/detokenize", json={"model": "tiny-qwen3", "tokens": tokens}, timeout=30).json()[
        "prompt"
    ]


@pytest.fixture(scope="module")
def chars(engine_url: str) -> dict[str, int]:
    """The single-character token of each character of TEXT: the only tokens the engine may sample here."""
    ids = {c: tokenize(engine_url, prompt=c, add_special_tokens=False) for c in sorted(set(TEXT))}
    assert all(len(v) == 1 for v in ids.values())
    return {c: v[0] for c, v in ids.items()}


def spelled(chars: dict[str, int], text: str) -> list[int]:
    return [chars[c] for c in text]


def pinned_session(proxy: ProxyHandle, chars: dict[str, int], eos: int, script: list[str]) -> dict[str, str]:
    """A chat_prefix session whose calls can only sample single characters of TEXT (and EOS)."""
    return proxy.session(
        mode="chat_prefix",
        script=script,
        extra_body={"allowed_token_ids": sorted({*chars.values(), eos})},
        sampling_overrides={"max_tokens": 16, "temperature": 1.0, "top_p": 1.0},
    )


def test_chat_prefix_through_an_engine_without_a_model_list(
    nemo_rl: tuple[str, NemoRlLike], engine_url: str, chars: dict[str, int], tmp_path: Path
) -> None:
    """Through NeMo-RL's rule, each call's prompt starts with the previous call's exact prompt + sampled ids."""
    url, front = nemo_rl
    eos = front.eos_token_id
    served = loopback.get(f"{engine_url}/v1/models").json()["data"][0]["id"]
    proxy_iter = make_proxy(url, tmp_path, served_model=served)
    proxy = next(proxy_iter)
    try:
        key = pinned_session(proxy, chars, eos, script=[TEXT, TEXT, TEXT])
        client = openai_client(proxy, key["api_key"], timeout=120)
        history: list[dict[str, Any]] = [{"role": "user", "content": "hello"}]
        # The second call is cut short by max_tokens: its ids end without EOS, NeMo-RL's other case.
        for turn, max_tokens in enumerate([16, 5, 16]):
            reply = client.chat.completions.create(model="local-model", messages=history, max_tokens=max_tokens)
            message = reply.choices[0].message
            history += [{"role": "assistant", "content": message.content}, {"role": "user", "content": f"and {turn}?"}]
        first, second, third = proxy.records(key["session_id"])
    finally:
        proxy_iter.close()

    for r in (first, second, third):
        assert r["complete"] and len(r["sampled_token_ids"]) == len(r["sampled_logprobs"])
    assert first["sampled_token_ids"] == [*spelled(chars, TEXT), eos] and first["finish_reason"] == "stop"
    assert second["sampled_token_ids"] == spelled(chars, "hello") and second["finish_reason"] == "length"
    assert [r["render_reason"] for r in (first, second, third)] == [
        "engine_render:first_call",
        "engine_render:continuation",
        "engine_render:continuation",
    ]
    # The proxy asked for the exact ids, both ways NeMo-RL reads them.
    sent = front.chat_bodies[-2:]
    for parent, body in zip((first, second), sent, strict=True):
        head = parent["prompt_token_ids"] + parent["sampled_token_ids"]
        assert body["required_prefix_token_ids"] == head
        echoed = body["messages"][-2]
        assert echoed["prompt_token_ids"] + echoed["generation_token_ids"] == head

    # Each prompt starts with the previous call's exact prompt + sampled ids, then the template's new turn, cut at
    # the EOS that closes the assistant turn: the sampled EOS is kept (first call) or the template's added (second).
    head1 = first["prompt_token_ids"] + first["sampled_token_ids"]
    assert second["prompt_token_ids"][: len(head1)] == head1
    tail = "\n<|im_start|>user\nand 0?<|im_end|>\n<|im_start|>assistant\n"
    assert detokenize(engine_url, second["prompt_token_ids"][len(head1) :]) == tail
    head2 = second["prompt_token_ids"] + second["sampled_token_ids"]
    assert third["prompt_token_ids"][: len(head2)] == head2
    tail = "<|im_end|>\n<|im_start|>user\nand 1?<|im_end|>\n<|im_start|>assistant\n"
    assert detokenize(engine_url, third["prompt_token_ids"][len(head2) :]) == tail

    # Re-rendering the history (what stock vLLM does) would have lost the sampled ids.
    canonical = tokenize(engine_url, messages=history[:-2], add_generation_prompt=True)
    assert canonical != third["prompt_token_ids"] and canonical[: len(head1)] != head1
    assert detokenize(engine_url, canonical) == detokenize(engine_url, third["prompt_token_ids"])


def test_stock_vllm_ignores_required_prefix_token_ids(
    stock: tuple[str, NemoRlLike], engine_url: str, chars: dict[str, int], tmp_path: Path
) -> None:
    """Stock vLLM accepts ``required_prefix_token_ids`` and ignores it: the next prompt is the canonical re-render,
    so in ``chat_prefix`` mode against stock vLLM the records are not token-exact across calls."""
    url, front = stock
    eos = front.eos_token_id
    served = loopback.get(f"{engine_url}/v1/models").json()["data"][0]["id"]
    proxy_iter = make_proxy(url, tmp_path, served_model=served)
    proxy = next(proxy_iter)
    try:
        key = pinned_session(proxy, chars, eos, script=[TEXT, TEXT])
        client = openai_client(proxy, key["api_key"], timeout=120)
        history: list[dict[str, Any]] = [{"role": "user", "content": "hello"}]
        reply = client.chat.completions.create(model="local-model", messages=history)
        history += [{"role": "assistant", "content": reply.choices[0].message.content}]
        history += [{"role": "user", "content": "and 0?"}]
        client.chat.completions.create(model="local-model", messages=history)
        first, second = proxy.records(key["session_id"])
    finally:
        proxy_iter.close()

    assert first["sampled_token_ids"] == [*spelled(chars, TEXT), eos]
    head = first["prompt_token_ids"] + first["sampled_token_ids"]
    assert front.chat_bodies[-1]["required_prefix_token_ids"] == head  # asked for, and accepted without complaint
    assert second["render_reason"] == "engine_render:continuation"
    # ...but the prompt is the engine's canonical render of the history: "hello", " world", not the sampled letters.
    assert second["prompt_token_ids"] == tokenize(engine_url, messages=history, add_generation_prompt=True)
    assert second["prompt_token_ids"][: len(head)] != head
    start, canonical_text = len(first["prompt_token_ids"]), tokenize(engine_url, prompt=TEXT, add_special_tokens=False)
    assert second["prompt_token_ids"][start : start + 3] == [*canonical_text, eos]


def test_without_served_model_the_error_says_what_to_set(nemo_rl: tuple[str, NemoRlLike], tmp_path: Path) -> None:
    proxy_iter = make_proxy(nemo_rl[0], tmp_path)
    proxy = next(proxy_iter)
    try:
        key = proxy.session(mode="chat_prefix", sampling_overrides={"max_tokens": 8})["api_key"]
        client = openai_client(proxy, key, timeout=120)
        with pytest.raises(openai.APIStatusError) as err:
            client.chat.completions.create(model="local-model", messages=[{"role": "user", "content": "hello"}])
        assert err.value.status_code == 502 and "set the proxy's served_model" in str(err.value)
    finally:
        proxy_iter.close()
