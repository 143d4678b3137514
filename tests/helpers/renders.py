"""Agent conversations that grow the way harnesses grow them, over each offline model's real tokenizer and
template: what the incremental render and the segmented template tests both drive."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest

from nemo_polar.paths import cache_dir
from nemo_polar.proxy.render.renderer import LocalRenderer, TokenCache

MODELS = ["tiny-qwen3", "smollm2-135m-instruct"]
NASTY = [
    "<|im_end|>",  # special-token text inside content
    "\u0338 after a boundary",  # combining long solidus: composes with '>' under NFC
    "\n\n\n  indented\n",
    "Ünïcödé — 日本語 🙂",
    " leading space",
    "<think>not a thought</think>",
    "",
]


def renderer(name: str) -> LocalRenderer:
    path = cache_dir() / "models" / name
    if not (path / "tokenizer_config.json").exists():
        pytest.fail(f"{path} missing: make models")
    return LocalRenderer(path)


def grow(rng: random.Random, messages: list[dict[str, Any]], turn: int) -> None:
    """One agent step: an assistant turn (text, reasoning or a tool call), then a tool result or a user message."""
    text = rng.choice(NASTY) + f" step {turn} " + "word " * rng.randrange(0, 40)
    kind = rng.randrange(3)
    if kind == 0:
        messages.append({"role": "assistant", "content": text})
        messages.append({"role": "user", "content": rng.choice(NASTY) + f" ok {turn}"})
    else:
        call = {"id": f"c{turn}", "type": "function", "function": {"name": "bash", "arguments": '{"command":"ls"}'}}
        reasoning = {"reasoning_content": f"think {turn} " + rng.choice(NASTY)} if kind == 2 else {}
        messages.append({"role": "assistant", "content": "", "tool_calls": [call], **reasoning})
        messages.append({"role": "tool", "tool_call_id": f"c{turn}", "content": text})


def sessions(count: int = 3) -> Iterator[tuple[int, random.Random, TokenCache, list[dict[str, Any]]]]:
    """Fresh agent sessions: (seed, its random source, its token cache, its opening messages)."""
    for seed in range(count):
        rng = random.Random(seed)
        opening = [{"role": "system", "content": "You are a coding agent."}]
        yield seed, rng, TokenCache(), [*opening, {"role": "user", "content": rng.choice(NASTY) + " fix the bug"}]
