"""Real model families' tokenizers and chat templates behind the proxy, on tiny random-weight stand-ins built from
pinned releases (``make setup``: nemo_polar/engine/build_models.py FAMILIES), served by vLLM with the family's
parsers. Every real CLI request replays in continuation mode: accepted, the proxy's in-process render equal to the
engine's ``/tokenize``, the recorded ids and logprobs the engine's. A template that takes system messages only
first gets them where it takes them (``TemplateTraits``), and a conversation the template refuses is a
provider-shaped 400 with a failed record, on a connection that keeps working."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from nemo_polar.proxy.apis import get_adapter
from nemo_polar.proxy.conversation import TemplateTraits
from nemo_polar.proxy.engine_client import EngineClient
from nemo_polar.proxy.renderer import EngineRenderer
from tests.conftest import ProxyHandle, _start_engine, all_fixtures, load_fixture, make_proxy
from tests.test_fixture_replay import _send, assert_engine_sampled

pytestmark = pytest.mark.engine

MAX_TOKENS = 12
FAMILY_MODEL = "tiny-qwen3_5"  # Qwen3.5-4B's tokenizer and template: the paper's model
API = {"chat-completions": "chat", "responses": "responses", "anthropic-messages": "anthropic"}


@pytest.fixture(scope="module")
def family_engine() -> Iterator[str]:
    yield from _start_engine(FAMILY_MODEL)


@pytest.fixture(scope="module")
def family_proxy(family_engine: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyHandle]:
    for handle in make_proxy(family_engine, tmp_path_factory.mktemp("family-records")):
        handle.wait_for_local_renderer()
        yield handle


def _engine_render(engine_url: str, fixture: dict[str, Any], traits: TemplateTraits) -> list[int]:
    """The engine's own render (``/tokenize`` with the model's template) of the conversation the proxy parsed."""
    conv = get_adapter(API[fixture["api"]]).parse(fixture["body"])

    async def render() -> list[int]:
        engine = EngineClient(engine_url)
        try:
            tools = conv.template_tools() if conv.tool_choice != "none" else None
            return await EngineRenderer(engine).render(conv.template_messages(traits), tools, {})
        finally:
            await engine.aclose()

    return asyncio.run(render())


def test_the_family_template_is_probed_for_what_it_takes(family_proxy: ProxyHandle, proxy: ProxyHandle) -> None:
    # Qwen3.5's template raises "System message must be at the beginning." for both shapes; ChatML takes both.
    assert family_proxy.apps.proxy._traits == TemplateTraits(merge_leading=True, later_as_user=True)
    assert proxy.apps.proxy._traits == TemplateTraits()


@pytest.mark.parametrize(("harness", "name"), all_fixtures())
def test_every_cli_request_replays_on_the_family_model(
    family_proxy: ProxyHandle, family_engine: str, harness: str, name: str
) -> None:
    fixture = load_fixture(harness, name)
    overrides = {"max_tokens": MAX_TOKENS, "temperature": 0.0}
    _send(family_proxy, family_proxy.session(sampling_overrides=overrides)["api_key"], fixture, True)  # prefix cache
    session = family_proxy.session(sampling_overrides=overrides)
    _send(family_proxy, session["api_key"], fixture, True)

    [rec] = family_proxy.records(session["session_id"])
    assert rec["complete"] and rec["error"] is None and rec["mode"] == "continuation"
    assert rec["tokenize"] == "full:first"  # rendered in-process, not by the engine's /tokenize
    assert rec["sampling"]["max_tokens"] == MAX_TOKENS
    assert 0 < len(rec["sampled_token_ids"]) == len(rec["sampled_logprobs"]) <= MAX_TOKENS
    # Codex sends two developer messages up front, Claude Code a system message after the first user turn.
    expected = {"codex": "merged:", "claude-code": "as_user:"}.get(harness)
    assert (rec["system_messages"] or "").startswith(expected) if expected else rec["system_messages"] is None

    traits = family_proxy.apps.proxy._traits
    assert traits is not None
    assert rec["prompt_token_ids"] == _engine_render(family_engine, fixture, traits)

    assert_engine_sampled(family_engine, FAMILY_MODEL, rec)


def test_a_conversation_the_template_refuses_is_a_400_with_a_record(family_proxy: ProxyHandle) -> None:
    """Qwen3.5's template raises without a user query: a provider-shaped 400 naming the template's message, a failed
    record, and the same keep-alive connection serves the next request."""
    session = family_proxy.session(sampling_overrides={"max_tokens": 2})
    headers = {"authorization": f"Bearer {session['api_key']}"}
    refused = {"model": "local-model", "messages": [{"role": "system", "content": "You are a coding agent."}]}
    fine = {"model": "local-model", "messages": [{"role": "user", "content": "hi"}]}
    with httpx.Client(base_url=family_proxy.url, headers=headers, timeout=60) as client:
        first = client.post("/v1/chat/completions", json=refused)
        assert first.status_code == 400
        error = first.json()["error"]
        assert error["type"] == "invalid_request_error" and error["code"] == "chat_template_error"
        assert "No user query found in messages." in error["message"]
        only_assistant = [{"role": "assistant", "content": "hello"}]
        anthropic = client.post(
            "/v1/messages", json={"model": "local-model", "max_tokens": 2, "system": "x", "messages": only_assistant}
        )
        assert anthropic.status_code == 400
        assert anthropic.json()["error"]["type"] == "invalid_request_error"
        assert "No user query found" in anthropic.json()["error"]["message"]
        assert client.post("/v1/chat/completions", json=fine).status_code == 200

    records = family_proxy.records(session["session_id"])
    assert [r["status_code"] for r in records] == [400, 400, 200]
    assert not records[0]["complete"] and "No user query found" in records[0]["error"]
    assert records[0]["request"] == refused


def test_system_placement_keeps_the_render_append_only() -> None:
    msgs = [
        {"role": "system", "content": "a"},
        {"role": "system", "content": "b"},
        {"role": "user", "content": "u"},
        {"role": "system", "content": "c"},
        {"role": "assistant", "content": "x"},
    ]
    assert TemplateTraits().apply(msgs) == (msgs, None)
    placed, note = TemplateTraits(merge_leading=True, later_as_user=True).apply(msgs)
    assert note == "merged:2 as_user:2"
    assert placed == [
        {"role": "system", "content": "a\n\nb"},
        {"role": "user", "content": "u"},
        {"role": "user", "content": "c"},
        {"role": "assistant", "content": "x"},
    ]
    # A longer conversation places its common part the same way: the earlier render is a prefix of the later one.
    longer, _ = TemplateTraits(merge_leading=True, later_as_user=True).apply(
        [*msgs, {"role": "system", "content": "d"}]
    )
    assert longer[: len(placed)] == placed and longer[-1]["role"] == "user"
    assert TemplateTraits(later_as_user=True).apply(msgs[1:])[1] == "as_user:2"


def test_the_family_directory_names_its_parsers() -> None:
    from nemo_polar.engine.launcher import EngineSpec, model_family, resolve_model

    path, name, max_len = resolve_model(FAMILY_MODEL)
    assert model_family(path)["family"] == "qwen3_5" and (name, max_len) == (FAMILY_MODEL, 32768)
    cmd, _ = EngineSpec(model=FAMILY_MODEL).command()
    assert cmd[cmd.index("--tool-call-parser") + 1] == "qwen3_coder"
    assert cmd[cmd.index("--reasoning-parser") + 1] == "qwen3"
    assert json.loads(cmd[cmd.index("--structured-outputs-config") + 1]) == {"enable_in_reasoning": True}
    assert Path(cmd[cmd.index("--chat-template") + 1]).read_text().count("System message must be at the beginning.")
    cmd, _ = EngineSpec(model="tiny-qwen3").command()
    assert cmd[cmd.index("--tool-call-parser") + 1] == "hermes" and "--reasoning-parser" not in cmd


def test_reasoning_the_prompt_opened_and_a_qwen3_coder_call_round_trip(family_proxy: ProxyHandle) -> None:
    """Qwen3.5's generation prompt opens "<think>": the sample's reasoning until "</think>" is returned as reasoning,
    its qwen3_coder call as a tool call with typed arguments, and the echoed turn (reasoning, call) is restored to
    the exact sampled ids, so the next call continues it token for token."""
    import openai

    first = (
        "I will list the files.\n</think>\n\n<tool_call>\n<function=bash>\n<parameter=command>\nls\n</parameter>\n"
        "</function>\n</tool_call>"
    )
    second = "Seen them.\n</think>\n\nTwo files."
    session = family_proxy.session(script=[first, second], sampling_overrides={"max_tokens": 64})
    client = openai.OpenAI(base_url=f"{family_proxy.url}/v1", api_key=session["api_key"], max_retries=0)
    tools = [
        {
            "type": "function",
            "function": {
                "name": "bash",
                "description": "Run a command.",
                "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
            },
        }
    ]
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "list the files"},
    ]
    r1 = client.chat.completions.create(model="local-model", messages=messages, tools=tools)  # type: ignore[arg-type]
    msg = r1.choices[0].message
    assert msg.model_extra is not None and msg.model_extra["reasoning_content"] == "I will list the files."
    assert msg.content in (None, "") and msg.tool_calls is not None
    [call] = msg.tool_calls
    assert call.function.name == "bash" and json.loads(call.function.arguments) == {"command": "ls"}

    messages += [
        msg.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "README.md\nhello.py"},
    ]
    r2 = client.chat.completions.create(model="local-model", messages=messages, tools=tools)  # type: ignore[arg-type]
    assert r2.choices[0].message.content == "Two files."

    rec1, rec2 = family_proxy.records(session["session_id"])
    assert rec2["render_reason"] == "continuation" and rec2["parent_call_id"] == rec1["call_id"]
    parent = rec1["prompt_token_ids"] + rec1["sampled_token_ids"]
    assert rec2["prompt_token_ids"][: len(parent)] == parent


# A template that takes one system message, first, and renders no tools (as Gemma 3's has no tool support).
ONE_SYSTEM_NO_TOOLS = (
    "{%- for m in messages -%}"
    "{%- if m.role == 'system' and not loop.first -%}{{ raise_exception('System message must be at the beginning.') }}"
    "{%- endif -%}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{%- endfor -%}{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}"
)


@pytest.mark.parametrize(
    ("template", "traits"),
    [
        (ONE_SYSTEM_NO_TOOLS, TemplateTraits(merge_leading=True, later_as_user=True, renders_tools=False)),
        (None, TemplateTraits()),  # the project's ChatML+tools template, as tiny-qwen3 ships it
    ],
    ids=["one_system_no_tools", "chatml_tools"],
)
def test_the_probe_reads_what_a_template_takes(tmp_path: Path, template: str | None, traits: TemplateTraits) -> None:
    import shutil

    from nemo_polar.paths import cache_dir
    from nemo_polar.proxy.renderer import LocalRenderer, probe_template

    src = cache_dir() / "models" / "tiny-qwen3"
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(src / name, tmp_path / name)
    if template is not None:
        (tmp_path / "chat_template.jinja").write_text(template)
    assert asyncio.run(probe_template(LocalRenderer(tmp_path))) == traits


def test_a_tools_request_to_a_template_without_tools_is_refused(engine_url: str, tmp_path: Path) -> None:
    """The model would never see the tools: a 400 naming why, with a failed record; without tools it serves."""
    for handle in make_proxy(engine_url, tmp_path):
        handle.apps.proxy._traits = TemplateTraits(renders_tools=False)  # what the probe finds for such a template
        session = handle.session(sampling_overrides={"max_tokens": 2})
        headers = {"authorization": f"Bearer {session['api_key']}"}
        chat = {"model": "local-model", "messages": [{"role": "user", "content": "hi"}]}
        tool = {"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}
        with httpx.Client(base_url=handle.url, headers=headers, timeout=60) as client:
            refused = client.post("/v1/chat/completions", json={**chat, "tools": [tool]})
            assert refused.status_code == 400
            error = refused.json()["error"]
            assert error["code"] == "tools_unsupported" and error["param"] == "tools"
            assert "renders no tools" in error["message"]
            assert client.post("/v1/chat/completions", json=chat).status_code == 200
        records = handle.records(session["session_id"])
        assert [r["status_code"] for r in records] == [400, 200] and "renders no tools" in records[0]["error"]
