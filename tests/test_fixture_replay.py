"""Every real harness request replays through the proxy to the real engine, streaming and not, and the
official SDKs accept what comes back; the records hold exactly what the engine sampled."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.conftest import ProxyHandle, all_fixtures, load_fixture

MAX_TOKENS = 12


def _split(body: dict[str, Any], known: tuple[str, ...]) -> tuple[dict[str, Any], dict[str, Any]]:
    return {k: body[k] for k in known if k in body}, {k: v for k, v in body.items() if k not in known}


def _send(proxy: ProxyHandle, api_key: str, fixture: dict[str, Any], stream: bool) -> dict[str, Any]:
    """Send the fixture body with the SDK the harness family uses; return what the SDK assembled."""
    body = {**fixture["body"], "stream": stream}
    body.pop("stream_options", None) if not stream else None
    api = fixture["api"]
    if api == "chat-completions":
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=api_key, max_retries=0)
        known, extra = _split(body, ("model", "messages"))
        extra.pop("stream")
        if stream:
            with client.chat.completions.stream(**known, extra_body=extra) as s:
                for _ in s:
                    pass
                final = s.current_completion_snapshot  # get_final_completion() refuses finish_reason=length
        else:
            final = client.chat.completions.create(**known, extra_body=extra)
        msg = final.choices[0].message
        return {"text": msg.content or "", "finish": final.choices[0].finish_reason, "usage": final.usage}
    if api == "responses":
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=api_key, max_retries=0)
        known, extra = _split(body, ("model", "input"))
        extra.pop("stream")
        if stream:
            with client.responses.stream(**known, extra_body=extra) as s:
                for _ in s:
                    pass
                final = s.get_final_response()
        else:
            final = client.responses.create(**known, extra_body=extra)
        return {"text": final.output_text, "finish": final.status, "usage": final.usage}
    if api == "gemini-generate-content":
        return _send_gemini(proxy, api_key, fixture, stream)
    client = anthropic.Anthropic(base_url=proxy.url, api_key=api_key, max_retries=0)
    known, extra = _split(body, ("model", "messages", "max_tokens"))
    extra.pop("stream")
    if stream:
        with client.beta.messages.stream(**known, extra_body=extra) as s:
            for _ in s:
                pass
            final = s.get_final_message()
    else:
        final = client.beta.messages.create(**known, extra_body=extra, timeout=120)
    text = "".join(b.text for b in final.content if b.type == "text")
    return {"text": text, "finish": final.stop_reason, "usage": final.usage}


def _send_gemini(proxy: ProxyHandle, api_key: str, fixture: dict[str, Any], stream: bool) -> dict[str, Any]:
    """Google's own SDK (google-genai: the Python twin of the @google/genai that Gemini CLI bundles), the model named
    in the path as the harness named it."""
    from google import genai
    from google.genai import types

    body = fixture["body"]
    model = _path_model(fixture)
    client = genai.Client(api_key=api_key, http_options=types.HttpOptions(base_url=proxy.url))
    config = types.GenerateContentConfig.model_validate(
        {**body["generationConfig"], "systemInstruction": body.get("systemInstruction"), "tools": body.get("tools")}
    )
    if stream:
        chunks = list(client.models.generate_content_stream(model=model, contents=body["contents"], config=config))
    else:
        chunks = [client.models.generate_content(model=model, contents=body["contents"], config=config)]
    parts = [p for c in chunks for p in (c.candidates[0].content.parts or [])]
    finish = chunks[-1].candidates[0].finish_reason
    text = "".join(p.text for p in parts if p.text and not p.thought)
    return {"text": text, "finish": finish.name.lower() if finish else None, "usage": chunks[-1].usage_metadata}


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "nonstream"])
@pytest.mark.parametrize(("harness", "name"), all_fixtures())
def test_fixture_replays(proxy: ProxyHandle, engine_url: str, harness: str, name: str, stream: bool) -> None:
    fixture = load_fixture(harness, name)
    overrides = {"max_tokens": MAX_TOKENS, "temperature": 0.0}
    # The engine's logprobs depend on how a long prompt was prefilled (cold, partly or fully from the prefix cache:
    # test_engine_numerics.py measures it). The same call sent once before puts this prompt in the prefix cache, so
    # the recorded call and the direct re-query below are prefilled the same way and must agree bit for bit.
    _send(proxy, proxy.session(sampling_overrides=overrides)["api_key"], fixture, stream)
    session = proxy.session(sampling_overrides=overrides)
    result = _send(proxy, session["api_key"], fixture, stream)

    records = proxy.records(session["session_id"])
    assert len(records) == 1
    rec = records[0]
    assert rec["complete"] and rec["error"] is None
    named = fixture["body"]["model"] if "model" in fixture["body"] else "models/" + _path_model(fixture)
    assert rec["request"]["model"] == named  # Google's API names it in the path
    assert rec["sampling"]["max_tokens"] == MAX_TOKENS and rec["sampling"]["temperature"] == 0.0
    assert len(rec["sampled_token_ids"]) == len(rec["sampled_logprobs"]) > 0
    assert rec["finish_reason"] == "length"  # random weights never stop within 12 tokens
    assert result["finish"] in ("length", "incomplete", "max_tokens")
    assert "<tool_call>" in rec["output_text"] or result["text"] == rec["output_text"]
    assert proxy.disk_records(session["session_id"]) == records  # durable copy equals the API's

    assert_engine_sampled(engine_url, "tiny-qwen3", rec)


def _path_model(fixture: dict[str, Any]) -> str:
    return fixture["path"].split("/models/", 1)[1].split(":", 1)[0]


def assert_engine_sampled(engine_url: str, model: str, rec: dict[str, Any]) -> None:
    """The record's ids and logprobs are the engine's: the same prompt ids, sent directly (prefilled the same way:
    the caller sent the same call once before), sample the same tokens with the same logprobs, bit for bit."""
    direct = httpx.post(
        f"{engine_url}/v1/completions",
        json={
            "model": model,
            "prompt": rec["prompt_token_ids"],
            "max_tokens": rec["sampling"]["max_tokens"],
            "temperature": 0.0,
            "logprobs": 0,
            "return_token_ids": True,
        },
        timeout=60,
    ).json()["choices"][0]
    assert direct["token_ids"] == rec["sampled_token_ids"]
    assert direct["logprobs"]["token_logprobs"] == rec["sampled_logprobs"]


def test_fixture_prompt_is_the_engine_render(proxy: ProxyHandle, engine_url: str) -> None:
    """A first call's prompt is the engine's own chat-template render of the normalised conversation."""
    fixture = load_fixture("pi", "tool_turn1.json")
    session = proxy.session(sampling_overrides={"max_tokens": 4})
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=session["api_key"], max_retries=0)
    body = fixture["body"]
    client.chat.completions.create(model=body["model"], messages=body["messages"], extra_body={"tools": body["tools"]})
    rec = proxy.records(session["session_id"])[0]
    rendered = httpx.post(
        f"{engine_url}/tokenize",
        json={
            "model": "tiny-qwen3",
            "messages": [{"role": m["role"], "content": m["content"]} for m in body["messages"]]
            if isinstance(body["messages"][0]["content"], str)
            else _flat(body["messages"]),
            "tools": [
                {"type": "function", "function": {k: t["function"][k] for k in ("name", "description", "parameters")}}
                for t in body["tools"]
            ],  # the proxy drops per-tool flags like `strict`
            "add_generation_prompt": True,
        },
        timeout=30,
    ).json()["tokens"]
    assert rec["prompt_token_ids"] == rendered
    assert rec["render_reason"] == "first_call"


def _flat(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for m in messages:
        content = m["content"]
        if isinstance(content, list):
            content = "\n".join(p["text"] for p in content)
        out.append({"role": m["role"], "content": content})
    return out
