"""vLLM's own output parsers, served over JSON lines: the per-family reasoning and tool-call parsers its chat
endpoint runs for ``--tool-call-parser`` / ``--reasoning-parser``, driven as that endpoint drives them
(vllm/entrypoints/openai/chat_completion/serving.py, vLLM 0.32: one parser per request built from the request's
tools and ``chat_template_kwargs``, ``adjust_request`` on a throwaway one, ``parse_delta`` per streamed delta with
the prompt's ids, ``parse`` on a whole output).

Runs inside the engine virtualenv (vLLM lives there), so this file imports nothing from ``nemo_polar``; the proxy
talks to it through :mod:`nemo_polar.proxy.parse.family_parser`. One JSON object per line each way; every reply echoes
``id`` and carries ``ok``:

- ``{"op": "open", "id", "model_dir", "tool_parser", "reasoning_parser", "harmony", "tools",
  "chat_template_kwargs", "prompt_token_ids"}`` -> ``{"sampling": {"skip_special_tokens"}}``: what the endpoint
  would ask of the engine for this request;
- ``{"op": "delta", "id", "text", "token_ids", "finished"}`` -> ``{"delta": {"reasoning", "content",
  "tool_calls": [{"index", "name", "arguments"}]} | null}``; a delta of several tokens is fed to the parser one
  token at a time (:func:`_per_token`);
- ``{"op": "parse", <open's fields>, "text", "token_ids"}`` -> ``{"reasoning", "content", "tool_calls"}``;
- ``{"op": "whole", "id", "text", "token_ids"}`` -> the same, for an opened sample that came back in one piece (a
  non-streamed request: the endpoint parses it whole, not as one delta, which some streaming parsers drop);
- ``{"op": "close", "id"}``.

Usage: python parser_worker.py
"""

from __future__ import annotations

import os
import sys

# The protocol owns a private copy of stdout; anything else that writes there (vLLM's logger, native code) goes to
# stderr instead, so a log line can never corrupt a reply.
_OUT = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)
sys.stdout = sys.stderr
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import json  # noqa: E402
import traceback  # noqa: E402
from typing import Any  # noqa: E402

from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest  # noqa: E402
from vllm.parser.harmony import HarmonyParser  # noqa: E402
from vllm.parser.parser_manager import ParserManager  # noqa: E402
from vllm.tokenizers import cached_get_tokenizer  # noqa: E402

_PARSERS: dict[tuple[Any, ...], Any] = {}
# id -> (parser, request, prompt ids, the open message, the sample's ids so far)
_OPEN: dict[str, tuple[Any, ChatCompletionRequest, list[int] | None, dict[str, Any], list[int]]] = {}
_WINDOW = 8  # ids of context decoded before a token, so that its text is what it adds (spaces, merges)


def _parser_class(msg: dict[str, Any], tokenizer: Any) -> Any:
    harmony = bool(msg.get("harmony"))
    key = (msg["model_dir"], msg.get("tool_parser"), msg.get("reasoning_parser"), harmony)
    if key not in _PARSERS:
        cls = ParserManager.get_parser(
            tool_parser_name=msg.get("tool_parser"),
            reasoning_parser_name=msg.get("reasoning_parser"),
            enable_auto_tools=True,
            model_name=msg["model_dir"],
            is_harmony=harmony,
            tokenizer=tokenizer,
        )
        if cls is not None and harmony:
            # get_parser sets its choice on the shared HarmonyParser class: pin it in a class of this key's own.
            pinned = {k: getattr(cls, k) for k in ("reasoning_parser_cls", "tool_parser_cls", "tool_strict_level")}
            cls = type("PinnedHarmonyParser", (cls,), pinned)
        _PARSERS[key] = cls
    return _PARSERS[key]


def _request(msg: dict[str, Any]) -> ChatCompletionRequest:
    body: dict[str, Any] = {"model": "polar", "messages": [{"role": "user", "content": ""}], "include_reasoning": True}
    if msg.get("tools"):
        body["tools"] = msg["tools"]
        body["tool_choice"] = "auto"
    if msg.get("chat_template_kwargs"):
        body["chat_template_kwargs"] = msg["chat_template_kwargs"]
    return ChatCompletionRequest(**body)


def _make(msg: dict[str, Any]) -> tuple[Any, ChatCompletionRequest]:
    tokenizer = cached_get_tokenizer(msg["model_dir"], runner_type="generate", tokenizer_mode="auto")
    cls = _parser_class(msg, tokenizer)
    request = _request(msg)
    if cls is None:
        return None, request
    kwargs = msg.get("chat_template_kwargs") or {}
    parser = cls(tokenizer, request.tools, chat_template_kwargs=kwargs, model_config=None)
    # The endpoint adjusts the request on a throwaway parser (vllm/renderers/online_renderer.py; harmony through
    # adjust_harmony_request, without the template kwargs): it may ask the engine to keep special tokens.
    if issubclass(cls, HarmonyParser):
        request = cls(tokenizer, request.tools, model_config=None).adjust_request(request=request)
    elif cls.always_adjust_request or cls.reasoning_parser_cls is not None or request.tool_choice != "none":
        throwaway = cls(tokenizer, request.tools, chat_template_kwargs=kwargs, model_config=None)
        request = throwaway.adjust_request(request=request)
    return parser, request


def _delta(dm: Any) -> dict[str, Any] | None:
    if dm is None:
        return None
    out: dict[str, Any] = {}
    if dm.reasoning:
        out["reasoning"] = dm.reasoning
    if dm.content:
        out["content"] = dm.content
    calls = []
    for tc in dm.tool_calls or []:
        fn = tc.function
        calls.append({"index": tc.index, "name": fn.name if fn else None, "arguments": fn.arguments if fn else None})
    if calls:
        out["tool_calls"] = calls
    return out or None


def _parse(msg: dict[str, Any], text: str, token_ids: list[int]) -> dict[str, Any]:
    parser, request = _make(msg)
    if parser is None:
        return {"reasoning": None, "content": text, "tool_calls": []}
    if msg.get("prompt_token_ids") is not None:
        parser.set_prompt_token_ids(msg["prompt_token_ids"])
    reasoning, content, calls = parser.parse(text, request, enable_auto_tools=True, model_output_token_ids=token_ids)
    tool_calls = [{"name": c.name, "arguments": c.arguments} for c in calls or []]
    return {"reasoning": reasoning, "content": content, "tool_calls": tool_calls}


def _per_token(tokenizer: Any, before: list[int], ids: list[int], text: str, skip: bool) -> list[tuple[str, list[int]]]:
    """A delta of several tokens as the one-token deltas it is made of. vLLM streams one token per engine step, and
    its streaming parsers are written for that; a consumer that falls behind (a loaded host) gets steps merged, and
    some parsers then lose what the merged delta holds (deepseek_v31 drops a whole call that arrives in one piece).
    Each token's text is what decoding it after its context adds; a character split across tokens stays with the
    token that completes it. Where the pieces do not join to exactly the engine's text, the delta is kept whole."""
    pieces: list[tuple[str, list[int]]] = []
    start, prev = 0, None
    for end in range(1, len(ids) + 1):
        context = (before + ids[:start])[-_WINDOW:]
        if prev is None:
            prev = tokenizer.decode(context, skip_special_tokens=skip)
        current = tokenizer.decode(context + ids[start:end], skip_special_tokens=skip)
        whole = current.startswith(prev) and not current.endswith("\ufffd")
        if not whole and end < len(ids):
            continue  # part of a character: taken with the next token
        if not current.startswith(prev):
            return [(text, ids)]
        pieces.append((current[len(prev) :], ids[start:end]))
        start, prev = end, None
    return pieces if "".join(piece for piece, _ in pieces) == text else [(text, ids)]


def _merged(deltas: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """One reply for the pieces of a delta: texts joined, tool-call pieces in order (the proxy joins them by index)."""
    out: dict[str, Any] = {}
    for delta in deltas:
        for key, value in (delta or {}).items():
            out[key] = out.get(key, [] if key == "tool_calls" else "") + value
    return out or None


def handle(msg: dict[str, Any]) -> dict[str, Any]:
    op, rid = msg.get("op"), msg.get("id")
    if op == "delta":
        parser, request, prompt_ids, opened, sampled = _OPEN[rid]
        text, ids, finished = msg.get("text", ""), list(msg.get("token_ids", [])), bool(msg.get("finished"))
        if parser is None:
            return {"delta": {"content": text} if text else None}
        pieces = [(text, ids)]
        if len(ids) > 1:
            tokenizer = cached_get_tokenizer(opened["model_dir"], runner_type="generate", tokenizer_mode="auto")
            pieces = _per_token(tokenizer, sampled, ids, text, bool(request.skip_special_tokens))
        sampled.extend(ids)
        deltas = [
            _delta(
                parser.parse_delta(
                    delta_text=piece,
                    delta_token_ids=piece_ids,
                    request=request,
                    prompt_token_ids=prompt_ids,
                    finished=finished and k == len(pieces) - 1,
                )
            )
            for k, (piece, piece_ids) in enumerate(pieces)
        ]
        return {"delta": _merged(deltas)}
    if op == "open":
        parser, request = _make(msg)
        _OPEN[rid] = (parser, request, msg.get("prompt_token_ids"), msg, [])
        return {"sampling": {"skip_special_tokens": request.skip_special_tokens}}
    if op == "close":
        _OPEN.pop(rid, None)
        return {}
    if op == "parse":
        return _parse(msg, msg.get("text", ""), msg.get("token_ids", []))
    if op == "whole":
        opened = _OPEN[rid][3]  # a parser of its own, as the endpoint builds one for a non-streamed request
        return _parse(opened, msg.get("text", ""), msg.get("token_ids", []))
    if op == "ping":
        return {}
    raise ValueError(f"unknown op {op!r}")


def main() -> int:
    _OUT.write(json.dumps({"ok": True, "op": "ready"}) + "\n")
    for line in sys.stdin:
        if not line.strip():
            continue
        rid = None
        try:
            msg = json.loads(line)
            rid = msg.get("id")
            reply = {"ok": True, "id": rid, **handle(msg)}
        except Exception as exc:  # one request's failure is its reply; the worker serves the next
            traceback.print_exc(file=sys.stderr)
            reply = {"ok": False, "id": rid, "error": f"{type(exc).__name__}: {exc}"}
        _OUT.write(json.dumps(reply, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
