"""A captured harness request sent as its harness's SDK sends it (OpenAI Chat Completions and Responses, Anthropic
Messages, Google's GenAI), and the check that a record's ids and logprobs are the engine's."""

from __future__ import annotations

from typing import Any

from tests.conftest import ProxyHandle
from tests.helpers.clients import anthropic_client, gemini_client, loopback, openai_client


def _split(body: dict[str, Any], known: tuple[str, ...]) -> tuple[dict[str, Any], dict[str, Any]]:
    return {k: body[k] for k in known if k in body}, {k: v for k, v in body.items() if k not in known}


def send_fixture(proxy: ProxyHandle, api_key: str, fixture: dict[str, Any], stream: bool) -> dict[str, Any]:
    """Send the fixture body with the SDK the harness family uses; return what the SDK assembled."""
    body = {**fixture["body"], "stream": stream}
    body.pop("stream_options", None) if not stream else None
    api = fixture["api"]
    if api == "chat-completions":
        client = openai_client(proxy, api_key)
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
        client = openai_client(proxy, api_key)
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
        return send_gemini(proxy, api_key, fixture, stream)
    client = anthropic_client(proxy, api_key)
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


def send_gemini(proxy: ProxyHandle, api_key: str, fixture: dict[str, Any], stream: bool) -> dict[str, Any]:
    """Google's own SDK (google-genai: the Python twin of the @google/genai that Gemini CLI bundles), the model named
    in the path as the harness named it."""
    from google.genai import types

    body = fixture["body"]
    model = path_model(fixture)
    client = gemini_client(proxy, api_key)
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


def path_model(fixture: dict[str, Any]) -> str:
    return fixture["path"].split("/models/", 1)[1].split(":", 1)[0]


def assert_engine_sampled(engine_url: str, model: str, rec: dict[str, Any]) -> None:
    """The record's ids and logprobs are the engine's: the same prompt ids, sent directly (prefilled the same way:
    the caller sent the same call once before), sample the same tokens with the same logprobs, bit for bit."""
    direct = loopback.post(
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
