"""A model family's sampled output parsed by vLLM's own parsers, the ones its chat endpoint runs for the family's
``--tool-call-parser`` / ``--reasoning-parser`` (harmony for gpt-oss, ``llama3_json``, ``glm47``, ...): one place
for every family's format, and the same reading of a sample that the engine's chat mode gives.

They run in :mod:`nemo_polar.engine.parser_worker`, a process in the engine's virtualenv (importing vLLM takes
about 10-20 s and 0.5 GB: one worker per process, shared by its proxies and started on first use). A
:class:`FamilyStream` turns one sample's deltas (text and token ids: harmony reads the ids) into the proxy's parse
events, as :class:`StreamParser` does for the formats parsed in process.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_polar.engine.families import is_harmony, read_in_process, served_trait, tool_format
from nemo_polar.engine.worker_process import WorkerProcess, WorkerProcessError
from nemo_polar.proxy.engine_client import EngineInfo
from nemo_polar.proxy.errors import ProxyError
from nemo_polar.proxy.parse.parser import ParsedToolCall, ParseEvent

WORKER = Path(__file__).resolve().parents[2] / "engine" / "parser_worker.py"


MISTRAL_CALLS = "[TOOL_CALLS]"  # Mistral's calls follow this token: a JSON list, each call with its "id"
# Kimi K2's call header is its id: <|tool_call_begin|>functions.NAME:INDEX<|tool_call_argument_begin|>
KIMI_CALL = re.compile(r"<\|tool_call_begin\|>\s*(.*?)\s*<\|tool_call_argument_begin\|>", re.DOTALL)


def sampled_call_ids(tool_parser: str | None, text: str) -> list[str | None]:
    """The ids the model wrote for its calls, in order, where the format ``tool_parser`` reads carries them and the
    proxy does not hand them to the harness (``families.SampledIds``): a record keeps them, and a re-render gives
    each call back the id the model wrote."""
    form = tool_format(tool_parser).sampled_ids
    if form == "kimi_headers":
        return [m.group(1) for m in KIMI_CALL.finditer(text)]
    if form != "mistral_json" or MISTRAL_CALLS not in text:
        return []
    try:
        calls, _ = json.JSONDecoder().raw_decode(text.split(MISTRAL_CALLS, 1)[1].lstrip())
    except ValueError:
        return []
    if not isinstance(calls, list):
        return []
    return [c.get("id") if isinstance(c, dict) and isinstance(c.get("id"), str) else None for c in calls]


ParserWorkerError = WorkerProcessError  # what a parse that the worker could not do raises


@dataclass(frozen=True)
class FamilyFormat:
    """What selects a family's parsers: the model directory (its tokenizer) and vLLM's parser names."""

    model_dir: str
    tool_parser: str | None
    reasoning_parser: str | None
    harmony: bool = False  # families.ModelFamily.harmony

    def fields(self) -> dict[str, Any]:
        return {
            "model_dir": self.model_dir,
            "tool_parser": self.tool_parser,
            "reasoning_parser": self.reasoning_parser,
            "harmony": self.harmony,
        }


def family_format(info: EngineInfo, tool_parser: str | None, reasoning_parser: str | None) -> FamilyFormat | None:
    """The format vLLM's parsers read for this engine's model, or None where the in-process parser reads it. The
    parser names are the given ones, else those the model directory's polar-family.json names, else ChatML's."""
    tool = tool_parser or served_trait(info.family, "tool_call_parser")
    reasoning = reasoning_parser or served_trait(info.family, "reasoning_parser")
    if read_in_process(tool, reasoning):
        return None
    if info.root is None or not Path(info.root).is_dir():
        raise ProxyError(
            500,
            f"the model's output format (tool parser {tool!r}, reasoning parser {reasoning!r}) is read by vLLM's "
            f"parsers, which need the model's tokenizer files here; the engine's model directory {info.root!r} is "
            "not on this machine",
            code="parser_unavailable",
        )
    return FamilyFormat(info.root, tool, reasoning, harmony=is_harmony(info.family))


async def unreadable_format(config: Any) -> str | None:
    """Why a proxy with ``config`` (a ProxyConfig) could not read its engine's sampled format in continuation mode,
    checked at start: None when it can, or when the engine does not answer yet (then the first call checks)."""
    from nemo_polar.proxy.engine_client import EngineClient

    if config.default_mode != "continuation":
        return None  # the engine's chat endpoint parses
    engine = EngineClient(config.engine_url, eot_token=config.eot_token, served_model=config.served_model)
    try:
        info = await engine.info()
        family_format(info, config.tool_call_parser, config.reasoning_parser)
    except ProxyError as exc:
        return exc.message if exc.code == "parser_unavailable" else None
    finally:
        await engine.aclose()
    return None


class ParserWorker:
    """The worker process, one request at a time (a lock serialises the JSON-lines exchange)."""

    def __init__(self, python: Path | None = None) -> None:
        self.python = python
        self.process = WorkerProcess(WORKER, "parser worker", python)
        self._ids = itertools.count()

    def call(self, op: str, **fields: Any) -> dict[str, Any]:
        return self.process.call({"op": op, **fields})

    def new_id(self) -> str:
        return f"s{next(self._ids)}"

    def parse(
        self,
        fmt: FamilyFormat,
        text: str,
        token_ids: list[int],
        tools: list[dict[str, Any]] | None = None,
        prompt_token_ids: list[int] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """A whole sample: ``{"reasoning", "content", "tool_calls": [{"name", "arguments"}]}``."""
        return self.call(
            "parse",
            id=self.new_id(),
            text=text,
            token_ids=token_ids,
            tools=tools,
            prompt_token_ids=prompt_token_ids,
            chat_template_kwargs=chat_template_kwargs,
            **fmt.fields(),
        )

    def stream(
        self,
        fmt: FamilyFormat,
        tools: list[dict[str, Any]] | None = None,
        prompt_token_ids: list[int] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> FamilyStream:
        sid = self.new_id()
        reply = self.call(
            "open",
            id=sid,
            tools=tools,
            prompt_token_ids=prompt_token_ids,
            chat_template_kwargs=chat_template_kwargs,
            **fmt.fields(),
        )
        return FamilyStream(self, sid, reply["sampling"]["skip_special_tokens"], fmt.tool_parser)

    def close(self) -> None:
        self.process.close()


_shared_lock = threading.Lock()
_shared: dict[Path | None, tuple[ParserWorker, int]] = {}


def acquire_parser_worker(python: Path | None = None) -> ParserWorker:
    """The process's parser worker for ``python``, shared by every proxy in the process (a worker costs ~20 s of
    vLLM imports and 0.5 GB; its streams are keyed by ids it hands out, so proxies never see each other's)."""
    with _shared_lock:
        worker, holders = _shared.get(python, (None, 0))
        worker = worker or ParserWorker(python)
        _shared[python] = (worker, holders + 1)
        return worker


def release_parser_worker(worker: ParserWorker) -> None:
    """The caller is done with ``worker``: the last holder's release stops it."""
    with _shared_lock:
        shared, holders = _shared.get(worker.python, (None, 0))
        if shared is not worker:
            worker.close()
            return
        if holders > 1:
            _shared[worker.python] = (worker, holders - 1)
            return
        del _shared[worker.python]
    worker.close()


@dataclass
class FamilyStream:
    """One sample's deltas in, parse events out. vLLM streams a tool call's arguments in pieces; a call is released
    whole, once the next call starts or the sample ends."""

    worker: ParserWorker
    sid: str
    skip_special_tokens: bool  # what the family's parsers ask of the engine's detokeniser
    tool_parser: str | None = None
    _calls: dict[int, dict[str, str]] = field(default_factory=dict)
    _closed: bool = False

    def feed(self, text: str, token_ids: list[int], finished: bool = False) -> list[ParseEvent]:
        delta = self.worker.call("delta", id=self.sid, text=text, token_ids=token_ids, finished=finished)["delta"]
        events: list[ParseEvent] = []
        if delta:
            if delta.get("reasoning"):
                events.append(ParseEvent("reasoning", delta["reasoning"]))
            if delta.get("content"):
                events.append(ParseEvent("text", delta["content"]))
            for piece in delta.get("tool_calls") or []:
                index = int(piece["index"])
                if index not in self._calls:
                    events += self._release(below=index)
                    self._calls[index] = {"name": "", "arguments": ""}
                self._calls[index]["name"] += piece.get("name") or ""
                self._calls[index]["arguments"] += piece.get("arguments") or ""
        if finished:
            events += self._release(below=None)
            self.close()
        return events

    def whole(self, text: str, token_ids: list[int]) -> list[ParseEvent]:
        """The sample in one piece (a non-streamed request), parsed whole as vLLM's endpoint parses it."""
        parsed = self.worker.call("whole", id=self.sid, text=text, token_ids=token_ids)
        events = [ParseEvent("reasoning", parsed["reasoning"])] if parsed.get("reasoning") else []
        if parsed.get("content"):
            events.append(ParseEvent("text", parsed["content"]))
        for call in parsed.get("tool_calls") or []:
            parsed_call = ParsedToolCall(name=call["name"], arguments=call["arguments"] or "{}", raw="")
            events.append(ParseEvent("tool_call", call=parsed_call))
        self.close()
        return events

    def close(self) -> None:
        """Drop the worker's parser for this sample (at its end, or when the call is abandoned before it)."""
        if not self._closed:
            self._closed = True
            self.worker.call("close", id=self.sid)

    def _release(self, below: int | None) -> list[ParseEvent]:
        done = sorted(i for i in self._calls if below is None or i < below)
        events = []
        for i in done:
            call = self._calls.pop(i)
            parsed = ParsedToolCall(name=call["name"], arguments=call["arguments"] or "{}", raw="")
            events.append(ParseEvent("tool_call", call=parsed))
        return events
