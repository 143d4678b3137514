"""Bad input gets a provider-shaped error, is recorded as a failed call, and breaks nothing.

Engine faults that the real engine cannot produce on demand (5xx, a connection dropped mid-stream, a long silent
prefill) are injected with a small fake engine; everything else runs against the real one.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from nemo_polar.proxy.http.serve import BackgroundServer as Server
from nemo_polar.proxy.store.records import CallRecord
from tests.conftest import ProxyHandle, free_port, make_proxy
from tests.helpers.clients import anthropic_client, loopback, openai_client

CHAT = {"model": "local-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def post(proxy: ProxyHandle, key: str | None, path: str, body: Any, **headers: str) -> httpx.Response:
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    hdrs = {"content-type": "application/json", **headers}
    if key:
        hdrs["authorization"] = f"Bearer {key}"
    return loopback.post(f"{proxy.url}{path}", content=data, headers=hdrs, timeout=60)


BAD_REQUESTS = {
    "malformed_json": ("/v1/chat/completions", b'{"model": "local-model", "messages": [', 400),
    "empty_body": ("/v1/chat/completions", b"", 400),
    "not_an_object": ("/v1/chat/completions", b"[1, 2]", 400),
    "messages_wrong_type": ("/v1/chat/completions", {"model": "local-model", "messages": "hi"}, 400),
    "max_tokens_wrong_type": ("/v1/chat/completions", {**CHAT, "max_tokens": "four"}, 400),
    "empty_messages": ("/v1/chat/completions", {"model": "local-model", "messages": []}, 400),
    "bad_role": (
        "/v1/chat/completions",
        {"model": "local-model", "messages": [{"role": "robot", "content": "x"}]},
        400,
    ),
    "unknown_model": ("/v1/chat/completions", {**CHAT, "model": "gpt-9"}, 404),
    "tool_schema_not_object": (
        "/v1/chat/completions",
        {**CHAT, "tools": [{"type": "function", "function": {"name": "f", "parameters": "yes"}}]},
        400,
    ),
    "tool_without_name": ("/v1/chat/completions", {**CHAT, "tools": [{"type": "function", "function": {}}]}, 400),
    "context_overflow": ("/v1/chat/completions", {**CHAT, "max_tokens": 10_000_000}, 400),
    "empty_input": ("/v1/responses", {"model": "local-model", "input": []}, 400),
    "input_wrong_type": ("/v1/responses", {"model": "local-model", "input": 5}, 400),
    "anthropic_missing_max_tokens": (
        "/v1/messages",
        {"model": "local-model", "messages": [{"role": "user", "content": "x"}]},
        400,
    ),
    "anthropic_empty_messages": ("/v1/messages", {"model": "local-model", "max_tokens": 5, "messages": []}, 400),
    "anthropic_unknown_model": (
        "/v1/messages",
        {"model": "claude-x", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]},
        404,
    ),
    "unsupported_encoding": ("/v1/chat/completions", {**CHAT}, 415),
}


@pytest.mark.parametrize("case", sorted(BAD_REQUESTS))
def test_bad_request_is_rejected_and_recorded(proxy: ProxyHandle, case: str) -> None:
    path, body, status = BAD_REQUESTS[case]
    session = proxy.session()
    headers = {"content-encoding": "br"} if case == "unsupported_encoding" else {}
    resp = post(proxy, session["api_key"], path, body, **headers)
    assert resp.status_code == status, resp.text
    err = resp.json()
    if path == "/v1/messages":
        assert err["type"] == "error" and err["error"]["type"] in ("invalid_request_error", "not_found_error")
        message = err["error"]["message"]
    else:
        assert err["error"]["type"] in ("invalid_request_error", "not_found_error")
        message = err["error"]["message"]
    assert len(message) > 10
    if case == "context_overflow":
        assert err["error"]["code"] == "context_length_exceeded"

    [rec] = proxy.records(session["session_id"])
    assert rec["error"] == message and rec["status_code"] == status and not rec["complete"]
    assert rec["sampled_token_ids"] == []
    assert CallRecord.model_validate(rec).refused  # refused before sampling: Gym's capture resolves it, no mask
    if case == "context_overflow":
        assert rec["error_code"] == "context_length_exceeded"
    assert rec["request"] is not None or body == b""  # the body is kept, even when it is not JSON
    assert proxy.disk_records(session["session_id"]) == [rec]
    # the session still works
    ok = post(proxy, session["api_key"], "/v1/chat/completions", CHAT)
    assert ok.status_code == 200


def test_unknown_key_is_401_and_creates_nothing(proxy: ProxyHandle) -> None:
    before = len(proxy.apps.proxy.sessions)
    for path, body in (("/v1/chat/completions", CHAT), ("/v1/responses", {"model": "local-model", "input": "x"})):
        resp = post(proxy, "sk-unknown", path, body)
        assert resp.status_code == 401 and resp.json()["error"]["type"] == "authentication_error"
    resp = loopback.post(f"{proxy.url}/v1/messages", headers={"x-api-key": "nope"}, json={}, timeout=10)
    assert resp.status_code == 401 and resp.json()["error"]["type"] == "authentication_error"
    assert post(proxy, None, "/v1/chat/completions", CHAT).status_code == 401
    assert len(proxy.apps.proxy.sessions) == before
    with pytest.raises(anthropic.AuthenticationError):
        anthropic_client(proxy, "nope").messages.create(
            model="local-model", max_tokens=4, messages=[{"role": "user", "content": "x"}]
        )


def test_closed_session_rejects_calls(proxy: ProxyHandle) -> None:
    session = proxy.session()
    assert post(proxy, session["api_key"], "/v1/chat/completions", CHAT).status_code == 200
    closed = proxy.admin("DELETE", f"/polar/sessions/{session['session_id']}", timeout=10).json()
    assert closed == {"session_id": session["session_id"], "closed": True, "records": 1}
    assert post(proxy, session["api_key"], "/v1/chat/completions", CHAT).status_code == 401
    assert len(proxy.records(session["session_id"])) == 1  # records stay readable


def test_sdk_sees_typed_errors(proxy: ProxyHandle) -> None:
    session = proxy.session()
    client = openai_client(proxy, session["api_key"])
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.responses.create(model="local-model", input="x", max_output_tokens=10_000_000)
    aclient = anthropic_client(proxy, session["api_key"])
    with pytest.raises(anthropic.BadRequestError):
        aclient.messages.create(model="local-model", max_tokens=4, messages=[])


@pytest.fixture
def small_proxy(engine_url: str, tmp_path: Path) -> Iterator[ProxyHandle]:
    yield from make_proxy(engine_url, tmp_path, max_body_bytes=4096)


def test_oversized_body_is_413(small_proxy: ProxyHandle) -> None:
    session = small_proxy.session()
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * 10_000}]}
    resp = post(small_proxy, session["api_key"], "/v1/chat/completions", big)
    assert resp.status_code == 413 and "limit of 4096 bytes" in resp.json()["error"]["message"]
    [rec] = small_proxy.records(session["session_id"])
    assert rec["status_code"] == 413 and not rec["complete"]


# -- engine faults ------------------------------------------------------------------------------------------


def fake_engine(behaviour: str) -> FastAPI:
    """An engine that answers like vLLM until the fault it injects."""
    app = FastAPI()

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"data": [{"id": "tiny-qwen3", "max_model_len": 4096}]}

    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict[str, Any]:
        body = await request.json()
        return {"tokens": [151645] if body.get("prompt") == "<|im_end|>" else [151644, 872, 198, 151645]}

    def chunk(text: str, ids: list[int], finish: str | None = None, prompt: list[int] | None = None) -> str:
        choice = {
            "index": 0,
            "text": text,
            "token_ids": ids,
            "finish_reason": finish,
            "logprobs": {"token_logprobs": [-0.5] * len(ids), "tokens": [text]},
        }
        if prompt is not None:
            choice["prompt_token_ids"] = prompt
        return f"data: {json.dumps({'choices': [choice]})}\n\n"

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        body = await request.json()
        if behaviour == "500":
            return JSONResponse({"error": {"message": "EngineDeadError"}}, status_code=500)

        echo = [*body["prompt"][:-1], 7] if behaviour == "echo_other" else body["prompt"]
        if not body.get("stream"):
            if behaviour == "die":
                raise RuntimeError("engine worker died")  # the client sees a 500 and no body
            ids = [1, 2, 3, 151645]
            choice = {
                "index": 0,
                "text": "Hello",
                "token_ids": ids,
                "prompt_token_ids": echo,
                "finish_reason": "stop",
                "logprobs": {"token_logprobs": [-0.5] * 4},
            }
            if behaviour == "echo_spaced":  # the same ids, not written as the proxy wrote them
                return Response(json.dumps({"choices": [choice]}, indent=1), media_type="application/json")
            return {"choices": [choice]}  # compact, as vLLM writes it

        async def stream() -> Any:
            yield chunk("Hel", [1, 2], prompt=echo)
            if behaviour == "slow":
                await asyncio.sleep(1.2)
            yield chunk("lo", [3])
            if behaviour == "die":
                raise RuntimeError("engine worker died")  # uvicorn drops the connection mid-body
            yield chunk("", [151645], finish="stop")
            yield "data: [DONE]\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    return app


@pytest.fixture
def faulty(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ProxyHandle]:
    with Server(fake_engine(request.param)) as engine:
        yield from make_proxy(engine.url, tmp_path, keepalive_s=0.3)


@pytest.mark.parametrize("faulty", ["500"], indirect=True)
def test_engine_5xx_is_502_and_recorded(faulty: ProxyHandle) -> None:
    session = faulty.session()
    resp = post(
        faulty,
        session["api_key"],
        "/v1/messages",
        {"model": "local-model", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]},
    )
    assert resp.status_code == 502 and resp.json()["type"] == "error"
    assert resp.json()["error"]["type"] == "api_error"
    [rec] = faulty.records(session["session_id"])
    assert rec["status_code"] == 502 and "EngineDeadError" in rec["error"] and not rec["complete"]


@pytest.mark.parametrize("faulty", ["die"], indirect=True)
@pytest.mark.parametrize("stream", [True, False])
def test_engine_dying_mid_stream(faulty: ProxyHandle, stream: bool) -> None:
    session = faulty.session()
    client = openai_client(faulty, session["api_key"])
    with pytest.raises(openai.APIError):
        if stream:
            for _ in client.chat.completions.create(**{**CHAT, "stream": True}):
                pass
        else:
            client.chat.completions.create(**CHAT)
    [rec] = faulty.records(session["session_id"])
    assert not rec["complete"] and rec["error"] and rec["finish_reason"] is None and rec["status_code"] == 502
    # what arrived is kept, marked incomplete
    assert rec["sampled_token_ids"] == ([1, 2, 3] if stream else [])
    assert faulty.disk_records(session["session_id"]) == [rec]


@pytest.mark.parametrize("faulty", ["echo_compact", "echo_spaced", "echo_other"], indirect=True)
@pytest.mark.parametrize("stream", [True, False])
def test_the_prompt_the_engine_echoes_is_checked(
    faulty: ProxyHandle, stream: bool, request: pytest.FixtureRequest
) -> None:
    """The engine's echo of the prompt is the exactness check: the same ids, however written, complete the call (the
    stream's chunks are written with spaces, the whole answer compact or indented); other ids fail it, recorded."""
    session = faulty.session()
    resp = post(faulty, session["api_key"], "/v1/chat/completions", {**CHAT, "stream": stream})
    [rec] = faulty.records(session["session_id"])
    if request.node.callspec.params["faulty"] == "echo_other":
        assert not rec["complete"] and rec["error_code"] == "prompt_mismatch" and rec["status_code"] == 502
        assert resp.status_code == (200 if stream else 502)  # a stream has begun: its error is an event
        assert "different prompt" in resp.text
    else:
        assert resp.status_code == 200 and rec["complete"] and rec["error"] is None
        assert rec["prompt_token_ids"] == [151644, 872, 198, 151645]


@pytest.mark.parametrize("faulty", ["slow"], indirect=True)
def test_keepalives_while_the_engine_is_silent(faulty: ProxyHandle) -> None:
    session = faulty.session()
    body = {"model": "local-model", "max_tokens": 5, "stream": True, "messages": [{"role": "user", "content": "x"}]}
    with loopback.stream(
        "POST", f"{faulty.url}/v1/messages", json=body, headers={"x-api-key": session["api_key"]}, timeout=30
    ) as resp:
        raw = "".join(resp.iter_text())
    assert raw.count("event: ping") >= 2
    assert raw.index("event: message_start") < raw.index("event: ping") < raw.index("event: message_stop")
    client = anthropic_client(faulty, session["api_key"])
    with client.messages.stream(model="local-model", max_tokens=5, messages=body["messages"]) as s:
        assert s.get_final_text() == "Hello"


def test_engine_unreachable(tmp_path: Path) -> None:
    for proxy in make_proxy(f"http://127.0.0.1:{free_port()}", tmp_path):
        session = proxy.session()
        resp = post(proxy, session["api_key"], "/v1/chat/completions", CHAT)
        assert resp.status_code == 502 and "engine unreachable" in resp.json()["error"]["message"]
        [rec] = proxy.records(session["session_id"])
        assert rec["status_code"] == 502 and not rec["complete"]


@pytest.mark.parametrize("faulty", ["slow"], indirect=True)
def test_openai_keepalives_are_sse_comments(faulty: ProxyHandle) -> None:
    session = faulty.session()
    body = {**CHAT, "stream": True}
    headers = {"authorization": f"Bearer {session['api_key']}"}
    with loopback.stream("POST", f"{faulty.url}/v1/chat/completions", json=body, headers=headers, timeout=30) as resp:
        raw = "".join(resp.iter_text())
    assert ": keep-alive\n\n" in raw and raw.rstrip().endswith("data: [DONE]")
    client = openai_client(faulty, session["api_key"])
    chunks = list(client.chat.completions.create(**body))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello"


# @google/genai's processStreamResponse (responseLineRE, as bundled in npm @google/gemini-cli 0.61.0,
# bundle/chunk-JDPZ4CE3.js) reads frames only with this pattern, from the start of its buffer: anything else (an SSE
# comment) stays there and fails the stream at its end.
GENAI_FRAME = re.compile(r"^\s*data: (.*)(?:\n\n|\r\r|\r\n\r\n)")


@pytest.mark.parametrize("faulty", ["slow"], indirect=True)
def test_a_silent_engine_sends_nothing_a_gemini_client_cannot_parse(faulty: ProxyHandle) -> None:
    session = faulty.session()
    url = f"{faulty.url}/v1beta/models/local-model:streamGenerateContent?alt=sse"
    body = {"contents": [{"role": "user", "parts": [{"text": "x"}]}]}
    with loopback.stream("POST", url, json=body, headers={"x-goog-api-key": session["api_key"]}, timeout=30) as resp:
        raw = "".join(resp.iter_text())
    frames = []
    while match := GENAI_FRAME.match(raw):
        frames.append(json.loads(match[1]))
        raw = raw[match.end() :]
    assert raw.strip() == ""  # the SDK's "Incomplete JSON segment at the end" otherwise
    text = "".join(p.get("text", "") for f in frames for c in f.get("candidates", []) for p in c["content"]["parts"])
    assert text == "Hello" and frames[-1]["candidates"][0]["finishReason"] == "STOP"


def test_gzip_body_is_accepted(proxy: ProxyHandle) -> None:
    import gzip

    session = proxy.session()
    resp = post(
        proxy,
        session["api_key"],
        "/v1/chat/completions",
        gzip.compress(json.dumps(CHAT).encode()),
        **{"content-encoding": "gzip"},
    )
    assert resp.status_code == 200, resp.text
    assert proxy.records(session["session_id"])[0]["request"] == CHAT


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
def test_a_proxy_bug_is_an_api_shaped_500_with_a_record(
    proxy: ProxyHandle, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """Whatever goes wrong inside the proxy before the engine answers is still answered in the API's error shape
    and recorded as a failed call (not a bare 500 that resets the connection and leaves no trace)."""
    import nemo_polar.proxy.http.proxy as app

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("planted fault")

    monkeypatch.setattr(app, "plan", broken)
    session = proxy.session()
    resp = post(proxy, session["api_key"], path, CHAT)
    assert resp.status_code == 500
    body = resp.json()
    error = body["error"]
    assert "planted fault" in error["message"]
    assert (
        (body["type"] == "error" and error["type"] == "api_error")
        if path == "/v1/messages"
        else (error["type"] == "server_error" and error["code"] == "proxy_error")
    )
    [rec] = proxy.records(session["session_id"])
    assert rec["status_code"] == 500 and not rec["complete"] and "planted fault" in rec["error"]
