"""With real weights (SmolLM2-135M-Instruct) the proxy streams real text and records the exact tokens."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import ProxyHandle, make_proxy
from tests.helpers.clients import anthropic_client, loopback


@pytest.fixture(scope="module")
def smol_proxy(smollm2_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyHandle]:
    yield from make_proxy(smollm2_url, tmp_path_factory.mktemp("smol"))


def test_real_answer_streams_and_continues(smol_proxy: ProxyHandle, smollm2_url: str) -> None:
    session = smol_proxy.session(sampling_overrides={"temperature": 0.0, "max_tokens": 40})
    client = anthropic_client(smol_proxy, session["api_key"])
    messages = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
    deltas: list[str] = []
    with client.messages.stream(model="local-model", max_tokens=40, messages=messages) as stream:
        for text in stream.text_stream:
            deltas.append(text)
        answer = stream.get_final_message()
    text = "".join(deltas)
    assert "Paris" in text and len(deltas) > 1  # streamed incrementally, not in one synthesized chunk
    assert answer.stop_reason == "end_turn"

    messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "And of Italy?"}]
    second = client.messages.create(model="local-model", max_tokens=40, messages=messages)
    assert "Rome" in second.content[0].text

    r1, r2 = smol_proxy.records(session["session_id"])
    assert r1["sampled_token_ids"][-1] == 2  # <|im_end|> sampled by the model
    detok = loopback.post(f"{smollm2_url}/detokenize", json={"tokens": r1["sampled_token_ids"][:-1]}).json()["prompt"]
    assert detok == r1["output_text"] == text
    assert r2["prompt_token_ids"][: len(r1["prompt_token_ids"]) + len(r1["sampled_token_ids"])] == (
        r1["prompt_token_ids"] + r1["sampled_token_ids"]
    )
    assert r2["render_reason"] == "continuation"
