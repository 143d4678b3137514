"""Google's Gemini API (``generateContent``, ``streamGenerateContent?alt=sse``, ``countTokens``): request parsing and
response/SSE building, as Gemini CLI (``@google/genai``) speaks it.

The model is named in the URL path, not the body: the route stores it in the recorded body as the request's
``model`` field (``models/{model}``, the REST resource's own field), so a record parses alone. Any model name is
served by the policy model; a harness's side calls name built-in models (Gemini CLI's router, compression).

Reasoning is returned as ``thought`` parts; its ``thoughtSignature`` rides on the part that follows (the text or
the function call), as Gemini sends it. Gemini CLI echoes the signature and drops the thought text, so the signature
carries the sampled reasoning itself (``encode_reasoning``, in base64: the API's signatures are bytes), and the proxy
restores the exact sampled turn from it.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from pydantic import Field

from nemo_polar.proxy.apis.adapter import ApiAdapter
from nemo_polar.proxy.apis.common import Loose, as_stop_list, sse, validate
from nemo_polar.proxy.conversation import Conversation, Message, Tool, ToolCall
from nemo_polar.proxy.errors import bad_request
from nemo_polar.proxy.parse.output import Output, StreamEmitter, decode_reasoning, encode_reasoning, new_id
from nemo_polar.proxy.sampling import SamplingParams

_FINISH = {"stop": "STOP", "tool_calls": "STOP", "length": "MAX_TOKENS"}
# Gemini CLI's stand-in when the server sent no signature: it names no turn.
_NO_SIGNATURE = "skip_thought_signature_validator"
# generationConfig fields read below; others (thinkingConfig, responseMimeType, ...) are listed as not honoured.
_HONOURED = {"temperature", "topP", "topK", "maxOutputTokens", "stopSequences", "seed", "candidateCount"}


class GenerateContentRequest(Loose):
    model: str = ""
    contents: list[dict[str, Any]] = Field(default_factory=list)
    systemInstruction: dict[str, Any] | str | None = None  # the API's own (camel-case) field names
    tools: list[dict[str, Any]] | None = None
    toolConfig: dict[str, Any] | None = None
    generationConfig: dict[str, Any] | None = None


def signature(reasoning: str) -> str:
    return base64.b64encode(encode_reasoning(reasoning).encode()).decode()


def _signed_reasoning(value: str) -> str | None:
    try:
        return decode_reasoning(base64.b64decode(value, validate=True).decode())
    except (binascii.Error, UnicodeDecodeError):
        return None


def model_field(path_model: str) -> str:
    """The ``model`` field of a request whose path named ``path_model``."""
    return path_model if path_model.startswith("models/") else f"models/{path_model}"


def _fields(obj: Any) -> Any:
    """A message object with its field names in lowerCamelCase. Google's JSON parsers take a field by its proto name
    (``parameters_json_schema``) as well as by its JSON name (``parametersJsonSchema``), and Google's Python SDK
    sends some of each. Only message fields are renamed, one level at a time: property names in schemas and the keys
    of a call's ``args`` or a function's ``response`` are the user's."""
    if not isinstance(obj, dict):
        return obj
    return {_camel(k): v for k, v in obj.items()}


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(w[:1].upper() + w[1:] for w in rest)


def parse(body: Any, *, count_only: bool = False) -> Conversation:
    body = _fields(body)
    if isinstance(body, dict) and isinstance(body.get("generateContentRequest"), dict):  # countTokens' other form
        body = {"model": body.get("model", ""), **_fields(body["generateContentRequest"])}
    req = validate(GenerateContentRequest, body)
    if not req.contents and not count_only:
        raise bad_request("contents must not be empty", param="contents")
    messages: list[Message] = []
    if req.systemInstruction is not None:
        system = req.systemInstruction
        text = system if isinstance(system, str) else _texts(_fields(system))
        messages.append(Message(role="system", content=text))
    for i, content in enumerate(req.contents):
        messages += _content(content, f"contents.{i}")
    config = _fields(req.generationConfig or {})
    if config.get("candidateCount") not in (None, 1):
        raise bad_request("only candidateCount=1 is supported", param="generationConfig.candidateCount")
    tools, ignored = _tools(req.tools or [])
    ignored += [f"generationConfig.{k}" for k in config if k not in _HONOURED]
    return Conversation(
        model=req.model.removeprefix("models/"),
        messages=messages,
        tools=tools,
        tool_choice=_tool_choice(req.toolConfig),
        sampling=SamplingParams(
            temperature=config.get("temperature"),
            top_p=config.get("topP"),
            top_k=config.get("topK"),
            max_tokens=config.get("maxOutputTokens"),
            stop=as_stop_list(config.get("stopSequences"), "generationConfig.stopSequences"),
            seed=config.get("seed"),
        ),
        ignored=ignored,
    )


def _texts(content: dict[str, Any]) -> str:
    parts = content.get("parts")
    if not isinstance(parts, list):
        raise bad_request("systemInstruction.parts must be a list", param="systemInstruction")
    return "\n".join(str(p.get("text", "")) for p in parts if isinstance(p, dict) and "text" in p)


def _content(content: Any, where: str) -> list[Message]:
    if not isinstance(content, dict):
        raise bad_request(f"{where} must be an object", param=where)
    role = content.get("role", "user")
    parts = content.get("parts")
    if role not in ("user", "model", "function") or not isinstance(parts, list):  # "function": an older API's
        raise bad_request(f"{where}: role must be user or model, and parts a list", param=where)
    for k, part in enumerate(parts):
        if not isinstance(part, dict):
            raise bad_request(f"{where}.parts.{k} must be an object", param=f"{where}.parts")
    parts = [_fields(p) for p in parts]
    return [_model_turn(parts, where)] if role == "model" else _user_turn(parts, where)


def _user_turn(parts: list[dict[str, Any]], where: str) -> list[Message]:
    """Function responses become tool messages, in order; the turn's text a user message after them."""
    out: list[Message] = []
    texts: list[str] = []
    for k, part in enumerate(parts):
        if "functionResponse" in part:
            response = _fields(part["functionResponse"])
            if not isinstance(response, dict) or not isinstance(response.get("name"), str):
                raise bad_request(f"{where}.parts.{k}.functionResponse needs a name", param=f"{where}.parts")
            ident = response.get("id") or response["name"]
            out.append(Message(role="tool", content=_result_text(response.get("response")), tool_call_id=ident))
        elif "text" in part:
            texts.append(str(part["text"]))
    if texts or not out:
        out.append(Message(role="user", content="\n".join(texts)))
    return out


def _result_text(response: Any) -> str:
    """A function's response object as the tool message's text: its one ``output`` string as it is (Gemini CLI's
    shell results), anything else as compact JSON."""
    if isinstance(response, dict) and list(response) == ["output"] and isinstance(response["output"], str):
        return response["output"]
    return json.dumps(response, ensure_ascii=False, separators=(",", ":"))


def _model_turn(parts: list[dict[str, Any]], where: str) -> Message:
    msg = Message(role="assistant")
    texts: list[str] = []
    for k, part in enumerate(parts):
        signed = part.get("thoughtSignature")
        if isinstance(signed, str) and signed and signed != _NO_SIGNATURE:
            restored = _signed_reasoning(signed)  # the sampled reasoning, which the harness dropped
            if restored is not None and not msg.reasoning:
                msg.reasoning = restored
            msg.echo_ids.append(signed)
        if "functionCall" in part:
            call = _fields(part["functionCall"])
            if not isinstance(call, dict) or not isinstance(call.get("name"), str):
                raise bad_request(f"{where}.parts.{k}.functionCall needs a name", param=f"{where}.parts")
            args = call.get("args") if isinstance(call.get("args"), dict) else {}
            ident = str(call.get("id") or "")
            msg.tool_calls.append(ToolCall(id=ident, name=call["name"], arguments=json.dumps(args, ensure_ascii=False)))
            if ident:
                msg.echo_ids.append(ident)
        elif part.get("thought") is True:
            if not msg.echo_ids:  # thought text only where no signature restored the exact reasoning
                msg.reasoning = (msg.reasoning or "") + str(part.get("text", ""))
        elif "text" in part:
            texts.append(str(part["text"]))
    msg.content = "".join(texts)
    return msg


def _schema(node: Any) -> Any:
    """An OpenAPI-subset schema (``parameters``: upper-case type names, ``nullable``) as JSON Schema."""
    if isinstance(node, list):
        return [_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _schema(v) for k, v in node.items() if k != "nullable"}
    if isinstance(out.get("type"), str):
        out["type"] = out["type"].lower()
        if node.get("nullable") is True:
            out["type"] = [out["type"], "null"]
    return out


def _tools(raw: list[Any]) -> tuple[list[Tool], list[str]]:
    tools: list[Tool] = []
    ignored: list[str] = []
    for i, entry in enumerate(raw):
        if not isinstance(entry, dict):
            raise bad_request(f"tools.{i} must be an object", param="tools")
        entry = _fields(entry)
        for kind in entry:
            if kind != "functionDeclarations":
                ignored.append(f"tools.{i}.{kind}")  # Google's own tools (search, code execution): not served
        for j, fn in enumerate(entry.get("functionDeclarations") or []):
            where = f"tools.{i}.functionDeclarations.{j}"
            fn = _fields(fn)
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise bad_request(f"{where}.name is required", param=where)
            params = fn.get("parametersJsonSchema")
            if params is None:
                params = _schema(fn.get("parameters")) or {"type": "object", "properties": {}}
            if not isinstance(params, dict):
                raise bad_request(f"{where}: parameters must be a schema object", param=where)
            tools.append(Tool(name=fn["name"], description=fn.get("description") or "", parameters=params))
    return tools, ignored


def _tool_choice(config: dict[str, Any] | None) -> str:
    calling = _fields(_fields(config or {}).get("functionCallingConfig") or {})
    mode = str(calling.get("mode") or "AUTO").upper()
    allowed = calling.get("allowedFunctionNames") or []
    if mode in ("AUTO", "MODE_UNSPECIFIED", "VALIDATED"):
        return "auto"
    if mode == "NONE":
        return "none"
    if mode == "ANY":
        return allowed[0] if len(allowed) == 1 and isinstance(allowed[0], str) else "required"
    raise bad_request("toolConfig.functionCallingConfig.mode must be AUTO, ANY, NONE or VALIDATED", param="toolConfig")


def new_tool_call_id() -> str:
    return new_id("fc_")


def _call_part(call: ToolCall) -> dict[str, Any]:
    try:
        args = json.loads(call.arguments)
    except json.JSONDecodeError:
        args = {}
    return {"functionCall": {"id": call.id, "name": call.name, "args": args if isinstance(args, dict) else {}}}


def _usage(out: Output) -> dict[str, int]:
    return {
        "promptTokenCount": out.prompt_tokens,
        "candidatesTokenCount": out.completion_tokens,
        "totalTokenCount": out.prompt_tokens + out.completion_tokens,
    }


def _response(conv: Conversation, response_id: str, parts: list[dict[str, Any]], out: Output | None) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    payload: dict[str, Any] = {"candidates": [candidate]}
    if out is not None:
        candidate["finishReason"] = _FINISH.get(out.finish_reason, "STOP")
        payload["usageMetadata"] = _usage(out)
    payload["modelVersion"] = conv.model
    payload["responseId"] = response_id
    return payload


def _signed(parts: list[dict[str, Any]], reasoning: str) -> list[dict[str, Any]]:
    """``parts`` with the reasoning's signature on the first one that is not a thought."""
    for i, part in enumerate(parts):
        if not part.get("thought"):
            return [*parts[:i], {**part, "thoughtSignature": signature(reasoning)}, *parts[i + 1 :]]
    return parts


def build_response(conv: Conversation, out: Output, body: Any) -> tuple[dict[str, Any], list[str]]:
    """The whole ``GenerateContentResponse``; the signature it carries names this turn when echoed."""
    parts: list[dict[str, Any]] = []
    if out.reasoning:
        parts.append({"text": out.reasoning, "thought": True})
    if out.content:
        parts.append({"text": out.content})
    parts += [_call_part(c) for c in out.tool_calls]
    if out.reasoning:
        parts = _signed(parts, out.reasoning)
    echo = [signature(out.reasoning)] if out.reasoning else []
    return _response(conv, new_id(""), parts, out), echo


def stream(conv: Conversation, body: Any) -> GeminiStream:
    return GeminiStream(conv, new_id(""))


class GeminiStream(StreamEmitter):
    """Each frame a whole ``GenerateContentResponse`` with one new part; no ``[DONE]``: the stream ends with the body.
    A part is held until the next one arrives, so the last frame carries a part with ``finishReason`` and the usage
    (Gemini CLI reads a frame with no parts as empty)."""

    def __init__(self, conv: Conversation, response_id: str) -> None:
        self.conv = conv
        self.id = response_id
        self.thinking = ""
        self.signed = False
        self.held: dict[str, Any] | None = None

    def _next(self, part: dict[str, Any]) -> list[str]:
        frames = [sse(_response(self.conv, self.id, [self.held], None))] if self.held is not None else []
        self.held = part
        return frames

    def _part(self, part: dict[str, Any]) -> list[str]:
        if self.thinking and not self.signed:  # the signature rides on the first part after the thoughts
            part = {**part, "thoughtSignature": signature(self.thinking)}
            self.signed = True
        return self._next(part)

    def start(self) -> list[str]:
        return []

    def reasoning(self, text: str) -> list[str]:
        self.thinking += text
        return self._next({"text": text, "thought": True})

    def text(self, text: str) -> list[str]:
        return self._part({"text": text})

    def tool_call(self, call: ToolCall) -> list[str]:
        return self._part(_call_part(call))

    def finish(self, out: Output) -> list[str]:
        parts = [self.held] if self.held is not None else []
        self.held = None
        return [sse(_response(self.conv, self.id, parts, out))]

    def error(self, message: str) -> list[str]:
        return [sse({"error": {"code": 500, "message": message, "status": "INTERNAL"}})]

    def keepalive(self) -> str:
        # Nothing: Google's API sends no keep-alive, and the genai SDK's stream parser (responseLineRE, one
        # `data: ` line per frame from the start of its buffer) never consumes an SSE comment, so one left in the
        # buffer fails the whole stream at its end ("Incomplete JSON segment at the end") and Gemini CLI resends it.
        return ""

    def echo_ids(self) -> list[str]:
        return [signature(self.thinking)] if self.thinking else []


def parse_count(body: Any) -> Conversation:
    """A ``:countTokens`` body: ``contents`` (and tools, system instruction) or a whole ``generateContentRequest``."""
    return parse(body, count_only=True)


ADAPTER = ApiAdapter(
    name="gemini",
    history_field="contents",
    parse=parse,
    build_response=build_response,
    stream=stream,
    new_tool_call_id=new_tool_call_id,
    parse_count=parse_count,
    count_response=lambda n: {"totalTokens": n},
    model_field=model_field,
)
