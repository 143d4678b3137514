"""Anthropic Messages: request parsing and response/SSE building.

Accepted and not honoured (documented in docs/proxy.md): ``thinking`` (the session's template kwargs decide
how the model reasons), ``context_management``, ``output_config``, ``cache_control``, ``metadata``,
``safeguards``, ``defer_loading``/``eager_input_streaming`` on tools, server tools without
``input_schema``, and image/document blocks. Claude Code's per-request ``x-anthropic-billing-header``
system block is dropped (vLLM's own Messages endpoint strips it too): it changes between requests and
would break prefix continuity.
"""

from __future__ import annotations

import json
from typing import Any

from nemo_polar.proxy.apis.adapter import ApiAdapter
from nemo_polar.proxy.apis.common import Loose, as_stop_list, sse, validate
from nemo_polar.proxy.conversation import Conversation, Message, Tool, ToolCall, parts_text
from nemo_polar.proxy.errors import bad_request
from nemo_polar.proxy.parse.output import Output, StreamEmitter, decode_reasoning, encode_reasoning, new_id
from nemo_polar.proxy.sampling import SamplingParams

_ID_PREFIX = "msg_"
BILLING_HEADER = "x-anthropic-billing-header:"
_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


class MessagesRequest(Loose):
    model: str
    messages: list[dict[str, Any]]
    max_tokens: int
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    stream: bool | None = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop_sequences: list[str] | None = None


class CountTokensRequest(Loose):
    model: str
    messages: list[dict[str, Any]]
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None


def _system_text(system: Any) -> str:
    if isinstance(system, list):
        system = [b for b in system if not (isinstance(b, dict) and str(b.get("text", "")).startswith(BILLING_HEADER))]
    return parts_text(system)


def parse(body: Any, *, count_only: bool = False) -> Conversation:
    req = validate(CountTokensRequest if count_only else MessagesRequest, body)
    if not req.messages:
        raise bad_request("messages: at least one message is required", param="messages")
    messages: list[Message] = []
    system = _system_text(req.system)
    if system:
        messages.append(Message(role="system", content=system))
    for i, raw in enumerate(req.messages):
        messages.extend(_messages(raw, f"messages.{i}"))
    tools = []
    for j, raw in enumerate(req.tools or []):
        if not isinstance(raw, dict):
            raise bad_request(f"tools.{j} must be an object", param=f"tools.{j}")
        if "input_schema" not in raw:
            continue  # a server tool (web search, code execution, ...): the engine cannot run it
        if not isinstance(raw.get("name"), str) or not isinstance(raw["input_schema"], dict):
            raise bad_request(f"tools.{j} needs a name and an input_schema object", param=f"tools.{j}")
        tools.append(Tool(name=raw["name"], description=raw.get("description") or "", parameters=raw["input_schema"]))
    if count_only:
        return Conversation(model=req.model, messages=messages, tools=tools)
    assert isinstance(req, MessagesRequest)
    return Conversation(
        model=req.model,
        messages=messages,
        tools=tools,
        tool_choice=_tool_choice(req.tool_choice),
        sampling=SamplingParams(
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            max_tokens=req.max_tokens,
            stop=as_stop_list(req.stop_sequences, "stop_sequences"),
        ),
        stream=bool(req.stream),
        include_usage=True,
    )


def _messages(raw: Any, where: str) -> list[Message]:
    if not isinstance(raw, dict):
        raise bad_request(f"{where} must be an object", param=where)
    role = raw.get("role")
    content = raw.get("content")
    if role not in ("user", "assistant", "system"):
        raise bad_request(f"{where}.role must be user, assistant or system", param=f"{where}.role")
    if isinstance(content, str) or content is None:
        return [Message(role=role, content=content or "")]
    if not isinstance(content, list):
        raise bad_request(f"{where}.content must be a string or a list of blocks", param=f"{where}.content")
    if role == "assistant":
        return [_assistant(content, where)]
    out: list[Message] = []
    texts: list[str] = []
    for k, block in enumerate(content):
        if not isinstance(block, dict):
            raise bad_request(f"{where}.content.{k} must be an object", param=where)
        if block.get("type") == "tool_result":
            result = parts_text(block.get("content"))
            if block.get("is_error"):
                result = f"[tool error] {result}"
            out.append(Message(role="tool", content=result, tool_call_id=str(block.get("tool_use_id") or "")))
        elif block.get("type") == "text":
            texts.append(str(block.get("text", "")))
    if texts or not out:
        out.append(Message(role=role, content="\n".join(texts)))
    return out


def _assistant(blocks: list[Any], where: str) -> Message:
    msg = Message(role="assistant")
    texts: list[str] = []
    for k, block in enumerate(blocks):
        if not isinstance(block, dict):
            raise bad_request(f"{where}.content.{k} must be an object", param=where)
        kind = block.get("type")
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "thinking":
            restored = decode_reasoning(block.get("signature"))
            msg.reasoning = (msg.reasoning or "") + (
                restored if restored is not None else str(block.get("thinking", ""))
            )
            if block.get("signature"):
                msg.echo_ids.append(str(block["signature"]))
        elif kind == "tool_use":
            if not isinstance(block.get("name"), str) or not isinstance(block.get("id"), str):
                raise bad_request(f"{where}.content.{k}: tool_use needs id and name", param=where)
            args = block.get("input") if isinstance(block.get("input"), dict) else {}
            msg.tool_calls.append(
                ToolCall(id=block["id"], name=block["name"], arguments=json.dumps(args, ensure_ascii=False))
            )
            msg.echo_ids.append(block["id"])
    msg.content = "\n".join(texts)
    return msg


def _tool_choice(choice: dict[str, Any] | None) -> str:
    if not choice:
        return "auto"
    kind = choice.get("type")
    if kind in ("auto", "none"):
        return kind
    if kind == "any":
        return "required"
    if kind == "tool" and isinstance(choice.get("name"), str):
        return choice["name"]
    raise bad_request("tool_choice.type must be auto, any, tool or none", param="tool_choice")


def new_tool_call_id() -> str:
    return new_id("toolu_")


def _usage(out: Output | None) -> dict[str, int]:
    return {
        "input_tokens": out.prompt_tokens if out else 0,
        "output_tokens": out.completion_tokens if out else 0,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


def build_response(conv: Conversation, out: Output, body: Any) -> tuple[dict[str, Any], list[str]]:
    """The whole ``message``; it names nothing a harness echoes beyond its tool-use ids."""
    content: list[dict[str, Any]] = []
    if out.reasoning:
        content.append({"type": "thinking", "thinking": out.reasoning, "signature": encode_reasoning(out.reasoning)})
    if out.content:
        content.append({"type": "text", "text": out.content})
    for call in out.tool_calls:
        content.append({"type": "tool_use", "id": call.id, "name": call.name, "input": _input(call)})
    payload = {
        "id": new_id(_ID_PREFIX),
        "type": "message",
        "role": "assistant",
        "model": conv.model,
        "content": content,
        "stop_reason": _STOP.get(out.finish_reason, "end_turn"),
        "stop_sequence": None,
        "usage": _usage(out),
    }
    return payload, []


def stream(conv: Conversation, body: Any) -> MessagesStream:
    return MessagesStream(conv, new_id(_ID_PREFIX))


def _input(call: ToolCall) -> dict[str, Any]:
    try:
        value = json.loads(call.arguments)
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


class MessagesStream(StreamEmitter):
    def __init__(self, conv: Conversation, message_id: str) -> None:
        self.conv = conv
        self.id = message_id
        self.index = -1
        self.open: str | None = None  # "thinking" | "text"
        self.thinking = ""

    def _close(self) -> list[str]:
        frames: list[str] = []
        if self.open == "thinking":
            sig = {"type": "signature_delta", "signature": encode_reasoning(self.thinking)}
            frames.append(
                sse({"type": "content_block_delta", "index": self.index, "delta": sig}, "content_block_delta")
            )
        if self.open is not None:
            frames.append(sse({"type": "content_block_stop", "index": self.index}, "content_block_stop"))
        self.open = None
        return frames

    def _open(self, kind: str, block: dict[str, Any]) -> list[str]:
        frames = self._close()
        self.index += 1
        self.open = kind
        frames.append(
            sse({"type": "content_block_start", "index": self.index, "content_block": block}, "content_block_start")
        )
        return frames

    def start(self) -> list[str]:
        message = {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.conv.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": _usage(None),
        }
        return [sse({"type": "message_start", "message": message}, "message_start")]

    def reasoning(self, text: str) -> list[str]:
        frames = (
            []
            if self.open == "thinking"
            else self._open("thinking", {"type": "thinking", "thinking": "", "signature": ""})
        )
        self.thinking += text
        delta = {"type": "thinking_delta", "thinking": text}
        return [
            *frames,
            sse({"type": "content_block_delta", "index": self.index, "delta": delta}, "content_block_delta"),
        ]

    def text(self, text: str) -> list[str]:
        frames = [] if self.open == "text" else self._open("text", {"type": "text", "text": ""})
        delta = {"type": "text_delta", "text": text}
        return [
            *frames,
            sse({"type": "content_block_delta", "index": self.index, "delta": delta}, "content_block_delta"),
        ]

    def tool_call(self, call: ToolCall) -> list[str]:
        frames = self._open("tool_use", {"type": "tool_use", "id": call.id, "name": call.name, "input": {}})
        delta = {"type": "input_json_delta", "partial_json": json.dumps(_input(call), ensure_ascii=False)}
        frames.append(sse({"type": "content_block_delta", "index": self.index, "delta": delta}, "content_block_delta"))
        return [*frames, *self._close()]

    def finish(self, out: Output) -> list[str]:
        frames = self._close()
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": _STOP.get(out.finish_reason, "end_turn"), "stop_sequence": None},
            "usage": _usage(out),
        }
        frames.append(sse(delta, "message_delta"))
        frames.append(sse({"type": "message_stop"}, "message_stop"))
        return frames

    def error(self, message: str) -> list[str]:
        return [sse({"type": "error", "error": {"type": "api_error", "message": message}}, "error")]

    def keepalive(self) -> str:
        return sse({"type": "ping"}, "ping")

    def echo_ids(self) -> list[str]:
        return []


def parse_count(body: Any) -> Conversation:
    """A ``/v1/messages/count_tokens`` body: no ``max_tokens``, nothing but what is rendered."""
    return parse(body, count_only=True)


ADAPTER = ApiAdapter(
    name="anthropic",
    history_field="messages",
    parse=parse,
    build_response=build_response,
    stream=stream,
    new_tool_call_id=new_tool_call_id,
    parse_count=parse_count,
)
