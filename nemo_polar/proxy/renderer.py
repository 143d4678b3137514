"""Rendering a conversation into the engine's prompt token ids.

The engine's ``/tokenize`` is the reference. When the engine's model directory is on this machine the proxy
renders with the same tokenizer and chat template in-process instead, which takes a request off the engine's
API server and a round trip off every call's time to first token. The local renderer is used only after it
reproduced the engine's render exactly on a probe conversation (system prompt, tools, a tool call with compact
arguments, a tool result, reasoning); otherwise the proxy keeps using ``/tokenize``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from pathlib import Path
from typing import Any, Protocol

from nemo_polar.proxy.engine_client import EngineClient

log = logging.getLogger(__name__)

PROBE_TOOLS = [
    {"type": "function", "function": {"name": "bash", "description": "Run a command. Ünïcode & <tags>.",
     "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}},
]  # fmt: skip
PROBE_MESSAGES = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "list the files\n  please"},
    {"role": "assistant", "content": "", "reasoning": "Let me look.", "reasoning_content": "Let me look.",
     "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command":"ls"}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "README.md\nhello.py"},
    {"role": "assistant", "content": "Two files."},
    {"role": "user", "content": "thanks"},
]  # fmt: skip


class Renderer(Protocol):
    name: str

    async def render(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, kwargs: dict[str, Any]
    ) -> list[int]: ...


class EngineRenderer:
    name = "engine"

    def __init__(self, engine: EngineClient) -> None:
        self.engine = engine

    async def render(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, kwargs: dict[str, Any]
    ) -> list[int]:
        return await self.engine.tokenize_chat(messages, tools, kwargs)


def _as_vllm_sees_them(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """vLLM hands HF templates tool-call arguments as parsed objects, not JSON strings."""
    out = []
    for msg in messages:
        calls = msg.get("tool_calls")
        if calls:
            parsed = []
            for call in calls:
                fn = dict(call["function"])
                if isinstance(fn.get("arguments"), str):
                    with contextlib.suppress(json.JSONDecodeError):
                        fn["arguments"] = json.loads(fn["arguments"])
                parsed.append({**call, "function": fn})
            msg = {**msg, "tool_calls": parsed}
        out.append(msg)
    return out


def preload_tokenizers() -> bool:
    """Import the tokenizer stack on the calling thread, before the server runs. Importing transformers takes
    seconds, and doing it lazily in a worker thread while the server runs stalls the event loop for as long: on a
    busy 2-core machine ``/health`` answered after 12.7 s instead of 0.45 s. False when transformers is missing
    (the engine then renders)."""
    try:
        from transformers import AutoTokenizer  # noqa: F401
    except ImportError:
        return False
    return True


class LocalRenderer:
    name = "local"

    def __init__(self, model_dir: Path) -> None:
        from transformers import AutoTokenizer  # imported here: only needed when the engine's files are local

        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        template = model_dir / "chat_template.jinja"
        if template.exists():  # what `polar engine up` passes to vLLM as --chat-template
            self.tokenizer.chat_template = template.read_text()

    def render_sync(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, kwargs: dict[str, Any]
    ) -> list[int]:
        text = self.tokenizer.apply_chat_template(
            _as_vllm_sees_them(messages), tools=tools, add_generation_prompt=True, tokenize=False, **kwargs
        )
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    async def render(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, kwargs: dict[str, Any]
    ) -> list[int]:
        return await asyncio.to_thread(self.render_sync, messages, tools, kwargs)


async def verified_local_renderer(engine: EngineClient) -> LocalRenderer | None:
    """A local renderer that matches the engine's render on the probe conversation, or None."""
    root = await engine.model_root()
    if root is None or not (Path(root) / "tokenizer_config.json").exists():
        return None
    try:
        local = await asyncio.to_thread(LocalRenderer, Path(root))
        mine = await local.render(PROBE_MESSAGES, PROBE_TOOLS, {})
    except Exception as exc:  # a missing dependency or an unusual tokenizer: the engine renders
        log.warning("local rendering unavailable (%r); using the engine's /tokenize", exc)
        return None
    theirs = await engine.tokenize_chat(PROBE_MESSAGES, PROBE_TOOLS, {})
    if mine != theirs:
        log.warning("local render differs from the engine's; using the engine's /tokenize")
        return None
    return local
