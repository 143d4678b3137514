"""Google's Gemini API dialect (what Gemini CLI speaks), served by the proxy over the real engine and read by Google's
own SDK: reasoning as thought parts whose signature, echoed without the thought text as Gemini CLI echoes it,
restores the exact sampled turn; function calls and responses; countTokens; the model list; Google-shaped errors
with failed records."""

from __future__ import annotations

import itertools
import json
from typing import Any

import httpx
import pytest

from nemo_polar.proxy.apis import gemini
from tests.conftest import ProxyHandle, load_fixture
from tests.helpers.clients import loopback

pytestmark = pytest.mark.engine

LS = {"command": "ls -la"}
TOOLS = [
    {
        "functionDeclarations": [
            {
                "name": "run_shell_command",
                "description": "Run a shell command.",
                "parametersJsonSchema": {"type": "object", "properties": {"command": {"type": "string"}}},
            }
        ]
    }
]
STREAM = "/v1beta/models/local-model:streamGenerateContent?alt=sse"


def _frames(resp: httpx.Response) -> list[dict[str, Any]]:
    assert resp.status_code == 200, resp.text
    assert "[DONE]" not in resp.text  # Google's stream ends with the body
    return [json.loads(line[6:]) for line in resp.text.splitlines() if line.startswith("data: ")]


def test_reasoning_and_a_call_round_trip_as_gemini_cli_echoes_them(proxy: ProxyHandle) -> None:
    """A scripted turn (reasoning, then a call) streams as thought parts and a functionCall part carrying the
    signature; the next request echoes only the call and its signature (Gemini CLI drops thought text) plus the
    function's response, and continues from the exact sampled ids. Two turns with the same reasoning carry the same
    signature: each echoed turn is still restored as its own call (by its call id), so the chain holds."""
    turn = {"reasoning": "I should list the files.", "tool_calls": [{"name": "run_shell_command", "arguments": LS}]}
    again = {**turn, "tool_calls": [{"name": "run_shell_command", "arguments": {"command": "ls src"}}]}
    script = [turn, again, {"content": "Two files."}]
    session = proxy.session(script=script, sampling_overrides={"max_tokens": 64})
    headers = {"x-goog-api-key": session["api_key"]}
    body: dict[str, Any] = {
        "contents": [{"role": "user", "parts": [{"text": "list the files"}]}],
        "systemInstruction": {"role": "user", "parts": [{"text": "You are a coding agent."}]},
        "tools": TOOLS,
        "generationConfig": {"temperature": 1, "thinkingConfig": {"includeThoughts": True}},
    }
    signatures = []
    with httpx.Client(base_url=proxy.url, headers=headers, timeout=60) as client:
        for step in script[:2]:
            frames = _frames(client.post(STREAM, json=body))
            parts = [p for f in frames for p in f["candidates"][0]["content"]["parts"]]
            assert [f["candidates"][0].get("finishReason") for f in frames][-1] == "STOP"
            assert all("finishReason" not in f["candidates"][0] for f in frames[:-1])
            thought = "".join(p["text"] for p in parts if p.get("thought"))
            assert thought.strip() == step["reasoning"]
            [call] = [p for p in parts if "functionCall" in p]
            assert call["functionCall"]["name"] == "run_shell_command"
            assert call["functionCall"]["args"] == step["tool_calls"][0]["arguments"]
            assert call["thoughtSignature"] and frames[-1]["usageMetadata"]["promptTokenCount"] > 0
            signatures.append(call["thoughtSignature"])

            echoed = {"functionCall": call["functionCall"], "thoughtSignature": call["thoughtSignature"]}
            response = {"name": "run_shell_command", "id": call["functionCall"]["id"], "response": {"output": "a.py"}}
            body["contents"] += [
                {"role": "model", "parts": [echoed]},
                {"role": "user", "parts": [{"functionResponse": response}]},
            ]
        last = client.post("/v1beta/models/local-model:generateContent", json=body)
        assert last.status_code == 200, last.text
        assert last.json()["candidates"][0]["content"]["parts"] == [{"text": "Two files."}]

    assert signatures[0] == signatures[1]
    records = proxy.records(session["session_id"])
    for parent_rec, rec in itertools.pairwise(records):
        assert rec["render_reason"] == "continuation" and rec["parent_call_id"] == parent_rec["call_id"]
        parent = parent_rec["prompt_token_ids"] + parent_rec["sampled_token_ids"]
        assert rec["prompt_token_ids"][: len(parent)] == parent  # the reasoning the CLI dropped, as sampled
    assert records[0]["output"]["reasoning"].strip() == turn["reasoning"]
    assert records[0]["request"]["model"] == "models/local-model"


def test_any_model_name_is_served_and_tokens_are_counted_as_rendered(proxy: ProxyHandle) -> None:
    """Gemini CLI's side calls name built-in models (its router: a flash-lite model): served by the policy model and
    recorded under the name asked for. countTokens counts the prompt as a call renders it."""
    fixture = load_fixture("gemini-cli", "text_aux_router_classifier.json")
    session = proxy.session(sampling_overrides={"max_tokens": 4})
    headers = {"x-goog-api-key": session["api_key"]}
    with httpx.Client(base_url=proxy.url, headers=headers, timeout=60) as client:
        answered = client.post(fixture["path"], json=fixture["body"])
        assert answered.status_code == 200, answered.text
        counted = client.post("/v1beta/models/gemini-3.5-flash-lite:countTokens", json=fixture["body"])
        wrapped = client.post(
            "/v1beta/models/x:countTokens", json={"generateContentRequest": {**fixture["body"], "model": "models/x"}}
        )
        listed = client.get("/v1beta/models").json()["models"]
    [rec] = proxy.records(session["session_id"])
    assert rec["complete"] and rec["request"]["model"] == "models/gemini-3.5-flash-lite"
    assert counted.json() == wrapped.json() == {"totalTokens": len(rec["prompt_token_ids"])}
    assert answered.json()["usageMetadata"]["promptTokenCount"] == len(rec["prompt_token_ids"])
    assert [m["name"] for m in listed] == ["models/tiny-qwen3", "models/local-model"]
    assert "streamGenerateContent" in listed[0]["supportedGenerationMethods"]


@pytest.mark.parametrize(
    ("path", "body", "status", "google_status", "says"),
    [
        (STREAM, {"contents": []}, 400, "INVALID_ARGUMENT", "contents must not be empty"),
        (STREAM, {"contents": [{"role": "tool", "parts": []}]}, 400, "INVALID_ARGUMENT", "role must be user or model"),
        (STREAM, {"contents": [{"parts": [{"text": "hi"}]}], "generationConfig": {"candidateCount": 2}}, 400,
         "INVALID_ARGUMENT", "candidateCount"),
        ("/v1beta/models/local-model:embedContent", {}, 404, "NOT_FOUND", "unknown method"),
    ],
    ids=["empty", "bad_role", "candidates", "unknown_method"],
)  # fmt: skip
def test_bad_input_gets_a_google_shaped_error_and_a_record(
    proxy: ProxyHandle, path: str, body: dict[str, Any], status: int, google_status: str, says: str
) -> None:
    session = proxy.session()
    resp = loopback.post(f"{proxy.url}{path}", json=body, headers={"x-goog-api-key": session["api_key"]}, timeout=30)
    assert resp.status_code == status
    error = resp.json()["error"]
    assert error["code"] == status and error["status"] == google_status and says in error["message"]
    records = proxy.records(session["session_id"])
    if status == 400:  # a model call that did not parse: failed, and kept
        [rec] = records
        assert not rec["complete"] and says in rec["error"] and rec["request"]["contents"] == body["contents"]
    unauthenticated = loopback.post(f"{proxy.url}{STREAM}", json=body, headers={"x-goog-api-key": "nope"}, timeout=30)
    assert unauthenticated.status_code == 401 and unauthenticated.json()["error"]["status"] == "UNAUTHENTICATED"


def test_the_request_reads_as_a_conversation() -> None:
    """Gemini's shapes in the proxy's conversation: OpenAPI-subset schemas as JSON Schema, tool modes, function
    responses as tool messages (a shell's one output string as it is), Google's own tools noted as not served."""
    body = {
        "model": "models/m",
        "contents": [
            {"role": "user", "parts": [{"text": "ctx"}, {"text": "task"}]},
            {"role": "model", "parts": [{"text": "plan", "thought": True},
                                        {"functionCall": {"name": "f", "args": {}}}]},
            {"role": "user", "parts": [{"functionResponse": {"name": "f", "response": {"output": "ok"}}},
                                       {"functionResponse": {"name": "f", "id": "c2", "response": {"error": "x"}}}]},
        ],
        "tools": [{"functionDeclarations": [{"name": "f", "parameters": {
            "type": "OBJECT", "properties": {"n": {"type": "INTEGER", "nullable": True}}}}]}, {"googleSearch": {}}],
        "toolConfig": {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["f"]}},
        "generationConfig": {"maxOutputTokens": 7, "stopSequences": ["X"], "thinkingConfig": {}},
    }  # fmt: skip
    conv = gemini.parse(body)
    assert conv.model == "m" and conv.tool_choice == "f"
    assert conv.tools[0].parameters == {"type": "object", "properties": {"n": {"type": ["integer", "null"]}}}
    assert [(m.role, m.content) for m in conv.messages] == [
        ("user", "ctx\ntask"),
        ("assistant", ""),
        ("tool", "ok"),
        ("tool", '{"error":"x"}'),
    ]
    assert conv.messages[1].reasoning == "plan" and conv.messages[1].tool_calls[0].name == "f"
    assert [m.tool_call_id for m in conv.messages[2:]] == ["f", "c2"]
    assert conv.sampling.max_tokens == 7 and conv.sampling.stop == ["X"]
    assert conv.ignored == ["tools.1.googleSearch", "generationConfig.thinkingConfig"]
    signed = gemini.signature("exact\nreasoning")
    echoed = gemini.parse({"contents": [{"role": "model", "parts": [{"text": "hi", "thoughtSignature": signed}]}]})
    assert echoed.messages[0].reasoning == "exact\nreasoning" and echoed.messages[0].echo_ids == [signed]
    # Fields by their proto names too (Google's Python SDK sends some so); the user's own keys stay as they are.
    snake = gemini.parse({
        "system_instruction": {"parts": [{"text": "sys"}]},
        "contents": [{"role": "user", "parts": [{"text": "go"}]},
                     {"role": "model", "parts": [{"function_call": {"name": "f", "args": {"max_n": 1}}}]}],
        "tools": [{"function_declarations": [{"name": "f", "parameters_json_schema": {"properties": {"max_n": {}}}}]}],
        "generation_config": {"max_output_tokens": 3, "top_k": 64.0},
    })  # fmt: skip
    assert [m.content for m in snake.messages[:2]] == ["sys", "go"]
    assert json.loads(snake.messages[2].tool_calls[0].arguments) == {"max_n": 1}
    assert snake.tools[0].parameters == {"properties": {"max_n": {}}}
    assert (snake.sampling.max_tokens, snake.sampling.top_k) == (3, 64)
    skipped = {"functionCall": {"name": "f"}, "thoughtSignature": "skip_thought_signature_validator"}
    assert gemini.parse({"contents": [{"role": "model", "parts": [skipped]}]}).messages[0].echo_ids == []
