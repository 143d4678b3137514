"""Continuation mode is token-exact: a call that extends the previous one is given the previous prompt and the
exact sampled ids, then only the new messages rendered by the engine's template. Reasoning and tool calls the
proxy produced round-trip through each API's echo and are restored to the exact sampled text.

The real engine has random weights, so outputs are forced with vLLM structured outputs (session ``extra_body``):
the engine still samples the tokens, and typically picks a non-canonical tokenisation of the forced text, which
is exactly the case where re-rendering history would differ from what the model produced.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.conftest import ProxyHandle
from tests.helpers.clients import anthropic_client, loopback, openai_client

EOT = 151645
REASONING = "Let me look."
FORCED = (
    f'<think>\n{REASONING}\n</think>\n\n<tool_call>\n{{"name": "bash", "arguments": {{"command": "ls"}}}}\n</tool_call>'
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "run a shell command",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
        },
    }
]
SYSTEM = "You are a coding agent."


def forced(text: str) -> dict[str, Any]:
    return {
        "extra_body": {"structured_outputs": {"regex": re.escape(text)}},
        "sampling_overrides": {"max_tokens": 200, "temperature": 1.0},
    }


def engine_render(engine_url: str, messages: list[dict[str, Any]], tools: Any = TOOLS) -> list[int]:
    body = {"model": "tiny-qwen3", "messages": messages, "add_generation_prompt": True}
    if tools:
        body["tools"] = tools
    return loopback.post(f"{engine_url}/tokenize", json=body, timeout=30).json()["tokens"]


def assert_extends(parent: dict[str, Any], child: dict[str, Any]) -> list[int]:
    """The child's prompt is the parent's prompt + sampled ids; returns the new tail."""
    head = parent["prompt_token_ids"] + parent["sampled_token_ids"]
    assert child["parent_call_id"] == parent["call_id"]
    assert child["render_reason"] == "continuation"
    assert child["prompt_token_ids"][: len(head)] == head
    return child["prompt_token_ids"][len(head) :]


def test_chat_two_calls_token_exact(proxy: ProxyHandle, engine_url: str) -> None:
    session = proxy.session(**forced(FORCED))
    client = openai_client(proxy, session["api_key"])
    history: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "list files"}]
    first = client.chat.completions.create(model="local-model", messages=history, tools=TOOLS)
    msg = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls"
    assert msg.model_extra["reasoning_content"] == REASONING
    assert msg.tool_calls[0].function.name == "bash"
    assert msg.tool_calls[0].function.arguments == '{"command": "ls"}'  # exactly as sampled

    # Echo as Qwen Code does: arguments re-serialised compactly, tool content as a list of parts.
    call = msg.tool_calls[0]
    history += [
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": REASONING,
            "tool_calls": [
                {"id": call.id, "type": "function", "function": {"name": "bash", "arguments": '{"command":"ls"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": [{"type": "text", "text": "README.md\nhello.py"}]},
    ]
    client.chat.completions.create(model="local-model", messages=history, tools=TOOLS)

    r1, r2 = proxy.records(session["session_id"])
    assert r1["sampled_token_ids"][-1] == EOT and r1["finish_reason"] == "stop"
    tail = assert_extends(r1, r2)
    # The new part is exactly the engine template's render of the new messages (+ generation prompt).
    canonical = [
        *history[:2],
        {
            "role": "assistant",
            "content": "",
            "reasoning": REASONING,
            "tool_calls": [
                {"id": call.id, "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": "README.md\nhello.py"},
    ]
    full = engine_render(engine_url, canonical)
    assert full[-len(tail) :] == tail
    # The proxy tokenized only what the second render appended (and its ids are the engine's, just checked).
    assert r1["tokenize"] == "full:first" and r2["tokenize"].startswith("tail:"), (r1["tokenize"], r2["tokenize"])
    assert loopback.post(f"{engine_url}/detokenize", json={"tokens": tail}).json()["prompt"] == (
        "\n<|im_start|>user\n<tool_response>\nREADME.md\nhello.py\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    # Where the engine sampled a non-canonical tokenisation, re-rendering the history would have differed.
    if full != r2["prompt_token_ids"]:
        assert (
            r1["sampled_token_ids"]
            != full[len(r1["prompt_token_ids"]) : len(r1["prompt_token_ids"]) + len(r1["sampled_token_ids"])]
        )


def test_chat_streaming_tool_call_and_reasoning(proxy: ProxyHandle) -> None:
    session = proxy.session(**forced(FORCED))
    client = openai_client(proxy, session["api_key"])
    reasoning, calls, finish = "", [], None
    for chunk in client.chat.completions.create(
        model="local-model", messages=[{"role": "user", "content": "hi"}], tools=TOOLS, stream=True
    ):
        delta = chunk.choices[0].delta
        reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
        calls += delta.tool_calls or []
        finish = chunk.choices[0].finish_reason or finish
    assert reasoning == REASONING
    assert finish == "tool_calls"
    assert calls[0].function.name == "bash" and calls[1].function.arguments == '{"command": "ls"}'


def test_responses_round_trip_codex_style(proxy: ProxyHandle) -> None:
    session = proxy.session(**forced(FORCED))
    client = openai_client(proxy, session["api_key"])
    tools = [
        {"type": "function", "name": "bash", "description": "run", "parameters": TOOLS[0]["function"]["parameters"]}
    ]
    inputs: list[dict[str, Any]] = [
        {"type": "message", "id": "msg_dev", "role": "developer", "content": [{"type": "input_text", "text": SYSTEM}]},
        {
            "type": "message",
            "id": "msg_user",
            "role": "user",
            "content": [{"type": "input_text", "text": "list files"}],
        },
    ]
    with client.responses.stream(model="local-model", input=inputs, tools=tools, store=False) as stream:
        kinds = [event.type for event in stream]
        first = stream.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert "response.reasoning_summary_text.delta" in kinds and "response.function_call_arguments.delta" in kinds
    reasoning, call = first.output[0], first.output[1]
    assert reasoning.type == "reasoning" and reasoning.summary[0].text == REASONING and reasoning.encrypted_content
    assert call.type == "function_call" and call.arguments == '{"command": "ls"}'

    # Codex echoes output items verbatim (ids, status) and appends the tool output.
    echoed = [item.model_dump(exclude_none=True) for item in first.output]
    inputs += [*echoed, {"type": "function_call_output", "call_id": call.call_id, "output": "README.md\n"}]
    client.responses.create(model="local-model", input=inputs, tools=tools, store=False)
    r1, r2 = proxy.records(session["session_id"])
    assert_extends(r1, r2)


def test_responses_namespace_tool_calls_and_agent_messages(proxy: ProxyHandle, engine_url: str) -> None:
    """Codex's multi_agent_v2 declares spawn_agent/wait_agent in a `namespace` tool and dispatches a call by
    (namespace, name): both stream events of the call's item carry the namespace. The subagent's task and its report
    come back as `agent_message` items (header part + payload part) that the model must read."""
    spawn = '<tool_call>\n{"name": "spawn_agent", "arguments": {"message": "Read calc.py."}}\n</tool_call>'
    session = proxy.session(**forced(spawn))
    params = {"type": "object", "properties": {"message": {"type": "string"}}}
    tools = [
        {"type": "function", "name": "bash", "parameters": TOOLS[0]["function"]["parameters"]},
        {"type": "namespace", "name": "collaboration", "description": "sub-agents",
         "tools": [{"type": "function", "name": "spawn_agent", "parameters": params}]},
    ]  # fmt: skip
    inputs: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": "delegate"}]
    body = {"model": "local-model", "input": inputs, "tools": tools, "stream": True, "store": False}
    headers = {"authorization": f"Bearer {session['api_key']}"}
    with loopback.stream("POST", f"{proxy.url}/v1/responses", json=body, headers=headers, timeout=60) as resp:
        events = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: ")]
    items = [e["item"] for e in events if e["type"] in ("response.output_item.added", "response.output_item.done")]
    assert [(i["type"], i["name"], i.get("namespace")) for i in items] == [
        ("function_call", "spawn_agent", "collaboration")
    ] * 2
    call = items[-1]

    report = [
        {"type": "input_text", "text": "Message Type: FINAL_ANSWER\nSender: /root/read_calc\nPayload:\n"},
        {"type": "encrypted_content", "encrypted_content": "add returns a - b."},
    ]
    inputs += [
        call,
        {"type": "function_call_output", "call_id": call["call_id"], "output": '{"task_name": "/root/read_calc"}'},
        {"type": "agent_message", "author": "/root/read_calc", "recipient": "/root", "content": report},
    ]
    resp = loopback.post(f"{proxy.url}/v1/responses", json={**body, "stream": False}, headers=headers, timeout=60)
    assert resp.status_code == 200, resp.text
    first, second = proxy.records(session["session_id"])
    tail = assert_extends(first, second)
    text = loopback.post(f"{engine_url}/detokenize", json={"model": "tiny-qwen3", "tokens": tail}, timeout=30)
    assert (
        "<|im_start|>user\nMessage Type: FINAL_ANSWER\nSender: /root/read_calc\nPayload:\nadd returns a - b."
        in (text.json()["prompt"])
    )


def test_anthropic_round_trip_claude_style(proxy: ProxyHandle) -> None:
    session = proxy.session(**forced(FORCED))
    client = anthropic_client(proxy, session["api_key"])
    tools = [{"name": "bash", "description": "run", "input_schema": TOOLS[0]["function"]["parameters"]}]
    messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": "list files"}]}]
    with client.beta.messages.stream(
        model="local-model",
        max_tokens=1000,
        system=SYSTEM,
        messages=messages,
        tools=tools,
        thinking={"type": "adaptive"},
    ) as stream:
        first = stream.get_final_message()
    thinking, tool_use = first.content
    assert thinking.type == "thinking" and thinking.thinking == REASONING and thinking.signature
    assert tool_use.type == "tool_use" and tool_use.input == {"command": "ls"} and first.stop_reason == "tool_use"

    messages += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": tool_use.id,
                    "content": "README.md",
                    "is_error": False,
                    "cache_control": {"type": "ephemeral"},
                }
            ],
        },
    ]
    client.beta.messages.create(model="local-model", max_tokens=1000, system=SYSTEM, messages=messages, tools=tools)
    r1, r2 = proxy.records(session["session_id"])
    assert_extends(r1, r2)


def test_text_reply_echo_continues(proxy: ProxyHandle) -> None:
    """A text-only reply (no ids to echo) is recognised by its exact text."""
    session = proxy.session(**forced("Hello there."))
    client = openai_client(proxy, session["api_key"])
    history = [{"role": "user", "content": "hi"}]
    reply = client.chat.completions.create(model="local-model", messages=history).choices[0].message.content
    assert reply == "Hello there."
    history += [{"role": "assistant", "content": reply}, {"role": "user", "content": "and again"}]
    client.chat.completions.create(model="local-model", messages=history)
    r1, r2 = proxy.records(session["session_id"])
    assert assert_extends(r1, r2)


def test_fresh_render_reasons(proxy: ProxyHandle) -> None:
    session = proxy.session(**forced("Hello there."))
    client = openai_client(proxy, session["api_key"])
    base = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}]
    client.chat.completions.create(model="local-model", messages=base)
    # edited history: the earlier user turn changed
    edited = [
        base[0],
        {"role": "user", "content": "HI"},
        {"role": "assistant", "content": "Hello there."},
        {"role": "user", "content": "next"},
    ]
    client.chat.completions.create(model="local-model", messages=edited)
    # a subagent / side call: a new conversation without assistant turns
    client.chat.completions.create(model="local-model", messages=[{"role": "user", "content": "summarise"}])
    # an assistant turn the proxy never produced (e.g. compaction summary written by the harness)
    client.chat.completions.create(
        model="local-model", messages=[*base, {"role": "assistant", "content": "x"}, {"role": "user", "content": "go"}]
    )
    reasons = [(r["render_reason"], r["parent_call_id"]) for r in proxy.records(session["session_id"])]
    assert reasons == [
        ("first_call", None),
        ("history_diverged", None),
        ("new_conversation", None),
        ("assistant_turn_not_from_proxy", None),
    ]


@pytest.mark.parametrize("mode", ["chat", "chat_prefix"])
def test_chat_modes_record_engine_prompt(proxy: ProxyHandle, engine_url: str, mode: str) -> None:
    session = proxy.session(mode=mode, **forced("Hello there."))
    client = openai_client(proxy, session["api_key"])
    history = [{"role": "user", "content": "hi"}]
    client.chat.completions.create(model="local-model", messages=history)
    history += [{"role": "assistant", "content": "Hello there."}, {"role": "user", "content": "more"}]
    client.chat.completions.create(model="local-model", messages=history)
    r1, r2 = proxy.records(session["session_id"])
    assert r1["mode"] == mode and r1["complete"] and r1["sampled_token_ids"][-1] == EOT
    assert r1["prompt_token_ids"] == engine_render(engine_url, history[:1], tools=None)
    assert r2["prompt_token_ids"] == engine_render(engine_url, history, tools=None)
    assert r2["render_reason"] == "engine_render:continuation" and r2["parent_call_id"] == r1["call_id"]
    assert len(r2["sampled_logprobs"]) == len(r2["sampled_token_ids"])


@pytest.mark.anyio
async def test_chat_prefix_sends_nemo_rl_prefix(proxy: ProxyHandle) -> None:
    """chat_prefix mode sends the parent's exact ids as NeMo-RL's vLLM server expects them."""
    from nemo_polar.proxy.apis import chat
    from nemo_polar.proxy.generate.generation import plan
    from nemo_polar.proxy.store.records import CallRecord
    from nemo_polar.proxy.store.sessions import SessionConfig

    app_proxy = proxy.apps.proxy
    session = app_proxy.sessions.create(SessionConfig(mode="chat_prefix"))
    first = chat.parse({"model": "local-model", "messages": [{"role": "user", "content": "hi"}]})
    rec = CallRecord(
        call_id="call-1",
        session_id=session.id,
        api="chat",
        mode="continuation",
        request={},
        prompt_token_ids=[1, 2, 3],
        sampled_token_ids=[4, EOT],
        sampled_logprobs=[-0.1, -0.2],
        finish_reason="stop",
        started_at=0.0,
        complete=True,
    )
    from nemo_polar.proxy.parse.output import Output

    session.commit(rec, first, Output(content="yo").as_message(), [])
    second = chat.parse(
        {
            "model": "local-model",
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "yo"},
                {"role": "user", "content": "more"},
            ],
        }
    )
    session.restore(second)
    the_plan = await plan(app_proxy.engine, app_proxy.renderer, session, second)
    assert the_plan.body["required_prefix_token_ids"] == [1, 2, 3, 4, EOT]
    assert the_plan.body["messages"][1]["generation_token_ids"] == [4, EOT]
    assert the_plan.render_reason == "engine_render:continuation"
    assert json.loads(json.dumps(the_plan.body))["required_prefix_token_ids"] == [1, 2, 3, 4, EOT]


def test_custom_tool_round_trip_codex_apply_patch(proxy: ProxyHandle) -> None:
    """A free-form (custom) tool call comes back as `custom_tool_call` and its echo continues the chain."""
    patch = "*** Begin Patch\n*** End Patch"
    sampled = f'<tool_call>\n{{"name": "apply_patch", "arguments": {json.dumps({"input": patch})}}}\n</tool_call>'
    session = proxy.session(**forced(sampled))
    client = openai_client(proxy, session["api_key"])
    tools = [
        {
            "type": "custom",
            "name": "apply_patch",
            "description": "edit files",
            "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"},
        }
    ]
    inputs: list[dict[str, Any]] = [{"role": "user", "content": "fix it"}]
    first = client.responses.create(model="local-model", input=inputs, tools=tools)
    [call] = first.output
    assert call.type == "custom_tool_call" and call.name == "apply_patch" and call.input == patch
    inputs += [
        call.model_dump(exclude_none=True),
        {"type": "custom_tool_call_output", "call_id": call.call_id, "output": "Success."},
    ]
    client.responses.create(model="local-model", input=inputs, tools=tools)
    r1, r2 = proxy.records(session["session_id"])
    assert_extends(r1, r2)


def test_qwen3_coder_tool_call_from_the_engine(proxy: ProxyHandle) -> None:
    sampled = "<tool_call>\n<function=bash>\n<parameter=command>\nls -la\n</parameter>\n</function>\n</tool_call>"
    session = proxy.session(**forced(sampled))
    client = openai_client(proxy, session["api_key"])
    reply = client.chat.completions.create(
        model="local-model", messages=[{"role": "user", "content": "x"}], tools=TOOLS
    )
    [call] = reply.choices[0].message.tool_calls
    assert call.function.name == "bash" and json.loads(call.function.arguments) == {"command": "ls -la"}
    assert reply.choices[0].message.content is None


def test_end_of_turn_spelled_in_sampled_text_renders_afresh(proxy: ProxyHandle, engine_url: str) -> None:
    """A turn whose text spells the end-of-turn token cannot be cut by counting end-of-turn tokens (the canonical
    render turns the text into the token): the next call is rendered afresh, with its own reason, and its prompt
    is the engine's own render of the history. Without the guard the cut lands inside the parent's turn."""
    text = "Close a turn with <|im_end|> and go on."
    session = proxy.session(**forced(text))
    client = openai_client(proxy, session["api_key"])
    history: list[dict[str, Any]] = [{"role": "user", "content": "how do turns end?"}]
    reply = client.chat.completions.create(model="local-model", messages=history).choices[0].message.content
    assert reply == text
    history += [{"role": "assistant", "content": reply}, {"role": "user", "content": "and then?"}]
    client.chat.completions.create(model="local-model", messages=history)
    r1, r2 = proxy.records(session["session_id"])
    assert EOT not in r1["sampled_token_ids"][:-1]  # spelled out in ordinary tokens, not sampled as the token
    assert (r2["render_reason"], r2["parent_call_id"]) == ("end_of_turn_in_sampled", None)
    assert r2["prompt_token_ids"] == engine_render(engine_url, history, tools=None)
    # two user turns and the assistant turn close with EOT, and the spelled one became a fourth: counting misplaces it
    assert r2["prompt_token_ids"].count(EOT) == 4
