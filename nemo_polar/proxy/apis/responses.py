"""OpenAI Responses: request parsing and response/SSE building.

Accepted and not honoured (documented in docs/proxy.md): hosted tools (``web_search``, ``file_search``,
``image_generation``, ``tool_search``, ...), custom-tool grammars, ``reasoning.effort``/``summary``,
``text.verbosity``/``format``, ``include``, ``store``, ``prompt_cache_key``, ``client_metadata``,
``previous_response_id`` (no server-side state: every harness resends full history), and input items the
engine cannot render (``web_search_call``, ``item_reference``, ``image_generation_call``, ...), which are
dropped and listed in ``Conversation.ignored``.
"""

from __future__ import annotations

import json
from typing import Any

from nemo_polar.proxy.apis.adapter import ApiAdapter
from nemo_polar.proxy.apis.common import Loose, now, sse, validate
from nemo_polar.proxy.conversation import (
    CUSTOM_INPUT_PARAM,
    Conversation,
    Message,
    Tool,
    ToolCall,
    custom_tool_parameters,
    parts_text,
)
from nemo_polar.proxy.errors import bad_request
from nemo_polar.proxy.parse.output import Output, StreamEmitter, decode_reasoning, encode_reasoning, new_id
from nemo_polar.proxy.sampling import SamplingParams

_ID_PREFIX = "resp_"
_ROLE = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
_ASSISTANT_ITEMS = {"reasoning", "function_call", "custom_tool_call"}
_OUTPUT_ITEMS = {"function_call_output": "function", "custom_tool_call_output": "custom"}


class ResponsesRequest(Loose):
    model: str
    input: str | list[Any]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    stream: bool | None = False
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None


def parse(body: Any) -> Conversation:
    req = validate(ResponsesRequest, body)
    items: list[Any] = (
        [{"type": "message", "role": "user", "content": req.input}] if isinstance(req.input, str) else req.input
    )
    if not items:
        raise bad_request("input must not be empty", param="input")
    messages: list[Message] = []
    if req.instructions:
        messages.append(Message(role="system", content=req.instructions))
    ignored: list[str] = []
    turn: Message | None = None  # the assistant turn being assembled from consecutive output items

    for i, item in enumerate(items):
        where = f"input.{i}"
        if not isinstance(item, dict):
            raise bad_request(f"{where} must be an object", param=where)
        kind = item.get("type", "message")
        if (kind == "message" and item.get("role") == "assistant") or kind in _ASSISTANT_ITEMS:
            if turn is None:
                turn = Message(role="assistant")
                messages.append(turn)
            _add_to_turn(turn, item, kind, where)
            continue
        turn = None
        if kind == "message":
            role = _ROLE.get(item.get("role", ""))
            if role is None:
                raise bad_request(f"{where}.role must be one of {sorted(_ROLE)}", param=f"{where}.role")
            messages.append(Message(role=role, content=_text(item.get("content"), where)))
        elif kind == "agent_message":  # Codex multi-agent: a task to a subagent, or a subagent's report back
            messages.append(Message(role="user", content=_agent_message_text(item.get("content"), where)))
        elif kind in _OUTPUT_ITEMS:
            output = item.get("output")
            messages.append(
                Message(role="tool", content=_text(output, where), tool_call_id=str(item.get("call_id") or ""))
            )
        else:
            ignored.append(f"input item type {kind!r}")
    if not messages:
        raise bad_request("input must contain at least one message the model can read", param="input")

    tools: list[Tool] = []
    for j, raw in enumerate(req.tools or []):
        tools.extend(_tools(raw, f"tools.{j}", ignored))
    return Conversation(
        model=req.model,
        messages=messages,
        tools=tools,
        tool_choice=_tool_choice(req.tool_choice),
        sampling=SamplingParams(temperature=req.temperature, top_p=req.top_p, max_tokens=req.max_output_tokens),
        stream=bool(req.stream),
        include_usage=True,
        ignored=ignored,
    )


def _text(content: Any, where: str) -> str:
    try:
        return parts_text(content, kinds=("input_text", "output_text", "text", "summary_text", "refusal"))
    except ValueError as exc:
        raise bad_request(f"{where}.content: {exc}", param=where) from None


def _agent_message_text(content: Any, where: str) -> str:
    """The header Codex writes (sender, recipient, "Payload:") followed by the payload. Codex puts the payload,
    which the model wrote as a tool argument, in an ``encrypted_content`` part; the proxy served that argument in
    plain text, so it comes back in plain text and is shown as written."""
    if not isinstance(content, list):
        return _text(content, where)
    texts = []
    for k, part in enumerate(content):
        if not isinstance(part, dict):
            raise bad_request(f"{where}.content.{k} must be an object", param=f"{where}.content.{k}")
        text = part.get("encrypted_content") if part.get("type") == "encrypted_content" else part.get("text")
        if isinstance(text, str):
            texts.append(text)
    return "".join(texts)


def _add_to_turn(turn: Message, item: dict[str, Any], kind: str, where: str) -> None:
    if item.get("id"):
        turn.echo_ids.append(str(item["id"]))
    if kind == "message":
        turn.content += _text(item.get("content"), where)
    elif kind == "reasoning":
        text = decode_reasoning(item.get("encrypted_content"))
        if text is None:
            text = "\n".join(s.get("text", "") for s in item.get("summary") or [] if isinstance(s, dict))
        turn.reasoning = (turn.reasoning or "") + text
    else:
        name, call_id = item.get("name"), item.get("call_id")
        if not isinstance(name, str) or not isinstance(call_id, str):
            raise bad_request(f"{where}: {kind} needs name and call_id", param=where)
        turn.echo_ids.append(call_id)
        if kind == "function_call":
            args = item.get("arguments")
            turn.tool_calls.append(ToolCall(id=call_id, name=name, arguments=args if isinstance(args, str) else "{}"))
        else:
            raw = item.get("input")
            arguments = json.dumps({CUSTOM_INPUT_PARAM: raw if isinstance(raw, str) else ""}, ensure_ascii=False)
            turn.tool_calls.append(ToolCall(id=call_id, name=name, arguments=arguments, kind="custom"))


def _tools(raw: Any, where: str, ignored: list[str], namespace: str | None = None) -> list[Tool]:
    if not isinstance(raw, dict):
        raise bad_request(f"{where} must be an object", param=where)
    kind = raw.get("type")
    if kind == "namespace":  # a group of tools: the model sees its members as plain functions, their calls name it
        group = raw.get("name")
        if not isinstance(group, str) or not group:
            raise bad_request(f"{where}.name is required", param=where)
        members = raw.get("tools") or []
        return [t for k, sub in enumerate(members) for t in _tools(sub, f"{where}.tools.{k}", ignored, group)]
    if kind not in ("function", "custom"):
        ignored.append(f"tool type {kind!r}")
        return []
    name = raw.get("name")
    if not isinstance(name, str):
        raise bad_request(f"{where}.name is required", param=where)
    if kind == "custom":
        params, tool_kind = custom_tool_parameters(), "custom"
    else:
        params, tool_kind = raw.get("parameters") or {"type": "object", "properties": {}}, "function"
    if not isinstance(params, dict):
        raise bad_request(f"{where}.parameters must be a JSON schema object", param=where)
    description = raw.get("description") or ""
    return [Tool(name=name, description=description, parameters=params, kind=tool_kind, namespace=namespace)]


def _tool_choice(choice: str | dict[str, Any] | None) -> str:
    if choice is None or (isinstance(choice, dict) and choice.get("type") not in ("function", "custom")):
        return "auto"
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise bad_request("tool_choice must be auto, none, required or a named tool", param="tool_choice")
        return choice
    name = choice.get("name")
    if not isinstance(name, str):
        raise bad_request("tool_choice.name is required", param="tool_choice")
    return name


def new_tool_call_id() -> str:
    return new_id("call_")


class ResponsesStream(StreamEmitter):
    """Builds the Responses event sequence and, at the end, the full ``response`` object."""

    def __init__(self, conv: Conversation, response_id: str, body: dict[str, Any]) -> None:
        self.conv = conv
        self.id = response_id
        self.body = body
        self.created = now()
        self.seq = 0
        self.items: list[dict[str, Any]] = []  # finished output items
        self.open: dict[str, Any] | None = None  # the item currently streaming
        self.open_text = ""
        self.ids: list[str] = []

    # -- framing ------------------------------------------------------------------------------------
    def _event(self, kind: str, **fields: Any) -> str:
        payload = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return sse(payload, event=kind)

    def response(self, status: str, out: Output | None = None) -> dict[str, Any]:
        body = self.body if isinstance(self.body, dict) else {}
        tools = [t for t in body.get("tools") or [] if isinstance(t, dict)]
        resp: dict[str, Any] = {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "model": self.conv.model,
            "output": list(self.items),
            "parallel_tool_calls": bool(body.get("parallel_tool_calls", True)),
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": tools,
            "temperature": body.get("temperature"),
            "top_p": body.get("top_p"),
            "max_output_tokens": body.get("max_output_tokens"),
            "instructions": body.get("instructions"),
            "metadata": body.get("metadata") or {},
            "error": None,
            "incomplete_details": None,
            "store": False,
            "text": body.get("text") or {"format": {"type": "text"}},
            "reasoning": body.get("reasoning"),
            "usage": None,
        }
        if out is not None:
            resp["usage"] = {
                "input_tokens": out.prompt_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": out.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": out.prompt_tokens + out.completion_tokens,
            }
            if out.finish_reason == "length":
                resp["incomplete_details"] = {"reason": "max_output_tokens"}
        return resp

    # -- items --------------------------------------------------------------------------------------
    def _close(self) -> list[str]:
        if self.open is None:
            return []
        item, idx, frames = self.open, len(self.items), []
        if item["type"] == "message":
            part = {"type": "output_text", "text": self.open_text, "annotations": [], "logprobs": []}
            frames.append(
                self._event(
                    "response.output_text.done",
                    item_id=item["id"],
                    output_index=idx,
                    content_index=0,
                    text=self.open_text,
                    logprobs=[],
                )
            )
            frames.append(
                self._event(
                    "response.content_part.done", item_id=item["id"], output_index=idx, content_index=0, part=part
                )
            )
            item = {**item, "status": "completed", "content": [part]}
        else:  # reasoning
            summary = {"type": "summary_text", "text": self.open_text}
            frames.append(
                self._event(
                    "response.reasoning_summary_text.done",
                    item_id=item["id"],
                    output_index=idx,
                    summary_index=0,
                    text=self.open_text,
                )
            )
            frames.append(
                self._event(
                    "response.reasoning_summary_part.done",
                    item_id=item["id"],
                    output_index=idx,
                    summary_index=0,
                    part=summary,
                )
            )
            item = {**item, "summary": [summary], "encrypted_content": encode_reasoning(self.open_text)}
            item.pop("status", None)
        frames.append(self._event("response.output_item.done", output_index=idx, item=item))
        self.items.append(item)
        self.open, self.open_text = None, ""
        return frames

    def _open(self, kind: str) -> list[str]:
        if self.open is not None and self.open["type"] == kind:
            return []
        frames = self._close()
        idx = len(self.items)
        if kind == "message":
            item = {
                "type": "message",
                "id": new_id("msg_"),
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            }
            frames.append(self._event("response.output_item.added", output_index=idx, item=item))
            frames.append(
                self._event(
                    "response.content_part.added",
                    item_id=item["id"],
                    output_index=idx,
                    content_index=0,
                    part={"type": "output_text", "text": "", "annotations": [], "logprobs": []},
                )
            )
        else:
            item = {"type": "reasoning", "id": new_id("rs_"), "summary": [], "status": "in_progress"}
            frames.append(self._event("response.output_item.added", output_index=idx, item=item))
            frames.append(
                self._event(
                    "response.reasoning_summary_part.added",
                    item_id=item["id"],
                    output_index=idx,
                    summary_index=0,
                    part={"type": "summary_text", "text": ""},
                )
            )
        self.ids.append(item["id"])
        self.open = item
        return frames

    # -- emitter interface --------------------------------------------------------------------------
    def start(self) -> list[str]:
        resp = self.response("in_progress")
        return [self._event("response.created", response=resp), self._event("response.in_progress", response=resp)]

    def _delta(self, kind: str, event: str, text: str, **fields: Any) -> list[str]:
        frames = self._open(kind)
        self.open_text += text
        assert self.open is not None
        frames.append(self._event(event, item_id=self.open["id"], output_index=len(self.items), delta=text, **fields))
        return frames

    def reasoning(self, text: str) -> list[str]:
        return self._delta("reasoning", "response.reasoning_summary_text.delta", text, summary_index=0)

    def text(self, text: str) -> list[str]:
        return self._delta("message", "response.output_text.delta", text, content_index=0, logprobs=[])

    def tool_call(self, call: ToolCall) -> list[str]:
        frames = self._close()
        idx = len(self.items)
        if call.kind == "custom":
            item_id = new_id("ctc_")
            raw = _custom_input(call.arguments)
            item = {"type": "custom_tool_call", "id": item_id, "call_id": call.id, "name": call.name, "input": ""}
            frames.append(self._event("response.output_item.added", output_index=idx, item=item))
            frames.append(
                self._event("response.custom_tool_call_input.delta", item_id=item_id, output_index=idx, delta=raw)
            )
            frames.append(
                self._event("response.custom_tool_call_input.done", item_id=item_id, output_index=idx, input=raw)
            )
            item = {**item, "input": raw, "status": "completed"}
        else:
            item_id = new_id("fc_")
            item = {
                "type": "function_call",
                "id": item_id,
                "call_id": call.id,
                "name": call.name,
                "arguments": "",
                "status": "in_progress",
            }
            tool = self.conv.tool(call.name)
            if tool is not None and tool.namespace:  # a client dispatches a namespaced tool by (namespace, name)
                item["namespace"] = tool.namespace
            frames.append(self._event("response.output_item.added", output_index=idx, item=item))
            frames.append(
                self._event(
                    "response.function_call_arguments.delta", item_id=item_id, output_index=idx, delta=call.arguments
                )
            )
            frames.append(
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item_id,
                    output_index=idx,
                    name=call.name,
                    arguments=call.arguments,
                )
            )
            item = {**item, "arguments": call.arguments, "status": "completed"}
        frames.append(self._event("response.output_item.done", output_index=idx, item=item))
        self.items.append(item)
        self.ids.append(item_id)
        return frames

    def finish(self, out: Output) -> list[str]:
        # A truncated generation still ends with `response.completed` (status "incomplete" inside): harnesses and
        # the SDK stream helpers treat `response.incomplete` as a failed turn, and training wants the turn kept.
        status = "incomplete" if out.finish_reason == "length" else "completed"
        return [*self._close(), self._event("response.completed", response=self.response(status, out))]

    def error(self, message: str) -> list[str]:
        resp = self.response("failed")
        resp["error"] = {"code": "server_error", "message": message}
        return [self._event("response.failed", response=resp)]

    def keepalive(self) -> str:
        return ": keep-alive\n\n"

    def echo_ids(self) -> list[str]:
        return list(self.ids)


def _custom_input(arguments: str) -> str:
    try:
        obj = json.loads(arguments)
    except json.JSONDecodeError:
        return arguments
    if isinstance(obj, dict) and isinstance(obj.get(CUSTOM_INPUT_PARAM), str):
        return obj[CUSTOM_INPUT_PARAM]
    return arguments


def stream(conv: Conversation, body: Any) -> ResponsesStream:
    return ResponsesStream(conv, new_id(_ID_PREFIX), body)


def build_response(conv: Conversation, out: Output, body: Any) -> tuple[dict[str, Any], list[str]]:
    """Non-streaming: run the same item builder and return the final response object and its echo ids (the output
    items' ids, which a harness echoes back)."""
    builder = stream(conv, body)
    if out.reasoning:
        builder.reasoning(out.reasoning)
    if out.content:
        builder.text(out.content)
    for call in out.tool_calls:
        builder.tool_call(call)
    builder._close()
    status = "incomplete" if out.finish_reason == "length" else "completed"
    return builder.response(status, out), builder.echo_ids()


ADAPTER = ApiAdapter(
    name="responses",
    history_field="input",
    parse=parse,
    build_response=build_response,
    stream=stream,
    new_tool_call_id=new_tool_call_id,
)
