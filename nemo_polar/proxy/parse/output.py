"""The assistant turn the proxy produced, and the interface each API's stream emitter implements."""

from __future__ import annotations

import base64
import uuid
from dataclasses import dataclass, field
from typing import Protocol

from nemo_polar.proxy.conversation import Message, ToolCall


@dataclass
class Output:
    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str = "stop"  # stop | length | tool_calls
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def as_message(self) -> Message:
        return Message(
            role="assistant", content=self.content, reasoning=self.reasoning or None, tool_calls=self.tool_calls
        )


def new_id(prefix: str, n: int = 24) -> str:
    return f"{prefix}{uuid.uuid4().hex[:n]}"


# Reasoning artefacts are self-describing: the opaque blob is the exact sampled reasoning text, so the proxy
# restores it from the echo even without session state.
_REASONING_PREFIX = "polar1:"


def encode_reasoning(text: str) -> str:
    return _REASONING_PREFIX + base64.urlsafe_b64encode(text.encode()).decode()


def decode_reasoning(blob: str | None) -> str | None:
    if not blob or not blob.startswith(_REASONING_PREFIX):
        return None
    try:
        return base64.urlsafe_b64decode(blob[len(_REASONING_PREFIX) :].encode()).decode()
    except (ValueError, UnicodeDecodeError):
        return None


class StreamEmitter(Protocol):
    """Turns generation events into one API's SSE frames (each a complete ``event:``/``data:`` block)."""

    def start(self) -> list[str]: ...
    def reasoning(self, text: str) -> list[str]: ...
    def text(self, text: str) -> list[str]: ...
    def tool_call(self, call: ToolCall) -> list[str]: ...
    def finish(self, out: Output) -> list[str]: ...
    def error(self, message: str) -> list[str]: ...
    def keepalive(self) -> str: ...  # "" where the dialect's clients cannot take one
    def echo_ids(self) -> list[str]: ...
