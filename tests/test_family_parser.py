"""Model families' output formats read by vLLM's own parsers (nemo_polar/proxy/parse/family_parser.py over
nemo_polar/engine/parser_worker.py, in the engine's virtualenv): a sample in each family's real format, tokenised
with the family's real tokenizer, parsed streamed token by token (text and ids, as the engine streams them: the
stop token's id with no text) and whole, into the same reasoning, content and tool calls."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nemo_polar.engine.launcher import engine_python
from nemo_polar.paths import cache_dir
from nemo_polar.proxy.parse.family_parser import (
    FamilyFormat,
    ParserWorker,
    ParserWorkerError,
    acquire_parser_worker,
    release_parser_worker,
    sampled_call_ids,
)
from nemo_polar.proxy.parse.parser import ParseEvent

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}},
                "required": ["command"],
            },
        },
    }
]
QWEN3_CODER = (
    "<tool_call>\n<function=bash>\n<parameter=command>\nls -la\n</parameter>\n<parameter=timeout>\n30\n"
    "</parameter>\n</function>\n</tool_call>"
)
LS = {"command": "ls"}
LS_30 = {"command": "ls -la", "timeout": 30}

# (model, tool parser, reasoning parser, sample, stop token, reasoning, content, tool calls)
CASES: dict[str, tuple[str, str, str | None, str, str, str | None, str | None, list[tuple[str, Any]]]] = {
    "qwen3_5-reasoning-call": (
        "tiny-qwen3_5", "qwen3_coder", "qwen3", "I should list files.\n</think>\n\n" + QWEN3_CODER, "<|im_end|>",
        "I should list files.", None, [("bash", LS_30)],
    ),
    "qwen3_5-reasoning-text": (
        "tiny-qwen3_5", "qwen3_coder", "qwen3", "Just answer.\n</think>\n\nHello <b>there</b>.", "<|im_end|>",
        "Just answer.", "Hello <b>there</b>.", [],
    ),
    "llama3-json-call": (
        "tiny-llama3", "llama3_json", None, '{"name": "bash", "parameters": {"command": "ls"}}', "<|eot_id|>",
        None, None, [("bash", LS)],
    ),
    "llama3-python-tag-call": (
        "tiny-llama3", "llama3_json", None, '<|python_tag|>{"name": "bash", "parameters": {"command": "ls"}}',
        "<|eom_id|>", None, None, [("bash", LS)],
    ),
    "llama3-text": (
        "tiny-llama3", "llama3_json", None, "Files: a, b {not json}.", "<|eot_id|>",
        None, "Files: a, b {not json}.", [],
    ),
    "gpt_oss-analysis-call": (
        "tiny-gpt_oss", "openai", "openai_gptoss",
        "<|channel|>analysis<|message|>Need to list files.<|end|><|start|>assistant to=functions.bash"
        '<|channel|>commentary json<|message|>{"command":"ls"}', "<|call|>",
        "Need to list files.", None, [("bash", LS)],
    ),
    "gpt_oss-analysis-final": (
        "tiny-gpt_oss", "openai", "openai_gptoss",
        "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>Hello!", "<|return|>",
        "Easy.", "Hello!", [],
    ),
    "glm-reasoning-call": (
        "tiny-glm", "glm47", "glm45",
        "Let me list.</think><tool_call>bash<arg_key>command</arg_key><arg_value>ls -la</arg_value>"
        "<arg_key>timeout</arg_key><arg_value>30</arg_value></tool_call>", "<|observation|>",
        "Let me list.", None, [("bash", LS_30)],
    ),
    "glm-reasoning-text": (
        "tiny-glm", "glm47", "glm45", "Hmm.</think>Hello world.", "<|user|>", "Hmm.", "Hello world.", [],
    ),
    "mistral-calls": (
        "tiny-mistral", "mistral", None,
        'Listing.[TOOL_CALLS][{"name": "bash", "arguments": {"command": "ls"}, "id": "abc123DEF"}, '
        '{"name": "bash", "arguments": {"command": "ls -la", "timeout": 30}, "id": "Zz9Yy8Xx7"}]', "</s>",
        None, "Listing.", [("bash", LS), ("bash", LS_30)],
    ),
    "deepseek-call": (
        "tiny-deepseek", "deepseek_v31", "deepseek_v3",
        "Let me see.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>bash<｜tool▁sep｜>"
        '{"command": "ls"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>', "<｜end▁of▁sentence｜>",
        None, "Let me see.", [("bash", LS)],
    ),
    "qwen3-hermes-text-call": (
        "tiny-qwen3", "hermes", None,
        'Sure.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>', "<|im_end|>",
        None, "Sure.", [("bash", LS)],
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def worker() -> Iterator[ParserWorker]:
    w = ParserWorker()
    yield w
    w.close()


def test_the_proxies_of_a_process_share_one_parser_worker() -> None:
    """Every proxy in a process holds the same worker (one vLLM import, not one per proxy); the last release stops it
    and the next proxy gets a fresh one. (Keyed by the interpreter named here, apart from the proxies other tests
    in this process still hold.)"""
    fmt = FamilyFormat(str(cache_dir() / "models" / "tiny-qwen3"), "hermes", None)
    sample = 'Sure.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
    ids = _tokenizer("tiny-qwen3").encode(sample, add_special_tokens=False)
    python = engine_python()
    first, second = acquire_parser_worker(python), acquire_parser_worker(python)
    assert first is second
    assert first.parse(fmt, sample, ids, tools=TOOLS)["tool_calls"][0]["name"] == "bash"
    proc = first.process._proc
    release_parser_worker(first)
    assert acquire_parser_worker(python) is second and second.process._proc is proc  # still held: the same process
    release_parser_worker(second)
    release_parser_worker(second)
    assert second.process._proc is None and proc is not None and proc.poll() is not None  # the last holder stopped it
    fresh = acquire_parser_worker(python)
    assert fresh is not second
    release_parser_worker(fresh)


def _tokenizer(model: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(cache_dir() / "models" / model)


def _events(events: list[ParseEvent]) -> tuple[str | None, str | None, list[tuple[str, Any]]]:
    reasoning = "".join(e.text for e in events if e.kind == "reasoning").strip() or None
    content = "".join(e.text for e in events if e.kind == "text").strip() or None
    calls = [(e.call.name, json.loads(e.call.arguments)) for e in events if e.call is not None]
    return reasoning, content, calls


@pytest.mark.parametrize("case", list(CASES))
def test_a_family_sample_parses_streamed_and_whole(worker: ParserWorker, case: str) -> None:
    model, tool_parser, reasoning_parser, sample, stop, *expected = CASES[case]
    tok = _tokenizer(model)
    fmt = FamilyFormat(str(cache_dir() / "models" / model), tool_parser, reasoning_parser, harmony="gpt_oss" in model)
    messages = [{"role": "user", "content": "list files"}]
    prompt = list(tok.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=True))
    prompt = prompt["input_ids"] if isinstance(prompt, dict) or hasattr(prompt, "input_ids") else prompt
    ids = tok.encode(sample, add_special_tokens=False)

    stream = worker.stream(fmt, tools=TOOLS, prompt_token_ids=prompt)
    events: list[ParseEvent] = []
    seen = ""
    for i in range(len(ids)):  # one token at a time, its text as an incremental detokeniser gives it
        text = tok.decode(ids[: i + 1], skip_special_tokens=stream.skip_special_tokens)
        events += stream.feed(text[len(seen) :], [ids[i]])
        seen = text
    events += stream.feed("", [tok.convert_tokens_to_ids(stop)], finished=True)  # the stop token: an id, no text
    assert _events(events) == tuple(expected)

    # A consumer that falls behind the engine gets its steps merged: the same sample in deltas of three tokens and
    # in one delta parses the same (vLLM's deepseek_v31 streaming parser lost a call that came in one piece).
    for size in (3, len(ids) + 1):
        merged = worker.stream(fmt, tools=TOOLS, prompt_token_ids=prompt)
        chunks = [[*ids, tok.convert_tokens_to_ids(stop)][k : k + size] for k in range(0, len(ids) + 1, size)]
        events, done = [], 0
        for k, chunk in enumerate(chunks):
            text = tok.decode(ids[: done + len(chunk)], skip_special_tokens=merged.skip_special_tokens)
            prefix = tok.decode(ids[:done], skip_special_tokens=merged.skip_special_tokens)
            events += merged.feed(text[len(prefix) :], chunk, finished=k == len(chunks) - 1)
            done += len(chunk)
        assert _events(events) == tuple(expected), f"in deltas of {size} tokens"

    # Mistral's calls carry the model's own ids, which vLLM's parser drops (it mints random ones): read from the text.
    assert sampled_call_ids(tool_parser, seen) == (["abc123DEF", "Zz9Yy8Xx7"] if tool_parser == "mistral" else [])

    whole = worker.parse(fmt, seen, [*ids, tok.convert_tokens_to_ids(stop)], tools=TOOLS, prompt_token_ids=prompt)
    calls = [(c["name"], json.loads(c["arguments"])) for c in whole["tool_calls"]]
    assert ((whole["reasoning"] or "").strip() or None, (whole["content"] or "").strip() or None, calls) == tuple(
        expected
    )


def test_a_parser_vllm_does_not_know_is_a_clear_error_and_the_worker_serves_on(worker: ParserWorker) -> None:
    fmt = FamilyFormat(str(cache_dir() / "models" / "tiny-llama3"), "no_such_parser", None)
    with pytest.raises(ParserWorkerError, match="no_such_parser"):
        worker.parse(fmt, "hello", [])
    ok = worker.parse(FamilyFormat(fmt.model_dir, "llama3_json", None), "hello", [])
    assert ok["content"] == "hello" and ok["tool_calls"] == []


def test_which_formats_need_vllms_parsers_and_what_they_need() -> None:
    """hermes, qwen3_coder and <think> are read in process; any other format needs the model's files beside the
    proxy, and says so (a failed call with a reason, never text parsed by the wrong rules)."""
    from nemo_polar.proxy.engine_client import EngineInfo
    from nemo_polar.proxy.errors import ProxyError
    from nemo_polar.proxy.parse.family_parser import family_format

    remote = EngineInfo(model="m", max_model_len=None, eot_id=None, root="/nowhere/on/this/machine")
    assert family_format(remote, None, None) is None  # no family file: hermes, in process
    assert family_format(remote, "qwen3_coder", "qwen3") is None
    with pytest.raises(ProxyError) as refused:
        family_format(remote, "llama3_json", None)
    assert refused.value.code == "parser_unavailable" and "llama3_json" in refused.value.message

    root = str(cache_dir() / "models" / "tiny-gpt_oss")
    from nemo_polar.engine.families import read_family_file

    local = EngineInfo(model="m", max_model_len=None, eot_id=None, root=root, family=read_family_file(Path(root)))
    assert family_format(local, None, None) == FamilyFormat(root, "openai", "openai_gptoss", harmony=True)
    assert family_format(local, "hermes", "qwen3") is None  # the proxy's flags win over the directory's file
