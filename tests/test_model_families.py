"""Real model families' tokenizers and chat templates behind the proxy, on tiny random-weight stand-ins built from
pinned releases (``make setup``: nemo_polar/engine/build_models.py STAND_INS), served by vLLM with the family's
parsers. Every real CLI request replays in continuation mode: accepted, the proxy's in-process render equal to the
engine's ``/tokenize``, the recorded ids and logprobs the engine's. A template that takes system messages only
first gets them where it takes them (``TemplateTraits``), and a conversation the template refuses is a
provider-shaped 400 with a failed record, on a connection that keeps working."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from nemo_polar.env.gym import ENVIRONMENTS
from nemo_polar.proxy.apis import CAPTURED_APIS, get_adapter
from nemo_polar.proxy.conversation import TemplateTraits
from nemo_polar.proxy.engine_client import EngineClient
from nemo_polar.proxy.render.renderer import EngineRenderer
from tests.conftest import ProxyHandle, _start_engine, all_fixtures, load_fixture, make_proxy
from tests.helpers.clients import loopback, openai_client
from tests.helpers.demo import run_demo
from tests.helpers.lanes import lane
from tests.helpers.replay import assert_engine_sampled, send_fixture

pytestmark = pytest.mark.engine

MAX_TOKENS = 12
QWEN3_5 = "tiny-qwen3_5"  # Qwen3.5-4B's tokenizer and template: the paper's model
# What each family's own template takes, as the proxy's probe must find it: Qwen3.5's refuses a second or a later
# system message, gpt-oss's renders only the first, Gemma 3's refuses both and renders no tools.
TRAITS = {  # in the order the replays run: tiny-llama3 last, for the tests after them
    QWEN3_5: TemplateTraits(merge_leading=True, later_as_user=True),
    "tiny-qwen3_hf": TemplateTraits(),  # Qwen3's takes a system message anywhere
    "tiny-gpt_oss": TemplateTraits(merge_leading=True, later_as_user=True),
    "tiny-glm": TemplateTraits(),
    "tiny-gemma": TemplateTraits(merge_leading=True, later_as_user=True, renders_tools=False, join_users=True),
    # Mistral NeMo's refuses any system message but the first, two user messages in a row, and call ids that are not
    # 9 characters; DeepSeek V3.1's moves every system message to the top (its tools: the project's tool template,
    # nemo_polar/engine/deepseek_v31_tools.jinja, with the model card's tool prompt).
    "tiny-mistral": TemplateTraits(merge_leading=True, later_as_user=True, join_users=True, call_ids="alnum9"),
    "tiny-deepseek": TemplateTraits(later_as_user=True),
    # Template only: the family's template and parsers over a stand-in tokenizer carrying its special tokens.
    "tiny-nemotron3_nano": TemplateTraits(),
    # Kimi K2's takes any id, but its parser only functions.NAME:INDEX (the form its tool_call_parser names).
    "tiny-kimi_k2": TemplateTraits(call_ids="functions_index"),
    "tiny-llama3": TemplateTraits(),
}
PARSERS = {  # vLLM's --tool-call-parser / --reasoning-parser for each, as its polar-family.json names them
    QWEN3_5: ("qwen3_coder", "qwen3"),
    "tiny-qwen3_hf": ("hermes", "qwen3"),
    "tiny-llama3": ("llama3_json", None),
    "tiny-gpt_oss": ("openai", "openai_gptoss"),
    "tiny-glm": ("glm47", "glm45"),
    "tiny-gemma": (None, None),
    "tiny-mistral": ("mistral", None),
    "tiny-deepseek": ("deepseek_v31", "deepseek_v3"),
    "tiny-nemotron3_nano": ("qwen3_coder", "nemotron_v3"),
    "tiny-kimi_k2": ("kimi_k2", None),
}
STAND_INS = {"tiny-nemotron3_nano", "tiny-kimi_k2"}  # template-only families

BASH = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a command.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
    },
}
LIST_FILES = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "list the files"}]


@dataclass
class Served:
    model: str
    engine: str  # the engine's URL
    proxy: ProxyHandle


class OneFamilyAtATime:
    """The family engines, one serving at a time: asking for another model stops the running one and its proxy (an
    engine takes a minute or more to start and about 1 GB). The tests ask in order, so each family's engine starts
    once; the next family's engine and proxy start in the background while the current family's tests run (an engine
    start is mostly imports: it overlaps what the tests leave of the two cores)."""

    def __init__(self, tmp: pytest.TempPathFactory, order: list[str]) -> None:
        self.tmp, self.order = tmp, order
        self.stack = contextlib.ExitStack()
        self.current: Served | None = None
        self.pool = ThreadPoolExecutor(max_workers=1)
        self.next: tuple[str, Future[tuple[contextlib.ExitStack, Served]]] | None = None

    def _serve(self, model: str) -> tuple[contextlib.ExitStack, Served]:
        stack = contextlib.ExitStack()
        try:
            engine = stack.enter_context(contextlib.contextmanager(_start_engine)(model))
            records = self.tmp.mktemp(f"records-{model}")
            handle = stack.enter_context(contextlib.contextmanager(make_proxy)(engine, records))
            handle.wait_for_local_renderer()
        except BaseException:
            stack.close()
            raise
        return stack, Served(model, engine, handle)

    def __call__(self, model: str) -> Served:
        if self.current is None or self.current.model != model:
            self.stack.close()
            if self.next is not None and self.next[0] == model:
                stack, self.current = self.next[1].result()
                self.next = None
            else:
                stack, self.current = self._serve(model)
            self.stack = stack
            later = self.order[self.order.index(model) + 1 :] if model in self.order else []
            if later and self.next is None:
                self.next = (later[0], self.pool.submit(self._serve, later[0]))
        return self.current

    def close(self) -> None:
        self.stack.close()
        if self.next is not None:
            with contextlib.suppress(Exception):  # a start that failed: its test reported it, or none asked
                self.next[1].result()[0].close()
        self.pool.shutdown()


def _families_in_order(items: list[pytest.Item]) -> list[str]:
    """The families this module's selected tests ask for, in the order they run."""
    asked = []
    for item in items:
        if item.module is not sys.modules[__name__]:  # type: ignore[attr-defined]
            continue
        params = getattr(getattr(item, "callspec", None), "params", {})
        if "family" in params:
            asked.append(params["family"])
        elif "qwen3_5" in getattr(item, "fixturenames", ()):
            asked.append(QWEN3_5)
    return list(dict.fromkeys(asked))


@pytest.fixture(scope="module")
def serve(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OneFamilyAtATime]:
    served = OneFamilyAtATime(tmp_path_factory, _families_in_order(request.session.items))
    try:
        yield served
    finally:
        served.close()


@pytest.fixture
def qwen3_5(serve: OneFamilyAtATime) -> ProxyHandle:
    return serve(QWEN3_5).proxy


@pytest.fixture(scope="module")
def family(request: pytest.FixtureRequest, serve: OneFamilyAtATime) -> Served:
    """A family's engine and proxy, for tests parametrized over families (``indirect``): conftest runs each family's
    tests together, across test functions, so its engine starts once for all of them."""
    return serve(request.param)


def _engine_render(engine_url: str, fixture: dict[str, Any], traits: TemplateTraits) -> list[int]:
    """The engine's own render (``/tokenize`` with the model's template) of the conversation the proxy parsed."""
    conv = get_adapter(CAPTURED_APIS[fixture["api"]]).parse(fixture["body"])

    async def render() -> list[int]:
        engine = EngineClient(engine_url)
        try:
            tools = conv.template_tools() if conv.tool_choice != "none" else None
            return await EngineRenderer(engine).render(conv.template_messages(traits), tools, {})
        finally:
            await engine.aclose()

    return asyncio.run(render())


def test_the_project_template_takes_every_system_message(proxy: ProxyHandle) -> None:
    assert _probed(proxy) == TemplateTraits()


def _probed(handle: ProxyHandle) -> TemplateTraits | None:
    """What the proxy's probe found (it runs on the first request)."""
    session = handle.session(sampling_overrides={"max_tokens": 1})
    chat = {"model": "local-model", "messages": [{"role": "user", "content": "hi"}]}
    loopback.post(
        f"{handle.url}/v1/chat/completions", json=chat, headers={"authorization": f"Bearer {session['api_key']}"}
    ).raise_for_status()
    return handle.apps.proxy._traits


def _post(handle: ProxyHandle, api_key: str, fixture: dict[str, Any]) -> httpx.Response:
    headers = {"authorization": f"Bearer {api_key}", "x-api-key": api_key}
    return loopback.post(f"{handle.url}{fixture['path']}", json=fixture["body"], headers=headers, timeout=120)


def test_a_conversation_the_template_refuses_is_a_400_with_a_record(qwen3_5: ProxyHandle) -> None:
    """Qwen3.5's template raises without a user query: a provider-shaped 400 naming the template's message, a failed
    record, and the same keep-alive connection serves the next request."""
    session = qwen3_5.session(sampling_overrides={"max_tokens": 2})
    headers = {"authorization": f"Bearer {session['api_key']}"}
    refused = {"model": "local-model", "messages": [{"role": "system", "content": "You are a coding agent."}]}
    fine = {"model": "local-model", "messages": [{"role": "user", "content": "hi"}]}
    with httpx.Client(base_url=qwen3_5.url, headers=headers, timeout=60) as client:
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

    records = qwen3_5.records(session["session_id"])
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


def _call(ident: str) -> dict[str, Any]:
    return {"id": ident, "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}


def test_a_mistral_style_template_gets_alternating_turns_and_nine_character_ids() -> None:
    """Codex's merged instructions leave two user messages in a row: joined. Call ids become 9 letters and digits:
    the id the model sampled for a call the proxy issued, else one derived from the harness's id, the same on every
    render, and a tool result carries its call's."""
    from nemo_polar.proxy.conversation import Conversation, Message, ToolCall, template_call_id

    traits = TemplateTraits(merge_leading=True, later_as_user=True, join_users=True, call_ids="alnum9")
    msgs = [
        {"role": "system", "content": "a"},
        {"role": "system", "content": "b"},
        {"role": "user", "content": "env"},
        {"role": "user", "content": "task"},
        {"role": "assistant", "content": "", "tool_calls": [_call("call_issued"), _call("toolu_foreign")]},
        {"role": "tool", "tool_call_id": "call_issued", "content": "x"},
        {"role": "tool", "tool_call_id": "toolu_foreign", "content": "y"},
    ]
    placed, note = traits.apply(msgs, {"call_issued": "Ab3dE6gH9"})
    assert note == "merged:2 users_joined:1"
    assert [m["role"] for m in placed] == ["system", "user", "assistant", "tool", "tool"]
    assert placed[1]["content"] == "env\n\ntask"
    derived = template_call_id("toolu_foreign", {})
    assert len(derived) == 9 and derived.isalnum() and derived == template_call_id("toolu_foreign", {})
    assert [c["id"] for c in placed[2]["tool_calls"]] == ["Ab3dE6gH9", derived]
    assert [placed[3]["tool_call_id"], placed[4]["tool_call_id"]] == ["Ab3dE6gH9", derived]
    assert template_call_id("call00001", {}) == "call00001"  # already of the form: as sent
    assert TemplateTraits().apply(msgs[2:]) == (msgs[2:], None)  # other templates: nothing changes

    # The model's ids travel with the restored turn: a conversation maps a tool result to the id its call sampled.
    call = ToolCall(id="call_issued", name="bash", arguments='{"command": "ls"}', template_id="Ab3dE6gH9")
    conv = Conversation(
        model="m",
        messages=[
            Message(role="user", content="go"),
            Message(role="assistant", tool_calls=[call]),
            Message(role="tool", tool_call_id="call_issued", content="x"),
        ],
    )
    placed, _ = conv.placed_messages(traits)
    assert placed[1]["tool_calls"][0]["id"] == placed[2]["tool_call_id"] == "Ab3dE6gH9"
    assert "template_id" not in conv.messages[1].model_dump()["tool_calls"][0]  # not the harness's: never echoed


def test_kimi_style_ids_number_the_conversations_calls() -> None:
    """For a format whose parser reads ``functions.NAME:INDEX`` (Kimi K2's): a call the model wrote keeps its id, a
    harness's call gets the form with its name and its place among the conversation's calls, the same on every
    render; a tool result answers its call by the id the call was given; a scripted call is written in the form."""
    from nemo_polar.proxy.conversation import script_call_id, valid_template_id
    from nemo_polar.proxy.parse.family_parser import sampled_call_ids
    from nemo_polar.proxy.store.sessions import ScriptTurn

    traits = TemplateTraits(call_ids="functions_index")
    msgs = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "", "tool_calls": [_call("call_issued"), _call("toolu_foreign")]},
        {"role": "tool", "tool_call_id": "call_issued", "content": "a"},
        {"role": "tool", "tool_call_id": "toolu_foreign", "content": "b"},
        {"role": "assistant", "content": "", "tool_calls": [_call("functions.bash:7")]},
        {"role": "tool", "tool_call_id": "functions.bash:7", "content": "c"},
    ]
    placed, note = traits.apply(msgs, {"call_issued": "functions.bash:0"})
    assert note is None
    assert [c["id"] for c in placed[1]["tool_calls"]] == ["functions.bash:0", "functions.bash:1"]
    assert [placed[2]["tool_call_id"], placed[3]["tool_call_id"]] == ["functions.bash:0", "functions.bash:1"]
    assert placed[4]["tool_calls"][0]["id"] == placed[5]["tool_call_id"] == "functions.bash:7"  # of the form: as sent
    assert traits.apply(msgs[:4], {"call_issued": "functions.bash:0"})[0] == placed[:4]  # append-only
    assert script_call_id("functions_index", "bash", 1) == "functions.bash:1"
    assert ScriptTurn(tool_calls=[{"name": "bash"}]).message("functions_index")["tool_calls"][0]["id"] == (
        "functions.bash:0"
    )
    assert valid_template_id("functions.bash:0") and valid_template_id("Ab3dE6gH9") and not valid_template_id("x")
    sample = (
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.bash:0<|tool_call_argument_begin|>{}"
        "<|tool_call_end|><|tool_call_begin|> functions.read:1 <|tool_call_argument_begin|>{}<|tool_call_end|>"
    )
    assert sampled_call_ids("kimi_k2", sample) == ["functions.bash:0", "functions.read:1"]


def test_tool_call_arguments_reach_the_template_as_vllm_hands_them() -> None:
    """As a mapping (anything but a JSON object: ``{}``), in a function object whose keys come in the OpenAI SDK's
    order: Mistral's template writes the object whole."""
    from nemo_polar.proxy.render.prepared import as_vllm_sees_it

    msg = {"role": "assistant", "content": "", "tool_calls": [_call("c"), {**_call("d"), "function": {"name": "f"}}]}
    msg["tool_calls"].append({**_call("e"), "function": {"name": "g", "arguments": "[1]"}})
    seen = as_vllm_sees_it(msg)
    assert [list(c["function"]) for c in seen["tool_calls"]] == [["arguments", "name"]] * 3
    assert [c["function"]["arguments"] for c in seen["tool_calls"]] == [{"command": "ls"}, {}, {}]
    assert msg["tool_calls"][0]["function"]["arguments"] == '{"command": "ls"}'  # the caller's message untouched


def test_the_deepseek_tool_template_renders_what_v31s_own_does_and_the_model_cards_tools() -> None:
    """The project's DeepSeek V3.1 tool template renders every conversation V3.1's own template renders exactly as
    it does (system messages gathered, reasoning cut from earlier answers, no generation prompt after a tool
    output), adds the model card's tool prompt to the system prompt, and takes arguments as vLLM hands them."""
    from transformers import AutoTokenizer

    from nemo_polar.paths import cache_dir

    directory = cache_dir() / "models" / "tiny-deepseek"
    tok = AutoTokenizer.from_pretrained(directory)
    own = json.loads((directory / "tokenizer_config.json").read_text())["chat_template"]
    ours = (directory / "chat_template.jinja").read_text()
    assert (
        "tools" not in own
        and ours == (Path(__file__).parents[1] / "nemo_polar/engine/deepseek_v31_tools.jinja").read_text()
    )

    def call(name: str, arguments: Any) -> dict[str, Any]:
        return {"id": name, "type": "function", "function": {"name": name, "arguments": arguments}}

    system, user = {"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "list"}
    calls = {"role": "assistant", "content": "", "tool_calls": [call("bash", '{"c": 1}'), call("ls", "{}")]}
    said = {"role": "assistant", "content": "Let me look.", "tool_calls": [call("bash", '{"c": 1}')]}
    result = {"role": "tool", "tool_call_id": "bash", "content": "README.md"}
    answer = {"role": "assistant", "content": "thought</think>Two files."}
    conversations = [
        [user],
        [system, user, answer, user],
        [system, {"role": "system", "content": "Be brief."}, user, calls, result, result, answer, user],
        [user, said, result, calls, result, answer],
        [system, user, {"role": "assistant", "content": "Let", "prefix": True}],
    ]
    for messages in conversations:
        for prompt in (True, False):
            for thinking in (True, False):
                kwargs = {"add_generation_prompt": prompt, "thinking": thinking, "tokenize": False}
                assert tok.apply_chat_template(messages, chat_template=ours, **kwargs) == tok.apply_chat_template(
                    messages, chat_template=own, **kwargs
                ), (messages, prompt, thinking)
    with_tools = tok.apply_chat_template([system, user], tools=[BASH], chat_template=ours, tokenize=False)
    assert with_tools.startswith("<｜begin▁of▁sentence｜>You are a coding agent.\n\n## Tools\n")
    assert '### bash\nDescription: Run a command.\n\nParameters: {"type": "object"' in with_tools
    mapped = [user, {"role": "assistant", "content": None, "tool_calls": [call("bash", {"command": "ls"})]}]
    assert '<｜tool▁sep｜>{"command": "ls"}<｜tool▁call▁end｜>' in tok.apply_chat_template(
        mapped, chat_template=ours, tokenize=False
    )


@pytest.mark.parametrize("model", list(PARSERS))
def test_the_family_directory_names_its_parsers(model: str) -> None:
    from nemo_polar.engine.families import read_family_file, stand_ins
    from nemo_polar.engine.launcher import EngineSpec, resolve_model

    path, name, max_len = resolve_model(model)
    assert read_family_file(path)["family"] == stand_ins()[model].name and (name, max_len) == (model, 32768)
    # A template-only family's directory says its tokenizer is a stand-in (the fidelity table labels its row so).
    assert bool(read_family_file(path).get("tokenizer_stand_in")) == (model in STAND_INS)
    cmd, _ = EngineSpec(model=model).command()
    tool, reasoning = PARSERS[model]
    assert (cmd[cmd.index("--tool-call-parser") + 1] if tool else "--tool-call-parser" not in cmd) == (tool or True)
    assert ("--enable-auto-tool-choice" in cmd) == bool(tool)
    assert (cmd[cmd.index("--reasoning-parser") + 1] if reasoning else "--reasoning-parser" not in cmd) == (
        reasoning or True
    )
    if reasoning:
        assert json.loads(cmd[cmd.index("--structured-outputs-config") + 1]) == {"enable_in_reasoning": True}


def test_the_project_models_keep_hermes() -> None:
    from nemo_polar.engine.launcher import EngineSpec

    cmd, _ = EngineSpec(model=QWEN3_5).command()
    assert Path(cmd[cmd.index("--chat-template") + 1]).read_text().count("System message must be at the beginning.")
    cmd, _ = EngineSpec(model="tiny-qwen3").command()
    assert cmd[cmd.index("--tool-call-parser") + 1] == "hermes" and "--reasoning-parser" not in cmd


def test_reasoning_the_prompt_opened_and_a_qwen3_coder_call_round_trip(qwen3_5: ProxyHandle) -> None:
    """Qwen3.5's generation prompt opens "<think>": the sample's reasoning until "</think>" is returned as reasoning,
    its qwen3_coder call as a tool call with typed arguments, and the echoed turn (reasoning, call) is restored to
    the exact sampled ids, so the next call continues it token for token."""

    first = (
        "I will list the files.\n</think>\n\n<tool_call>\n<function=bash>\n<parameter=command>\nls\n</parameter>\n"
        "</function>\n</tool_call>"
    )
    second = "Seen them.\n</think>\n\nTwo files."
    # A text script's tokenisation is the engine's choice (a random model may spell it a character at a time): the
    # cap holds the longest spelling.
    assert len(first) <= 128
    session = qwen3_5.session(script=[first, second], sampling_overrides={"max_tokens": 128})
    client = openai_client(qwen3_5, session["api_key"])
    tools = [BASH]
    messages: list[dict[str, Any]] = [*LIST_FILES]
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

    rec1, rec2 = qwen3_5.records(session["session_id"])
    assert rec2["render_reason"] == "continuation" and rec2["parent_call_id"] == rec1["call_id"]
    parent = rec1["prompt_token_ids"] + rec1["sampled_token_ids"]
    assert rec2["prompt_token_ids"][: len(parent)] == parent


@pytest.mark.parametrize("history", ["sampled", "template"])
def test_a_history_the_template_rewrites_under_each_policy(qwen3_5: ProxyHandle, history: str) -> None:
    """Qwen3.5's template drops an answer's reasoning once a later user query follows. ``sampled`` (the default):
    the next call continues the exact ids sampled, reasoning included, and the session is one trace. ``template``:
    the next call is the template's render, as the model is served at deployment: the reasoning is gone, so the
    context is not an extension of the sample, and reconstruction starts a new segment there instead of silently
    training on a context the model never saw. Each record names the policy it ran under."""

    from nemo_polar.proxy.store.records import CallRecord
    from nemo_polar.reconstruct.builders import prefix_merging

    script = ["Let me greet.\n</think>\n\nHello.", "Again.\n</think>\n\nBye."]
    session = qwen3_5.session(script=script, history=history, sampling_overrides={"max_tokens": 32})
    client = openai_client(qwen3_5, session["api_key"])
    messages: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
    first = client.chat.completions.create(model="local-model", messages=messages)  # type: ignore[arg-type]
    assert first.choices[0].message.content == "Hello."
    messages += [{"role": "assistant", "content": "Hello."}, {"role": "user", "content": "once more"}]
    second = client.chat.completions.create(model="local-model", messages=messages)  # type: ignore[arg-type]
    assert second.choices[0].message.content == "Bye."

    rec1, rec2 = (CallRecord.model_validate(r) for r in qwen3_5.records(session["session_id"]))
    assert rec1.history == rec2.history == history
    sampled = rec1.prompt_token_ids + rec1.sampled_token_ids
    extends = rec2.prompt_token_ids[: len(sampled)] == sampled
    built = prefix_merging([rec1, rec2])
    if history == "sampled":
        assert rec2.render_reason == "continuation" and extends and len(built.traces) == 1
    else:
        assert rec2.render_reason == "template_history" and not extends and len(built.traces) == 2
        from transformers import AutoTokenizer

        from nemo_polar.paths import cache_dir

        tok = AutoTokenizer.from_pretrained(cache_dir() / "models" / QWEN3_5)
        assert "Let me greet." in tok.decode(sampled) and "Let me greet." not in tok.decode(rec2.prompt_token_ids)


# A template that takes one system message, first, and renders no tools (as Gemma 3's has no tool support).
ONE_SYSTEM_NO_TOOLS = (
    "{%- for m in messages -%}"
    "{%- if m.role == 'system' and not loop.first -%}{{ raise_exception('System message must be at the beginning.') }}"
    "{%- endif -%}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{%- endfor -%}{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}"
)

# A template that gathers every system message at the top (as DeepSeek V3.1's does): a later one would rewrite the
# prefix of every render after it.
SYSTEMS_ON_TOP = (
    "{%- for m in messages if m.role == 'system' -%}<|im_start|>system\n{{ m.content }}<|im_end|>\n{%- endfor -%}"
    "{%- for m in messages if m.role != 'system' -%}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{%- endfor -%}{%- if tools -%}{{ tools | tojson }}{%- endif -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}"
)

# Strict user/assistant alternation and 9-character call ids (as Mistral NeMo's): two users in a row are refused.
ALTERNATING_NINE_CHAR_IDS = (
    "{%- for m in messages -%}"
    "{%- if m.role == 'user' and loop.index0 > 0 and messages[loop.index0 - 1].role == 'user' -%}"
    "{{ raise_exception('Conversation roles must alternate') }}{%- endif -%}"
    "{%- for c in m.tool_calls or [] -%}{%- if c.id | length != 9 -%}{{ raise_exception('ids of 9') }}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if m.role == 'tool' and m.tool_call_id | length != 9 -%}{{ raise_exception('ids of 9') }}{%- endif -%}"
    "<|im_start|>{{ m.role }}\n{{ m.content }}{{ (m.tool_calls or []) | tojson }}<|im_end|>\n"
    "{%- endfor -%}{%- if tools -%}{{ tools | tojson }}{%- endif -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}"
)

# A template that renders the first system message and silently skips any other (as gpt-oss's does).
FIRST_SYSTEM_ONLY = (
    "{%- for m in messages -%}{%- if m.role != 'system' or loop.first -%}"
    "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endif -%}{%- endfor -%}"
    "{%- if tools -%}{{ tools | tojson }}{%- endif -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}"
)


# What a scripted tool call looks like in each family's own format, as its template writes it (the demo's first call).
SCRIPTED_CALL = {
    QWEN3_5: "<tool_call>\n<function=",  # qwen3_coder XML
    "tiny-llama3": '"parameters": {',  # bare JSON
    "tiny-gpt_oss": " to=functions.",  # harmony: recipient, then <|channel|> as its special token
    "tiny-glm": "</arg_key><arg_value>",  # GLM-4.7's XML, after reasoning: its prompt opens "<think>"
    "tiny-mistral": '[TOOL_CALLS][{"arguments": {',  # JSON list, each call with its own 9-character id
}


def _demo_on(
    served: Served,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    envs: list[str] | None,
) -> None:
    """``make demo MODEL=<family>``: the CLIs solve their tasks with each scripted turn written by the family's
    template in its tool-call format, sampled token for token and parsed back by vLLM's parser for the family."""
    from transformers import AutoTokenizer

    envs = run_demo(served.engine, tmp_path, monkeypatch, capsys, envs)
    root = loopback.get(f"{served.engine}/v1/models", timeout=10).json()["data"][0]["root"]
    tok = AutoTokenizer.from_pretrained(root)
    for env in envs:
        [records] = (tmp_path / env).glob("*/records.jsonl")
        first = json.loads(records.read_text().splitlines()[0])
        ids = first["sampled_token_ids"]
        assert SCRIPTED_CALL[served.model] in tok.decode(ids), env
        assert ids == tok.encode(tok.decode(ids), add_special_tokens=False)  # canonical, special tokens as themselves
        if served.model == "tiny-glm":  # no end-of-turn token: it ends on the one the template writes next
            assert tok.decode(ids[-1:]) == "<|observation|>"
        [call] = first["output"]["tool_calls"]  # the turn as the family's parser read it, recorded for the export
        assert call["id"] and call["name"] and json.loads(call["arguments"])
        if served.model == "tiny-mistral":  # the tool result answers the id the model wrote, not the harness's
            second = json.loads(records.read_text().splitlines()[1])
            sampled_id = json.loads(tok.decode(ids).split("[TOOL_CALLS]")[1].split("</s>")[0])[0]["id"]
            assert f'"call_id": "{sampled_id}"' in tok.decode(
                second["prompt_token_ids"][len(first["prompt_token_ids"]) :]
            )
            assert call["template_id"] == sampled_id  # recorded beside the harness's id, for the export


@pytest.mark.parametrize(
    ("template", "traits"),
    [
        (ONE_SYSTEM_NO_TOOLS, TemplateTraits(merge_leading=True, later_as_user=True, renders_tools=False)),
        (FIRST_SYSTEM_ONLY, TemplateTraits(merge_leading=True, later_as_user=True)),
        (SYSTEMS_ON_TOP, TemplateTraits(later_as_user=True)),
        (ALTERNATING_NINE_CHAR_IDS, TemplateTraits(join_users=True, call_ids="alnum9")),
        (None, TemplateTraits()),  # the project's ChatML+tools template, as tiny-qwen3 ships it
    ],
    ids=["one_system_no_tools", "first_system_only", "systems_on_top", "alternating_nine_char_ids", "chatml_tools"],
)
def test_the_probe_reads_what_a_template_takes(tmp_path: Path, template: str | None, traits: TemplateTraits) -> None:
    import shutil

    from nemo_polar.paths import cache_dir
    from nemo_polar.proxy.render.renderer import LocalRenderer, probe_template

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


def _placement_checked(harness: str, traits: TemplateTraits, note: str | None) -> None:
    """Codex sends two developer messages up front, Claude Code a system message after the first user turn: placed
    where the template takes them, only for a template that would refuse or drop them; Mistral's strict alternation
    joins the user messages that then stand in a row, and only for it."""
    expected = {
        "codex": "merged:" if traits.merge_leading else None,
        "claude-code": "as_user:" if traits.later_as_user else None,
    }.get(harness)
    notes = (note or "").split()
    placed = [n for n in notes if n.startswith(("merged:", "as_user:"))]
    assert any(n.startswith(expected) for n in placed) if expected else not placed
    assert any(n.startswith("users_joined:") for n in notes) <= traits.join_users


def _same_day(render: Callable[[], tuple[list[int], list[int]]]) -> tuple[list[int], list[int]]:
    """Two renders to compare, redone once if they straddled midnight (gpt-oss's template prints today's date)."""
    day = time.strftime("%Y-%m-%d")
    ours, engines = render()
    return render() if ours != engines and day != time.strftime("%Y-%m-%d") else (ours, engines)


FAMILY_FIXTURES = [(f, h, n) for f in TRAITS for h, n in all_fixtures()]


@pytest.mark.parametrize(("family", "harness", "name"), FAMILY_FIXTURES, indirect=["family"])
def test_every_cli_request_renders_as_the_engine_does(family: Served, harness: str, name: str) -> None:
    """The proxy's in-process render of every captured CLI request, system messages placed where the template takes
    them (as the proxy's probe found), equals the engine's own ``/tokenize`` render; Gemma 3's template renders no
    tools: such a request is refused. Nothing is sampled here (the sampled side: the test below)."""
    traits = TRAITS[family.model]
    proxy = family.proxy.apps.proxy
    assert (proxy._traits or _probed(family.proxy)) == traits
    assert proxy.renderer.name == "local"  # what the proxy renders with: adopted once verified against the engine
    fixture = load_fixture(harness, name)
    conv = get_adapter(CAPTURED_APIS[fixture["api"]]).parse(fixture["body"])
    if conv.tools and not traits.renders_tools:  # Gemma 3: the model would never see the tools
        session = family.proxy.session(sampling_overrides={"max_tokens": 1})
        response = _post(family.proxy, session["api_key"], fixture)
        assert response.status_code == 400 and "renders no tools" in response.text
        [rec] = family.proxy.records(session["session_id"])
        assert not rec["complete"] and "renders no tools" in rec["error"]
        return
    messages, note = conv.placed_messages(traits)
    tools = conv.template_tools() if conv.tool_choice != "none" else None
    ours, engines = _same_day(
        lambda: (proxy.renderer.render_sync(messages, tools, {}), _engine_render(family.engine, fixture, traits))
    )
    assert ours == engines
    _placement_checked(harness, traits, note)


@functools.cache
def _dialect_and_tools(harness: str, name: str) -> tuple[str, bool]:
    fixture = load_fixture(harness, name)
    return fixture["api"], bool(get_adapter(CAPTURED_APIS[fixture["api"]]).parse(fixture["body"]).tools)


def _accepted(model: str, harness: str, name: str) -> bool:
    """Whether the family's template takes the request (Gemma 3's refuses tools: nothing is sampled)."""
    return TRAITS[model].renders_tools or not _dialect_and_tools(harness, name)[1]


# Sampled: one request per dialect per family in make test, every request the family takes in make test-full.
FAMILY_SAMPLED = [c for c in FAMILY_FIXTURES if _accepted(*c)]
# make test samples each dialect's shortest request with tools (where the family renders tools): a CLI's first
# request is 1k-16k tokens, and prefill is the time.
SHORTEST_PER_DIALECT = [
    min(
        (c for c in FAMILY_SAMPLED if c[0] == model and _dialect_and_tools(*c[1:])[0] == api),
        key=lambda c: (not _dialect_and_tools(*c[1:])[1], len(json.dumps(load_fixture(*c[1:])["body"]))),
    )
    for model in TRAITS
    for api in CAPTURED_APIS
    if any(_dialect_and_tools(*c[1:])[0] == api for c in FAMILY_SAMPLED if c[0] == model)
]


@pytest.mark.parametrize(
    ("family", "harness", "name"),
    lane(FAMILY_SAMPLED, SHORTEST_PER_DIALECT, ids=lambda c: "-".join(c)),
    indirect=["family"],
)
def test_the_record_holds_what_the_engine_sampled_on_the_family(family: Served, harness: str, name: str) -> None:
    """A request replayed through the proxy in continuation mode: the record's prompt is the engine's render, rendered
    in-process, and its ids and logprobs are what the engine samples for that prompt."""
    fixture = load_fixture(harness, name)
    traits = TRAITS[family.model]
    assert _probed(family.proxy) == traits
    overrides = {"max_tokens": MAX_TOKENS, "temperature": 0.0}

    def replay() -> tuple[list[int], list[int]]:
        nonlocal rec
        # sent once before, so the recorded call and the direct re-query are prefilled the same way (prefix cache)
        send_fixture(family.proxy, family.proxy.session(sampling_overrides=overrides)["api_key"], fixture, True)
        session = family.proxy.session(sampling_overrides=overrides)
        send_fixture(family.proxy, session["api_key"], fixture, True)
        [rec] = family.proxy.records(session["session_id"])
        return rec["prompt_token_ids"], _engine_render(family.engine, fixture, traits)

    rec: dict[str, Any] = {}
    ours, engines = _same_day(replay)
    assert rec["complete"] and rec["error"] is None and rec["mode"] == "continuation"
    assert rec["tokenize"] == "full:first"  # rendered in-process, not by the engine's /tokenize
    assert rec["sampling"]["max_tokens"] == MAX_TOKENS
    assert 0 < len(rec["sampled_token_ids"]) == len(rec["sampled_logprobs"]) <= MAX_TOKENS
    _placement_checked(harness, traits, rec["system_messages"])
    assert ours == engines
    assert_engine_sampled(family.engine, family.model, rec)


class EngineOnTransformers:
    """Stand-in for an engine's render, labelled so: the engine's ``/tokenize`` is a local render with or without
    reasoning aliasing, the one difference between transformers releases this checks (a real engine on an older
    transformers is what tiny-gpt_oss's replay above meets)."""

    def __init__(self, root: Path, alias: bool) -> None:
        from nemo_polar.proxy.render.renderer import LocalRenderer

        self.root, self.render = root, LocalRenderer(root)
        self.render.inputs.alias_reasoning = alias

    async def model_root(self) -> str:
        return str(self.root)

    async def tokenize_chat(self, messages: Any, tools: Any, kwargs: Any) -> list[int]:
        return await self.render.render(messages, tools, kwargs)


@pytest.mark.parametrize("alias", [True, False])
def test_the_local_renderer_follows_the_engines_reasoning_fields(alias: bool) -> None:
    """gpt-oss's template reads only ``thinking``: whether the engine's transformers copies ``reasoning_content``
    into it decides whether the analysis before a tool call is in the prompt. The proxy's renderer, checked on a
    mid-turn probe, follows the engine either way."""
    from nemo_polar.paths import cache_dir
    from nemo_polar.proxy.render.renderer import PROBE_MESSAGES, PROBE_TOOLS, verified_local_renderer

    engine = EngineOnTransformers(cache_dir() / "models" / "tiny-gpt_oss", alias)
    local = asyncio.run(verified_local_renderer(engine))  # type: ignore[arg-type]
    assert local is not None and local.inputs.alias_reasoning is alias
    midturn = asyncio.run(local.render(PROBE_MESSAGES[:4], PROBE_TOOLS, {}))
    analysis = local.tokenizer.encode("<|channel|>analysis<|message|>Let me look.", add_special_tokens=False)
    assert any(midturn[i : i + len(analysis)] == analysis for i in range(len(midturn))) is alias


def test_a_llama3_json_call_is_parsed_by_vllms_parser_and_continued(serve: OneFamilyAtATime) -> None:
    """Llama 3's tool calls are bare JSON, read by vLLM's own ``llama3_json`` parser (the worker in the engine's
    environment): the scripted sample comes back as a tool call, and the next call continues the exact sampled ids
    across Llama 3's end-of-turn token (named by its polar-family.json)."""

    proxy = serve("tiny-llama3").proxy
    first = '{"name": "bash", "parameters": {"command": "ls"}}'
    session = proxy.session(script=[first, "Two files."], sampling_overrides={"max_tokens": 64})
    client = openai_client(proxy, session["api_key"])
    tools = [BASH]
    messages: list[dict[str, Any]] = [*LIST_FILES]
    with client.chat.completions.stream(model="local-model", messages=messages, tools=tools) as streamed:  # type: ignore[arg-type]
        for _ in streamed:
            pass
        r1 = streamed.get_final_completion()
    msg = r1.choices[0].message
    assert msg.content in (None, "") and msg.tool_calls is not None, msg
    [call] = msg.tool_calls
    assert call.function.name == "bash" and json.loads(call.function.arguments) == {"command": "ls"}
    assert r1.choices[0].finish_reason == "tool_calls"

    messages += [
        msg.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "README.md\nhello.py"},
    ]
    r2 = client.chat.completions.create(model="local-model", messages=messages, tools=tools)  # type: ignore[arg-type]
    assert r2.choices[0].message.content == "Two files." and not r2.choices[0].message.tool_calls

    rec1, rec2 = proxy.records(session["session_id"])
    assert rec1["sampled_token_ids"][-1] in (128001, 128008, 128009)  # any of generation_config's stops
    assert rec2["render_reason"] == "continuation" and rec2["parent_call_id"] == rec1["call_id"]
    parent = rec1["prompt_token_ids"] + rec1["sampled_token_ids"]
    assert rec2["prompt_token_ids"][: len(parent)] == parent


def _a_scripted_call_and_its_answer(family: Served) -> tuple[str, dict[str, Any], dict[str, Any], Any]:
    """A scripted bash call, its result, a scripted answer, through the OpenAI SDK: the call's id as the harness got
    it, both records (the second checked to continue the first's ids) and the family's tokenizer."""
    from transformers import AutoTokenizer

    from nemo_polar.paths import cache_dir

    proxy = family.proxy
    script = [{"tool_calls": [{"name": "bash", "arguments": {"command": "ls"}}]}, "Two files."]
    session = proxy.session(script=script, sampling_overrides={"max_tokens": 64})
    client = openai_client(proxy, session["api_key"])
    messages: list[dict[str, Any]] = [*LIST_FILES]
    r1 = client.chat.completions.create(model="local-model", messages=messages, tools=[BASH])  # type: ignore[arg-type]
    msg = r1.choices[0].message
    [call] = msg.tool_calls or []
    assert call.function.name == "bash" and json.loads(call.function.arguments) == {"command": "ls"}, msg
    messages += [
        msg.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "README.md\nhello.py"},
    ]
    r2 = client.chat.completions.create(model="local-model", messages=messages, tools=[BASH])  # type: ignore[arg-type]
    assert r2.choices[0].message.content == "Two files."

    rec1, rec2 = proxy.records(session["session_id"])
    assert rec2["render_reason"] == "continuation" and rec2["parent_call_id"] == rec1["call_id"]
    parent = rec1["prompt_token_ids"] + rec1["sampled_token_ids"]
    assert rec2["prompt_token_ids"][: len(parent)] == parent
    return call.id, rec1, rec2, AutoTokenizer.from_pretrained(cache_dir() / "models" / family.model)


@pytest.mark.parametrize("family", ["tiny-kimi_k2"], indirect=True)  # with the family's replays: one engine start
def test_a_kimi_call_carries_the_id_form_its_parser_reads(family: Served) -> None:
    """Kimi K2's template writes a call's id as it is given, and vLLM's kimi_k2 parser drops a call whose id is not
    ``functions.NAME:INDEX``: the scripted call is written with such an id and comes back as a tool call; the record
    keeps the model's id beside the harness's, and the tool result answers the call by the model's id."""
    call_id, rec1, rec2, tok = _a_scripted_call_and_its_answer(family)
    [recorded] = rec1["output"]["tool_calls"]
    assert recorded["template_id"] == "functions.bash:0" and recorded["id"] == call_id
    parent = rec1["prompt_token_ids"] + rec1["sampled_token_ids"]
    assert "## Return of functions.bash:0\nREADME.md" in tok.decode(rec2["prompt_token_ids"][len(parent) :])


@pytest.mark.parametrize("family", ["tiny-deepseek"], indirect=True)  # with the family's replays: one engine start
def test_a_deepseek_call_is_read_by_vllms_parser_and_the_next_call_continues_it(family: Served) -> None:
    """DeepSeek V3.1 behind the project's tool template: the model is shown the tools in the model card's prompt,
    a scripted call written in V3.1's format comes back through vLLM's deepseek_v31 parser as a tool call, and the
    next call (after a tool output: no generation prompt) continues the sampled ids."""
    _, rec1, rec2, tok = _a_scripted_call_and_its_answer(family)
    parent = rec1["prompt_token_ids"] + rec1["sampled_token_ids"]
    assert "## Tools\nYou have access to the following tools:\n\n### bash\n" in tok.decode(rec1["prompt_token_ids"])
    assert "<｜tool▁call▁begin｜>bash<｜tool▁sep｜>" in tok.decode(rec1["sampled_token_ids"])
    assert (
        tok.decode(rec2["prompt_token_ids"][len(parent) :])
        == "<｜tool▁output▁begin｜>README.md\nhello.py<｜tool▁output▁end｜>"
    )


def test_a_non_streamed_llama3_json_call_is_parsed_whole(serve: OneFamilyAtATime) -> None:
    """A request that does not stream (mini-swe-agent's, through litellm) gets the sample parsed whole, as vLLM's
    endpoint parses a non-streamed output: fed to the streaming parser as one delta, llama3_json's call was lost and
    the reply came back empty."""
    proxy = serve("tiny-llama3").proxy
    call = '{"name": "bash", "parameters": {"command": "ls"}}'
    session = proxy.session(script=[call], sampling_overrides={"max_tokens": 64})
    headers = {"Authorization": f"Bearer {session['api_key']}"}
    body = {"model": "local-model", "messages": LIST_FILES, "tools": [BASH]}
    resp = loopback.post(f"{proxy.url}/v1/chat/completions", json=body, headers=headers, timeout=60)
    assert resp.status_code == 200, resp.text
    [choice] = resp.json()["choices"]
    [call] = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "bash" and json.loads(call["function"]["arguments"]) == {"command": "ls"}
    assert choice["finish_reason"] == "tool_calls"


def test_a_turn_the_template_cannot_write_is_a_clear_error(serve: OneFamilyAtATime) -> None:
    """Llama 3.1's template takes one tool call per message: a scripted turn with two is refused with the template's
    own reason, and a failed record."""
    proxy = serve("tiny-llama3").proxy
    calls = [{"name": "bash", "arguments": {"command": c}} for c in ("ls", "pwd")]
    session = proxy.session(script=[{"tool_calls": calls}])
    headers = {"Authorization": f"Bearer {session['api_key']}"}
    body = {"model": "local-model", "messages": LIST_FILES, "tools": [BASH]}
    resp = loopback.post(f"{proxy.url}/v1/chat/completions", json=body, headers=headers, timeout=60)
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "script_invalid", resp.text
    assert "cannot write script entry 0" in resp.json()["error"]["message"]
    assert "single tool-calls" in resp.json()["error"]["message"]  # the template's raise_exception text
    [rec] = proxy.records(session["session_id"])
    assert not rec["complete"] and "cannot write script entry 0" in rec["error"]


DEMO_FAMILIES = [QWEN3_5, "tiny-llama3", "tiny-gpt_oss", "tiny-glm", "tiny-mistral"]
# What a family changes is the template writing the tool call and vLLM's parser reading it back, whatever dialect the
# CLI speaks (the proxy renders every dialect through the template: the render test above covers each; the parser
# tests above read each family's calls back): make test runs Pi (the lightest CLI) on Qwen3.5, the paper's family,
# make test-full every CLI on every family.
DEMO_CELLS = [(f, env) for f in DEMO_FAMILIES for env in ENVIRONMENTS]
DEMO_KEEP = [(QWEN3_5, "polar_pi")]


@pytest.mark.parametrize(("family", "env"), lane(DEMO_CELLS, DEMO_KEEP, ids=lambda c: "-".join(c)), indirect=["family"])
def test_the_demo_runs_on_the_family(
    family: Served, env: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A CLI's whole session on the family: one per family in make test, every CLI in make test-full."""
    _demo_on(family, tmp_path, monkeypatch, capsys, [env])
