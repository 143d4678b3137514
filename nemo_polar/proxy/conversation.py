"""The provider-neutral conversation every API request is normalised into.

Normalisation makes echoes comparable: content part lists become strings, ``developer`` becomes
``system``, cache markers and ids vanish, and assistant turns that the proxy itself produced are replaced
by the exact output it recorded (see :mod:`nemo_polar.proxy.sessions`). Two requests whose histories are
the same conversation therefore normalise to equal message lists, which is what continuation detection
compares.
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal

from pydantic import BaseModel, Field

from nemo_polar.proxy import fastjson
from nemo_polar.proxy.sampling import SamplingParams


class ToolCall(BaseModel):
    id: str
    name: str
    arguments: str = "{}"  # JSON text of the arguments object
    kind: Literal["function", "custom"] = "function"


class Message(BaseModel):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    reasoning: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None
    # Ids the harness echoed for this assistant turn (tool-call ids, reasoning/message item ids, signatures).
    echo_ids: list[str] = Field(default_factory=list, exclude=True)
    source_call_id: str | None = Field(default=None, exclude=True)

    def to_template(self) -> dict[str, Any]:
        """The OpenAI-chat message dict the engine's chat template renders."""
        msg: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.role == "assistant":
            if self.reasoning:
                msg["reasoning_content"] = self.reasoning
                msg["reasoning"] = self.reasoning
            if self.tool_calls:
                msg["tool_calls"] = [
                    {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                    for c in self.tool_calls
                ]
        if self.role == "tool":
            msg["tool_call_id"] = self.tool_call_id or ""
        return msg


class Tool(BaseModel):
    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    kind: Literal["function", "custom"] = "function"
    namespace: str | None = Field(
        default=None, description="the Responses `namespace` group it was declared in; its calls name it"
    )

    def to_template(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def param_type(self, param: str) -> str | None:
        prop = (self.parameters.get("properties") or {}).get(param) or {}
        kind = prop.get("type")
        return kind if isinstance(kind, str) else None


# A custom (free-form) tool is offered to the model as a function with one string parameter.
CUSTOM_INPUT_PARAM = "input"


def custom_tool_parameters() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {CUSTOM_INPUT_PARAM: {"type": "string", "description": "the raw tool input"}},
        "required": [CUSTOM_INPUT_PARAM],
    }


class Conversation(BaseModel):
    model: str
    messages: list[Message]
    tools: list[Tool] = Field(default_factory=list)
    tool_choice: Literal["auto", "none", "required"] | str = "auto"  # a str other than those names a tool
    sampling: SamplingParams = Field(default_factory=SamplingParams, description="as the harness asked")
    stream: bool = False
    include_usage: bool = False
    ignored: list[str] = Field(default_factory=list, description="request fields the proxy did not honour")

    def tool(self, name: str) -> Tool | None:
        return next((t for t in self.tools if t.name == name), None)

    def param_type(self, function: str, param: str) -> str | None:
        tool = self.tool(function)
        return tool.param_type(param) if tool else None

    def template_messages(self) -> list[dict[str, Any]]:
        return [m.to_template() for m in self.messages]

    def template_tools(self) -> list[dict[str, Any]] | None:
        return [t.to_template() for t in self.tools] or None


def fingerprint(messages: list[Message], tools: list[Tool]) -> str:
    """Stable digest of a normalised history (ids the harness invents are excluded)."""
    payload = {
        "messages": [m.model_dump(mode="json") for m in messages],
        "tools": [t.model_dump(mode="json") for t in tools],
    }
    return hashlib.sha256(fastjson.dumps(payload, sort_keys=True)).hexdigest()


def parts_text(content: Any, *, kinds: tuple[str, ...] = ("text", "input_text", "output_text")) -> str:
    """Join the text of a content value that may be a string, ``None`` or a list of typed parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and (part.get("type") in kinds or "type" not in part):
                text = part.get("text")
                if isinstance(text, str):
                    texts.append(text)
        return "\n".join(texts)  # vLLM joins text parts the same way
    raise ValueError(f"content must be a string or a list of parts, got {type(content).__name__}")
