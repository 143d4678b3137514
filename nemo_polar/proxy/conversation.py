"""The provider-neutral conversation every API request is normalised into.

Normalisation makes echoes comparable: content part lists become strings, ``developer`` becomes
``system``, cache markers and ids vanish, and assistant turns that the proxy itself produced are replaced
by the exact output it recorded (see :mod:`nemo_polar.proxy.sessions`). Two requests whose histories are
the same conversation therefore normalise to equal message lists, which is what continuation detection
compares.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Literal

from pydantic import BaseModel, Field

from nemo_polar.proxy import fastjson
from nemo_polar.proxy.sampling import SamplingParams


class ToolCall(BaseModel):
    id: str
    name: str
    arguments: str = "{}"  # JSON text of the arguments object
    kind: Literal["function", "custom"] = "function"
    # The id the model itself wrote for this call, where its format carries one (Mistral's); the harness sees ``id``.
    template_id: str | None = Field(default=None, exclude=True)


class Message(BaseModel):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    reasoning: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None
    # Ids the harness echoed for this assistant turn (tool-call ids, reasoning/message item ids, signatures).
    echo_ids: list[str] = Field(default_factory=list, exclude=True)
    source_call_id: str | None = Field(default=None, exclude=True)

    def recorded(self) -> dict[str, Any]:
        """The message as a call record keeps it: what the harness got, plus the ids the model itself wrote for its
        calls (``template_id``, never sent to the harness) so that a re-render from records uses them."""
        out = self.model_dump(mode="json", exclude_defaults=True)
        for call, dumped in zip(self.tool_calls, out.get("tool_calls", []), strict=True):
            if call.template_id is not None:
                dumped["template_id"] = call.template_id
        return out

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


class TemplateTraits(BaseModel):
    """What the model's chat template takes, probed once per engine (``probe_template``): tools at all, and where
    system messages may stand.

    CLIs send several: Codex its instructions and two developer messages up front, Claude Code a ``system``
    message after the first user turn. Many templates take one, first: Qwen3.5's raises "System message must be at
    the beginning.", gpt-oss's silently renders only the first. For those, and only those
    (refused or dropped, as probed), the leading run is joined into one system message (what Gym's
    ``replace_developer_role_with_system`` and most serving stacks do with developer messages) and a later system
    message becomes a user turn where it stands: its text reaches the model, and no earlier token of the
    conversation changes, so the render stays append-only (merging it into the top would rewrite the prefix).
    """

    merge_leading: bool = False  # the template refuses or drops a second system message before any other turn
    later_as_user: bool = False  # the template refuses or drops a system message after the first other turn
    renders_tools: bool = True  # False: the template renders a conversation the same with or without tools
    # The template refuses two user messages in a row (Mistral's strict alternation): they are joined, as
    # mistral-common joins them. Codex's leading system messages, merged, are followed by two user messages.
    join_users: bool = False
    # The template refuses call ids other than 9 letters and digits (Mistral's): see ``template_call_id``.
    call_ids: Literal["as_sent", "alnum9"] = "as_sent"

    def apply(
        self, messages: list[dict[str, Any]], sampled_ids: dict[str, str] | None = None
    ) -> tuple[list[dict[str, Any]], str | None]:
        """The messages as this template takes them, and what was done (None: nothing). ``sampled_ids`` maps the
        ids the harness saw to those the model wrote, for ``call_ids``."""
        lead = next((i for i, m in enumerate(messages) if m["role"] != "system"), len(messages))
        notes = []
        out = messages
        if self.merge_leading and lead > 1:
            joined = "\n\n".join(m["content"] for m in messages[:lead])
            out = [{"role": "system", "content": joined}, *messages[lead:]]
            notes.append(f"merged:{lead}")
            lead = 1
        if self.later_as_user:
            later = [i for i, m in enumerate(out) if i >= lead and m["role"] == "system"]
            if later:
                out = [{**m, "role": "user"} if i in later else m for i, m in enumerate(out)]
                notes.append("as_user:" + ",".join(str(i) for i in later))
        if self.join_users:
            joined_users: list[dict[str, Any]] = []
            for m in out:
                if joined_users and m["role"] == "user" == joined_users[-1]["role"]:
                    joined_users[-1] = {
                        **joined_users[-1],
                        "content": joined_users[-1]["content"] + "\n\n" + m["content"],
                    }
                else:
                    joined_users.append(m)
            if len(joined_users) < len(out):
                notes.append(f"users_joined:{len(out) - len(joined_users)}")
                out = joined_users
        if self.call_ids == "alnum9":
            out = [_with_template_ids(m, sampled_ids or {}) for m in out]
        return out, " ".join(notes) or None


_ALNUM9 = re.compile(r"[A-Za-z0-9]{9}")
_BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def template_call_id(harness_id: str, sampled_ids: dict[str, str]) -> str:
    """The 9-character id a Mistral-style template takes for a call the harness knows as ``harness_id``: the id the
    model wrote for it (so a tool result answers the call as the model sampled it), else the harness's own id where
    it already qualifies, else one derived from it (the same on every render, so renders stay append-only)."""
    if harness_id in sampled_ids:
        return sampled_ids[harness_id]
    if _ALNUM9.fullmatch(harness_id):
        return harness_id
    n = int.from_bytes(hashlib.sha256(harness_id.encode()).digest()[:8], "big")
    return "".join(_BASE62[(n // 62**k) % 62] for k in range(9))


def valid_template_id(ident: Any) -> bool:
    return isinstance(ident, str) and _ALNUM9.fullmatch(ident) is not None


def _with_template_ids(message: dict[str, Any], sampled_ids: dict[str, str]) -> dict[str, Any]:
    if message.get("tool_calls"):
        calls = [{**c, "id": template_call_id(c.get("id") or "", sampled_ids)} for c in message["tool_calls"]]
        return {**message, "tool_calls": calls}
    if message["role"] == "tool":
        return {**message, "tool_call_id": template_call_id(message.get("tool_call_id") or "", sampled_ids)}
    return message


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

    def template_messages(self, traits: TemplateTraits | None = None) -> list[dict[str, Any]]:
        return self.placed_messages(traits)[0]

    def placed_messages(self, traits: TemplateTraits | None) -> tuple[list[dict[str, Any]], str | None]:
        """The messages the chat template renders, with system messages placed where it takes them."""
        messages = [m.to_template() for m in self.messages]
        if traits is None:
            return messages, None
        sampled = {c.id: c.template_id for m in self.messages for c in m.tool_calls if c.template_id}
        return traits.apply(messages, sampled)

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
