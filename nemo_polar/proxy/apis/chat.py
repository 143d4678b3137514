"""OpenAI Chat Completions: request parsing and response/SSE building."""

from __future__ import annotations

from typing import Any

from nemo_polar.proxy.apis.adapter import ApiAdapter
from nemo_polar.proxy.apis.common import Loose, as_stop_list, now, sse, validate
from nemo_polar.proxy.conversation import Conversation, Message, Tool, ToolCall, parts_text
from nemo_polar.proxy.errors import bad_request
from nemo_polar.proxy.parse.output import Output, StreamEmitter, new_id
from nemo_polar.proxy.sampling import SamplingParams
from nemo_polar.proxy.store.memos import ParseMemos

_ID_PREFIX = "chatcmpl-"
# Fields read below; anything else a harness sends (store, metadata, parallel_tool_calls, user, ...) is
# accepted and not honoured, and listed in the record's request body as sent.
_ROLE = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


class ChatRequest(Loose):
    model: str
    messages: list[Any]  # each checked where it is parsed: validating every message here would copy them all
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    stream: bool | None = False
    stream_options: dict[str, Any] | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int | None = None


def parse(body: Any, memos: ParseMemos | None = None) -> Conversation:
    """The request as a conversation; with a session's ``memos``, only the messages and tools it adds are parsed."""
    req = validate(ChatRequest, body)
    if not req.messages:
        raise bad_request("messages must contain at least one message", param="messages")
    if req.n not in (None, 1):
        raise bad_request("only n=1 is supported", param="n")
    if memos is None:
        messages = [_message(raw, f"messages.{i}") for i, raw in enumerate(req.messages)]
        tools = [t for t in (_function_tool(raw, i) for i, raw in enumerate(req.tools or [])) if t is not None]
    else:
        messages = memos["chat.messages"].parse(req.messages, lambda raw, i: _message(raw, f"messages.{i}"))
        tools = memos["chat.tools"].parse(req.tools or [], _function_tool)
    return Conversation(
        model=req.model,
        messages=messages,
        tools=tools,
        tool_choice=_tool_choice(req.tool_choice),
        sampling=SamplingParams(
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            max_tokens=req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens,
            stop=as_stop_list(req.stop, "stop"),
            seed=req.seed,
        ),
        stream=bool(req.stream),
        include_usage=bool((req.stream_options or {}).get("include_usage")),
    )


def _message(raw: Any, where: str) -> Message:
    if not isinstance(raw, dict):
        raise bad_request(f"{where} must be an object", param=where)
    role = _ROLE.get(raw.get("role", ""))
    if role is None:
        raise bad_request(f"{where}.role must be one of {sorted(_ROLE)}", param=f"{where}.role")
    try:
        content = parts_text(raw.get("content"))
    except ValueError as exc:
        raise bad_request(f"{where}.content: {exc}", param=f"{where}.content") from None
    if role == "tool":
        return Message(role="tool", content=content, tool_call_id=str(raw.get("tool_call_id") or ""))
    if role != "assistant":
        return Message(role=role, content=content)
    calls = []
    for j, tc in enumerate(raw.get("tool_calls") or []):
        fn = tc.get("function") if isinstance(tc, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise bad_request(f"{where}.tool_calls.{j}.function.name is required", param=f"{where}.tool_calls")
        args = fn.get("arguments")
        calls.append(
            ToolCall(id=str(tc.get("id") or ""), name=fn["name"], arguments=args if isinstance(args, str) else "{}")
        )
    reasoning = raw.get("reasoning_content", raw.get("reasoning"))
    return Message(
        role="assistant",
        content=content,
        reasoning=reasoning if isinstance(reasoning, str) and reasoning else None,
        tool_calls=calls,
        echo_ids=[c.id for c in calls if c.id],
    )


def _function_tool(raw: dict[str, Any], i: int) -> Tool | None:
    return _tool(raw, f"tools.{i}") if raw.get("type", "function") == "function" else None


def _tool(raw: dict[str, Any], where: str) -> Tool:
    fn = raw.get("function")
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise bad_request(f"{where}.function.name is required", param=where)
    params = fn.get("parameters") or {"type": "object", "properties": {}}
    if not isinstance(params, dict):
        raise bad_request(f"{where}.function.parameters must be a JSON schema object", param=where)
    return Tool(name=fn["name"], description=fn.get("description") or "", parameters=params)


def _tool_choice(choice: str | dict[str, Any] | None) -> str:
    if choice is None:
        return "auto"
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise bad_request("tool_choice must be auto, none, required or a named function", param="tool_choice")
        return choice
    name = (choice.get("function") or {}).get("name")
    if not isinstance(name, str):
        raise bad_request("tool_choice.function.name is required", param="tool_choice")
    return name


def _usage(out: Output) -> dict[str, int]:
    return {
        "prompt_tokens": out.prompt_tokens,
        "completion_tokens": out.completion_tokens,
        "total_tokens": out.prompt_tokens + out.completion_tokens,
    }


def _tool_call_json(call: ToolCall) -> dict[str, Any]:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def new_tool_call_id() -> str:
    return new_id("call_")


def build_response(conv: Conversation, out: Output, body: Any) -> tuple[dict[str, Any], list[str]]:
    """The whole ``chat.completion``; it names nothing a harness echoes beyond its tool-call ids."""
    message: dict[str, Any] = {"role": "assistant", "content": out.content or None}
    if out.reasoning:
        message["reasoning_content"] = out.reasoning
    if out.tool_calls:
        message["tool_calls"] = [_tool_call_json(c) for c in out.tool_calls]
    payload = {
        "id": new_id(_ID_PREFIX),
        "object": "chat.completion",
        "created": now(),
        "model": conv.model,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": out.finish_reason}],
        "usage": _usage(out),
    }
    return payload, []


def stream(conv: Conversation, body: Any) -> ChatStream:
    return ChatStream(conv, new_id(_ID_PREFIX))


class ChatStream(StreamEmitter):
    def __init__(self, conv: Conversation, response_id: str) -> None:
        self.conv = conv
        self.id = response_id
        self.created = now()
        self.n_calls = 0

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> str:
        return sse(
            {
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.conv.model,
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
            }
        )

    def start(self) -> list[str]:
        return [self._chunk({"role": "assistant", "content": ""})]

    def reasoning(self, text: str) -> list[str]:
        return [self._chunk({"reasoning_content": text})]

    def text(self, text: str) -> list[str]:
        return [self._chunk({"content": text})]

    def tool_call(self, call: ToolCall) -> list[str]:
        index = self.n_calls
        self.n_calls += 1
        head = {"index": index, "id": call.id, "type": "function", "function": {"name": call.name, "arguments": ""}}
        return [
            self._chunk({"tool_calls": [head]}),
            self._chunk({"tool_calls": [{"index": index, "function": {"arguments": call.arguments}}]}),
        ]

    def finish(self, out: Output) -> list[str]:
        frames = [self._chunk({}, out.finish_reason)]
        if self.conv.include_usage:
            frames.append(
                sse(
                    {
                        "id": self.id,
                        "object": "chat.completion.chunk",
                        "created": self.created,
                        "model": self.conv.model,
                        "choices": [],
                        "usage": _usage(out),
                    }
                )
            )
        frames.append(sse("[DONE]"))
        return frames

    def error(self, message: str) -> list[str]:
        return [sse({"error": {"message": message, "type": "server_error", "param": None, "code": "engine_error"}})]

    def keepalive(self) -> str:
        return ": keep-alive\n\n"

    def echo_ids(self) -> list[str]:
        return []


ADAPTER = ApiAdapter(
    name="chat",
    history_field="messages",
    parse=parse,
    build_response=build_response,
    stream=stream,
    new_tool_call_id=new_tool_call_id,
    parse_reusing=parse,
)
