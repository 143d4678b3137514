"""The provider-neutral conversation every API request is normalised into.

Normalisation makes echoes comparable: content part lists become strings, ``developer`` becomes
``system``, cache markers and ids vanish, and assistant turns that the proxy itself produced are replaced
by the exact output it recorded (see :mod:`nemo_polar.proxy.store.sessions`). Two requests whose histories are
the same conversation therefore normalise to equal message lists, which is what continuation detection
compares.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Literal

from pydantic import BaseModel, Field, PrivateAttr

from nemo_polar.engine.families import CallIdForm
from nemo_polar.proxy import fastjson
from nemo_polar.proxy.sampling import SamplingParams


class ToolCall(BaseModel):
    id: str
    name: str
    arguments: str = "{}"  # JSON text of the arguments object
    kind: Literal["function", "custom"] = "function"
    # The id the model itself wrote for this call, where its format carries one (Mistral's, Kimi's); the harness
    # sees ``id``.
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
    _digest: bytes | None = PrivateAttr(default=None)  # digest(): a message is not changed once parsed
    _template: dict[str, Any] | None = PrivateAttr(default=None)  # to_template(), made once

    def recorded(self) -> dict[str, Any]:
        """The message as a call record keeps it: what the harness got, plus the ids the model itself wrote for its
        calls (``template_id``, never sent to the harness) so that a re-render from records uses them."""
        out = self.model_dump(mode="json", exclude_defaults=True)
        for call, dumped in zip(self.tool_calls, out.get("tool_calls", []), strict=True):
            if call.template_id is not None:
                dumped["template_id"] = call.template_id
        return out

    def model_copy(self, *, update: dict[str, Any] | None = None, deep: bool = False) -> Message:
        """A copy; one with fields changed (``update``) keeps none of what was made from the original's."""
        copy = super().model_copy(update=update, deep=deep)
        if update:
            copy._digest = copy._template = None
        return copy

    def to_template(self) -> dict[str, Any]:
        """The OpenAI-chat message dict the engine's chat template renders: made once, the same dict on every call
        (a message is not changed once parsed), so that a session's next render knows it unchanged by identity. It
        must not be changed: copy it to change it."""
        private = self.__pydantic_private__
        if private is not None and (made := private.get("_template")) is not None:
            return made
        self._template = self._template_dict()
        return self._template

    def _template_dict(self) -> dict[str, Any]:
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
    _digest: bytes | None = PrivateAttr(default=None)  # digest(): a tool is not changed once parsed

    def model_copy(self, *, update: dict[str, Any] | None = None, deep: bool = False) -> Tool:
        """A copy; one with fields changed (``update``) keeps no digest of the original's."""
        copy = super().model_copy(update=update, deep=deep)
        if update:
            copy._digest = None
        return copy

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
    # The call ids the model's format takes (see ``template_call_id``): 9 letters and digits (Mistral's template
    # refuses others), or ``functions.NAME:INDEX`` (Kimi's parser drops a call without one).
    call_ids: CallIdForm = "as_sent"

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
        if self.call_ids != "as_sent":
            out = _with_template_ids(out, sampled_ids or {}, self.call_ids)
        return out, " ".join(notes) or None


_FORMS: dict[str, re.Pattern[str]] = {
    "alnum9": re.compile(r"[A-Za-z0-9]{9}"),
    "functions_index": re.compile(r"functions\.[^\s:]+:\d+"),
}
_BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def template_call_id(
    harness_id: str, sampled_ids: dict[str, str], form: CallIdForm = "alnum9", name: str = "", index: int = 0
) -> str:
    """The id a template of ``form`` takes for a call the harness knows as ``harness_id`` (the ``index``-th call of
    the conversation, to ``name``): the id the model wrote for it (so a tool result answers the call as the model
    sampled it), else the harness's own id where it already has the form, else one derived from it, the same on
    every render so that renders stay append-only (``alnum9``: 9 letters and digits from its digest;
    ``functions_index``: ``functions.NAME:INDEX``, as Kimi numbers a conversation's calls)."""
    if harness_id in sampled_ids:
        return sampled_ids[harness_id]
    if form == "as_sent" or _FORMS[form].fullmatch(harness_id):
        return harness_id
    if form == "functions_index":
        return f"functions.{name}:{index}"
    n = int.from_bytes(hashlib.sha256(harness_id.encode()).digest()[:8], "big")
    return "".join(_BASE62[(n // 62**k) % 62] for k in range(9))


def script_call_id(form: CallIdForm, name: str, index: int) -> str:
    """The id a scripted turn writes for its ``index``-th call: one every template of ``form`` takes."""
    return f"functions.{name}:{index}" if form == "functions_index" else f"call{index:05d}"


def valid_template_id(ident: Any) -> bool:
    """An id the model wrote in a form some template insists on (what a record keeps as ``template_id``)."""
    return isinstance(ident, str) and any(p.fullmatch(ident) for p in _FORMS.values())


def _with_template_ids(
    messages: list[dict[str, Any]], sampled_ids: dict[str, str], form: CallIdForm
) -> list[dict[str, Any]]:
    """Every call id as the template takes it; a tool result answers its call by the id the call was given."""
    given: dict[str, str] = {}
    out = []
    for message in messages:
        if message.get("tool_calls"):
            calls = []
            for call in message["tool_calls"]:
                harness_id, name = call.get("id") or "", (call.get("function") or {}).get("name") or "tool"
                given[harness_id] = template_call_id(harness_id, sampled_ids, form, name, len(given))
                calls.append({**call, "id": given[harness_id]})
            message = {**message, "tool_calls": calls}
        elif message["role"] == "tool":
            harness_id = message.get("tool_call_id") or ""
            mapped = given.get(harness_id) or template_call_id(harness_id, sampled_ids, form, "tool", len(given))
            message = {**message, "tool_call_id": mapped}
        out.append(message)
    return out


class Conversation(BaseModel):
    model: str
    messages: list[Message]
    tools: list[Tool] = Field(default_factory=list)
    tool_choice: Literal["auto", "none", "required"] | str = "auto"  # a str other than those names a tool
    sampling: SamplingParams = Field(default_factory=SamplingParams, description="as the harness asked")
    stream: bool = False
    include_usage: bool = False
    ignored: list[str] = Field(default_factory=list, description="request fields the proxy did not honour")
    _fingerprints: RunningFingerprints | None = PrivateAttr(default=None)
    _templates: list[dict[str, Any]] | None = PrivateAttr(default=None)

    def set_fingerprints(self, fingerprints: RunningFingerprints, templates: list[dict[str, Any]]) -> None:
        """Note the running fingerprints of ``messages`` as they now stand (made where they were last changed), and
        their ``Message.to_template`` dicts (likewise)."""
        self._fingerprints = fingerprints
        self._templates = templates

    def fingerprint(self, upto: int | None = None) -> str:
        """``fingerprint`` of the first ``upto`` messages (all: None) with the tools."""
        running = self._fingerprints
        if running is None or len(running.states) != len(self.messages) + 1:
            running = self._fingerprints = RunningFingerprints(self.messages)
        return running.of(len(self.messages) if upto is None else upto, self.tools)

    def tool(self, name: str) -> Tool | None:
        return next((t for t in self.tools if t.name == name), None)

    def param_type(self, function: str, param: str) -> str | None:
        tool = self.tool(function)
        return tool.param_type(param) if tool else None

    def template_messages(self, traits: TemplateTraits | None = None) -> list[dict[str, Any]]:
        return self.placed_messages(traits)[0]

    def placed_messages(self, traits: TemplateTraits | None) -> tuple[list[dict[str, Any]], str | None]:
        """The messages the chat template renders, with system messages placed where it takes them."""
        known = self._templates
        messages = list(known) if known is not None and len(known) == len(self.messages) else self.templates()
        if traits is None:
            return messages, None
        if traits.call_ids == "as_sent":  # no ids to map: the walk over every call is for templates that rename them
            return traits.apply(messages)
        sampled = {c.id: c.template_id for m in self.messages for c in m.tool_calls if c.template_id}
        return traits.apply(messages, sampled)

    def templates(self, start: int = 0) -> list[dict[str, Any]]:
        """``Message.to_template`` of each message from ``start``."""
        return list(map(Message.to_template, self.messages[start:]))

    def template_tools(self) -> list[dict[str, Any]] | None:
        return [t.to_template() for t in self.tools] or None


def digest(item: Message | Tool) -> bytes:
    """SHA-256 of a parsed message's or tool's JSON (sorted keys; the ids a harness invents are excluded), kept on it:
    messages and tools are not changed once parsed, and a session's next request reuses them (``PrefixMemo``)."""
    private = item.__pydantic_private__  # read as a dict: pydantic's attribute lookup costs ~1 us a message
    if private is None or private.get("_digest") is None:
        item._digest = hashlib.sha256(fastjson.dumps(item.model_dump(mode="json"), sort_keys=True)).digest()
        return item._digest
    return private["_digest"]


def fingerprint(messages: list[Message], tools: list[Tool]) -> str:
    """Stable digest of a normalised history: of its messages' and tools' digests, each computed once."""
    return _with_tools(hashlib.sha256(b"".join(map(digest, messages))), tools)


def _with_tools(running: Any, tools: list[Tool]) -> str:
    """``fingerprint`` from the running digest of its messages' digests."""
    running.update(b"".join([b"|", *map(digest, tools)]))
    return str(running.hexdigest())


class RunningFingerprints:
    """``fingerprint`` of each leading part of one history, from the running digest after each of its messages:
    ``of(k, tools)`` is ``fingerprint(messages[:k], tools)``. Made from an earlier history's where the two start with
    the same messages (``reuse``), digesting only the messages after those."""

    def __init__(self, messages: list[Message], reuse: RunningFingerprints | None = None, shared: int = 0) -> None:
        self.states = reuse.states[: shared + 1] if reuse is not None else [hashlib.sha256()]
        for message in messages[len(self.states) - 1 :]:
            running = self.states[-1].copy()
            running.update(digest(message))
            self.states.append(running)

    def of(self, k: int, tools: list[Tool]) -> str:
        return _with_tools(self.states[k].copy(), tools)


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
