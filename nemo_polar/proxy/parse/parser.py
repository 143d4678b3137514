"""Incremental parser for sampled text: ``<think>`` reasoning, hermes and qwen3_coder tool calls.

The engine streams detokenised text; the parser turns it into provider-neutral events as early as it can:
text and reasoning are released as soon as they cannot be the start of a tag, and a tool call is released
once its closing ``</tool_call>`` has been sampled. Only what could still be a tag is held back.

Formats understood inside ``<tool_call>…</tool_call>``:
- hermes: ``{"name": "f", "arguments": {...}}`` (JSON);
- qwen3_coder: ``<function=f><parameter=p>value</parameter>…</function>`` (values typed by the tool schema).
A block that parses as neither is released verbatim as text, so a malformed call stays visible.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nemo_polar.engine.families import THINK_CLOSE, THINK_OPEN

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"


@dataclass
class ParsedToolCall:
    name: str
    arguments: str  # JSON text of the arguments object, exactly as sampled when the model wrote JSON
    raw: str  # the full block as sampled, tags included


@dataclass
class ParseEvent:
    kind: str  # "reasoning" | "text" | "tool_call"
    text: str = ""
    call: ParsedToolCall | None = None


def _partial_suffix(buf: str, tag: str) -> int:
    """Length of the longest suffix of ``buf`` that is a proper prefix of ``tag``."""
    for n in range(min(len(buf), len(tag) - 1), 0, -1):
        if tag.startswith(buf[-n:]):
            return n
    return 0


_FUNC_RE = re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.S)
_PARAM_RE = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.S)


def parse_tool_block(body: str, param_types: Callable[[str, str], str | None]) -> ParsedToolCall | None:
    """Parse the inside of one ``<tool_call>`` block; ``None`` when it is neither hermes nor qwen3_coder."""
    stripped = body.strip()
    raw = f"{CALL_OPEN}{body}{CALL_CLOSE}"
    if stripped.startswith("{"):
        try:
            obj = json.loads(stripped)
        except json.JSONDecodeError:
            return None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return None
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                return None
        if not isinstance(args, dict):
            return None
        return ParsedToolCall(name=obj["name"], arguments=_arguments_text(stripped, args), raw=raw)
    match = _FUNC_RE.search(stripped)
    if match is None:
        return None
    name = match.group(1).strip()
    args: dict[str, Any] = {}
    for pname, pvalue in _PARAM_RE.findall(match.group(2)):
        pname = pname.strip()
        args[pname] = _typed(pvalue, param_types(name, pname))
    return ParsedToolCall(name=name, arguments=json.dumps(args, ensure_ascii=False), raw=raw)


def _arguments_text(block: str, args: dict[str, Any]) -> str:
    """The arguments object as the model wrote it, when it can be cut out of the block unchanged."""
    key = block.find('"arguments"')
    if key >= 0:
        start = block.find("{", key)
        if start >= 0:
            try:
                _, end = json.JSONDecoder().raw_decode(block, start)
                return block[start:end]
            except json.JSONDecodeError:
                pass
    return json.dumps(args, ensure_ascii=False)


def _typed(value: str, schema_type: str | None) -> Any:
    if schema_type in (None, "string"):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


@dataclass
class StreamParser:
    """Feed text deltas with :meth:`feed`; call :meth:`finish` once at the end of the generation."""

    param_types: Callable[[str, str], str | None] = lambda _f, _p: None
    # The prompt itself opened a reasoning block (Qwen3.5's generation prompt ends with "<think>\n"): the sampled
    # text starts inside it, and the first "</think>" closes it.
    reasoning_open: bool = False
    _buf: str = ""
    _state: str = "start"  # start | reasoning | text | call
    _pending_ws: str = ""  # whitespace held back in text: dropped before a tool call, kept otherwise
    _after_reasoning: bool = False
    _reasoning_started: bool = False
    _call_ws: str = ""  # whitespace dropped before the current call, restored if the call turns out malformed

    def __post_init__(self) -> None:
        if self.reasoning_open:
            self._state = "reasoning"

    def feed(self, delta: str) -> list[ParseEvent]:
        self._buf += delta
        out: list[ParseEvent] = []
        while self._step(out, final=False):
            pass
        return out

    def finish(self) -> list[ParseEvent]:
        out: list[ParseEvent] = []
        while self._step(out, final=True):
            pass
        if self._state == "call":  # never closed (e.g. length-truncated): keep it visible as text
            self._text(out, self._call_ws + CALL_OPEN + self._buf)
        elif self._state == "reasoning":
            if self._buf:
                out.append(ParseEvent("reasoning", self._buf))
        elif self._buf:
            self._text(out, self._buf)
        self._buf = ""
        if self._pending_ws and not self._after_reasoning:
            out.append(ParseEvent("text", self._pending_ws))
        self._pending_ws = ""
        return out

    def _text(self, out: list[ParseEvent], text: str) -> None:
        if self._after_reasoning:  # the template's "</think>\n\n" glue is not content
            text = text.lstrip()
            if not text:
                return
            self._after_reasoning = False
        body = text.rstrip()
        if body:
            out.append(ParseEvent("text", self._pending_ws + body))
            self._pending_ws = ""
        self._pending_ws += text[len(body) :]

    def _step(self, out: list[ParseEvent], final: bool) -> bool:
        buf = self._buf
        if self._state == "start":
            # Reasoning is recognised only at the very start (where templates and models put it), so nothing
            # but a literal "<"-prefix is ever held back here.
            if buf.startswith(THINK_OPEN):
                self._buf = buf[len(THINK_OPEN) :]
                self._state = "reasoning"
                return True
            if not final and THINK_OPEN.startswith(buf):
                return False  # could still become "<think>"
            self._state = "text"
            return True
        if self._state == "reasoning":
            if not self._reasoning_started:  # the newline after <think> is template glue
                if not buf.lstrip("\n") and not final:
                    return False
                buf = self._buf = buf.lstrip("\n")
                self._reasoning_started = True
            idx = buf.find(THINK_CLOSE)
            if idx >= 0:
                if buf[:idx].rstrip("\n"):
                    out.append(ParseEvent("reasoning", buf[:idx].rstrip("\n")))
                self._buf = buf[idx + len(THINK_CLOSE) :]
                self._state = "text"
                self._after_reasoning = True
                return True
            keep = 0
            if not final:  # hold a possible "</think>" start and the newlines right before it (template glue)
                keep = _partial_suffix(buf, THINK_CLOSE)
                keep += len(buf[: len(buf) - keep]) - len(buf[: len(buf) - keep].rstrip("\n"))
            if len(buf) > keep:
                out.append(ParseEvent("reasoning", buf[: len(buf) - keep]))
                self._buf = buf[len(buf) - keep :]
            return False
        if self._state == "text":
            idx = buf.find(CALL_OPEN)
            if idx >= 0:
                self._text(out, buf[:idx])
                self._call_ws, self._pending_ws = self._pending_ws, ""
                self._after_reasoning = False
                self._buf = buf[idx + len(CALL_OPEN) :]
                self._state = "call"
                return True
            keep = 0 if final else _partial_suffix(buf, CALL_OPEN)
            if len(buf) > keep:
                self._text(out, buf[: len(buf) - keep])
                self._buf = buf[len(buf) - keep :]
            return False
        # state == "call"
        idx = buf.find(CALL_CLOSE)
        if idx < 0:
            return False
        body = buf[:idx]
        self._buf = buf[idx + len(CALL_CLOSE) :]
        self._state = "text"
        call = parse_tool_block(body, self.param_types)
        if call is None:
            self._text(out, f"{self._call_ws}{CALL_OPEN}{body}{CALL_CLOSE}")
        else:
            out.append(ParseEvent("tool_call", call=call))
            self._after_reasoning = True  # whitespace between consecutive calls is template glue
        return True
