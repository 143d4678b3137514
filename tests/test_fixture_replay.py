"""Every real harness request replays through the proxy to the real engine, streaming and not, and the
official SDKs accept what comes back; the records hold exactly what the engine sampled."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import ProxyHandle, all_fixtures, load_fixture
from tests.helpers.clients import loopback, openai_client
from tests.helpers.lanes import lane
from tests.helpers.replay import assert_engine_sampled, path_model, send_fixture

MAX_TOKENS = 12


# One request per harness in make test (the render of every request: test_renderer.py); every request in test-full.
FIRST_PER_HARNESS = list({harness: (harness, name) for harness, name in reversed(all_fixtures())}.values())


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "nonstream"])
@pytest.mark.parametrize(("harness", "name"), lane(all_fixtures(), FIRST_PER_HARNESS, ids=lambda c: "-".join(c)))
def test_fixture_replays(proxy: ProxyHandle, engine_url: str, harness: str, name: str, stream: bool) -> None:
    fixture = load_fixture(harness, name)
    overrides = {"max_tokens": MAX_TOKENS, "temperature": 0.0}
    # The engine's logprobs depend on how a long prompt was prefilled (cold, partly or fully from the prefix cache:
    # test_engine_numerics.py measures it). The same call sent once before puts this prompt in the prefix cache, so
    # the recorded call and the direct re-query below are prefilled the same way and must agree bit for bit.
    send_fixture(proxy, proxy.session(sampling_overrides=overrides)["api_key"], fixture, stream)
    session = proxy.session(sampling_overrides=overrides)
    result = send_fixture(proxy, session["api_key"], fixture, stream)

    records = proxy.records(session["session_id"])
    assert len(records) == 1
    rec = records[0]
    assert rec["complete"] and rec["error"] is None
    named = fixture["body"]["model"] if "model" in fixture["body"] else "models/" + path_model(fixture)
    assert rec["request"]["model"] == named  # Google's API names it in the path
    assert rec["sampling"]["max_tokens"] == MAX_TOKENS and rec["sampling"]["temperature"] == 0.0
    assert len(rec["sampled_token_ids"]) == len(rec["sampled_logprobs"]) > 0
    assert rec["finish_reason"] == "length"  # random weights never stop within 12 tokens
    assert result["finish"] in ("length", "incomplete", "max_tokens")
    assert "<tool_call>" in rec["output_text"] or result["text"] == rec["output_text"]
    assert proxy.disk_records(session["session_id"]) == records  # durable copy equals the API's

    assert_engine_sampled(engine_url, "tiny-qwen3", rec)


def test_fixture_prompt_is_the_engine_render(proxy: ProxyHandle, engine_url: str) -> None:
    """A first call's prompt is the engine's own chat-template render of the normalised conversation."""
    fixture = load_fixture("pi", "tool_turn1.json")
    session = proxy.session(sampling_overrides={"max_tokens": 4})
    client = openai_client(proxy, session["api_key"])
    body = fixture["body"]
    client.chat.completions.create(model=body["model"], messages=body["messages"], extra_body={"tools": body["tools"]})
    rec = proxy.records(session["session_id"])[0]
    rendered = loopback.post(
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
