"""Rendering a conversation into the engine's prompt token ids.

The engine's ``/tokenize`` is the reference. When the engine's model directory is on this machine the proxy
renders with the same tokenizer and chat template in-process instead, which takes a request off the engine's
API server and a round trip off every call's time to first token. The local renderer is used only after it
reproduced the engine's render exactly on a probe conversation (system prompt, tools, a tool call with compact
arguments, a tool result, reasoning); otherwise the proxy keeps using ``/tokenize``.
"""

from __future__ import annotations

import asyncio
import bisect
import functools
import logging
import re
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from jinja2 import TemplateSyntaxError

from nemo_polar.engine.families import tool_format
from nemo_polar.proxy import fastjson
from nemo_polar.proxy.conversation import TemplateTraits
from nemo_polar.proxy.engine_client import EngineClient
from nemo_polar.proxy.errors import ProxyError, template_refused
from nemo_polar.proxy.render.prefix import common_prefix, same_objects
from nemo_polar.proxy.render.prepared import TemplateInputs, as_vllm_sees_it
from nemo_polar.proxy.render.template_segments import MARK, START, NotSegmentable, SegmentedTemplate, TemplateCache

log = logging.getLogger(__name__)

PROBE_TOOLS = [
    {"type": "function", "function": {"name": "bash", "description": "Run a command. Ünïcode & <tags>.",
     "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}},
]  # fmt: skip
PROBE_ID = "call00001"  # 9 letters and digits: the one id form every template takes (Mistral's takes no other)
PROBE_MESSAGES = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "list the files\n  please"},
    {"role": "assistant", "content": "", "reasoning": "Let me look.", "reasoning_content": "Let me look.",
     "tool_calls": [{"id": PROBE_ID, "type": "function",
                     "function": {"name": "bash", "arguments": '{"command":"ls"}'}}]},
    {"role": "tool", "tool_call_id": PROBE_ID, "content": "README.md\nhello.py"},
    {"role": "assistant", "content": "Two files."},
    {"role": "user", "content": "thanks"},
]  # fmt: skip

PROBE_CHAT = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "list the files\n  please"},
    {"role": "assistant", "content": "Two files."},
    {"role": "user", "content": "thanks"},
]
# What a local renderer must render as the engine does: the whole probe, the same ending mid-turn (where templates
# keep the reasoning before a tool call), and a plain chat for templates that take only alternating turns.
VERIFY: list[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]] = [
    (PROBE_MESSAGES, PROBE_TOOLS),
    (PROBE_MESSAGES[:4], PROBE_TOOLS),
    (PROBE_CHAT, None),
]


# Where CLIs put system messages: a run of them up front (Codex), one after the first user turn (Claude Code).
_LEADING_SYSTEMS = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "system", "content": "Work in the repository."},
    {"role": "user", "content": "list the files"},
]
_LATER_SYSTEM = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "list the files"},
    {"role": "assistant", "content": "Which directory?"},
    {"role": "system", "content": "The working directory is /testbed."},
    {"role": "user", "content": "this one"},
]


def _tool_turn(ident: str) -> list[dict[str, Any]]:
    call = {"id": ident, "type": "function", "function": {"name": "bash", "arguments": '{"command":"ls"}'}}
    return [
        {"role": "user", "content": "list the files"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": ident, "content": "README.md"},
    ]


async def probe_template(renderer: Renderer, tool_parser: str | None = None) -> TemplateTraits:
    """Which system-message placements the template refuses (a client error on render), silently drops (the
    render is the same without that message: gpt-oss's renders only the first system message) or moves (DeepSeek
    V3.1's gathers every system message at the top, which would rewrite the prefix), whether it renders tools at
    all (Gemma 3's has no tool support: the model would never see them), whether it takes two user messages in a
    row and call ids of the harnesses' own forms (Mistral's takes neither), tried once each. Where the template
    takes any id but the family's ``tool_parser`` reads only one form (Kimi K2's), the ids take that form."""

    async def ids(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[int] | None:
        return await _render_or_none(renderer, messages, tools)

    async def takes(messages: list[dict[str, Any]], index: int) -> bool:
        """The template renders ``messages[index]``: no refusal, and the render differs from the one without it."""
        full = await ids(messages)
        return full is not None and full != await ids(messages[:index] + messages[index + 1 :])

    async def moves(messages: list[dict[str, Any]], index: int) -> bool:
        """The template renders ``messages[index]`` before the messages that precede it: the renders with and without
        it part before the end of the turns before it (where the render of those alone parts from them)."""
        full, without = await ids(messages), await ids(messages[:index] + messages[index + 1 :])
        before = await ids(messages[: index - 1])
        if full is None or without is None or before is None:
            return False
        return common_prefix(full, without) < common_prefix(before, without)

    chat = [{"role": "user", "content": "list the files"}]
    with_tools = await ids(chat, PROBE_TOOLS)
    two_users = [{"role": "user", "content": "list the files"}, {"role": "user", "content": "in this directory"}]
    harness_ids = await ids(_tool_turn("call_Xy12ab"), PROBE_TOOLS)
    return TemplateTraits(
        merge_leading=not await takes(_LEADING_SYSTEMS, 1),
        later_as_user=not await takes(_LATER_SYSTEM, 3) or await moves(_LATER_SYSTEM, 3),
        renders_tools=with_tools is not None and with_tools != await ids(chat),
        join_users=await ids(two_users) is None and await ids(two_users[:1]) is not None,
        call_ids="alnum9"
        if harness_ids is None and await ids(_tool_turn(PROBE_ID), PROBE_TOOLS)
        else tool_format(tool_parser).call_ids,
    )


class Renderer(Protocol):
    name: str

    async def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        kwargs: dict[str, Any],
        cache: TokenCache | None = None,
    ) -> list[int]:
        """The prompt's ids; with a session's ``cache``, possibly by tokenizing only what is new (``cache.how``). Those
        may be the cache's own list, which the session's next render changes in place: read them before it, and copy
        what is kept."""
        ...


class EngineRenderer:
    name = "engine"

    def __init__(self, engine: EngineClient) -> None:
        self.engine = engine

    async def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        kwargs: dict[str, Any],
        cache: TokenCache | None = None,
    ) -> list[int]:
        if cache is not None:
            cache.how = cache.template_how = "full:engine_tokenize"
        return await self.engine.tokenize_chat(messages, tools, kwargs)


def _as_vllm_sees_them(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [as_vllm_sees_it(m) for m in messages]


def preload_tokenizers() -> bool:
    """Import the tokenizer stack on the calling thread, before the server runs. Importing transformers takes
    seconds, and doing it lazily in a worker thread while the server runs stalls the event loop for as long: on a
    busy 2-core machine ``/health`` answered after 12.7 s instead of 0.45 s. False when transformers is missing
    (the engine then renders)."""
    try:
        from transformers import AutoTokenizer  # noqa: F401
    except ImportError:
        return False
    return True


class LocalRenderer:
    name = "local"
    # A render runs in a thread, beside the event loop (its tokenizer works outside the interpreter lock), but one
    # after the session's first (``cache`` holds the last: what the call adds is rendered, ~1 ms) runs on the loop
    # where no core is spare for the thread (ProxyConfig.helper_threads): there each hand-off waits for a core. A
    # history the harness rewrote then renders whole on the loop: rare, and the cost of not handing off the rest.
    appends_in_thread = True

    def __init__(self, model_dir: Path) -> None:
        from transformers import AutoTokenizer  # imported here: only needed when the engine's files are local

        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        template = model_dir / "chat_template.jinja"
        if template.exists():  # what `polar engine up` passes to vLLM as --chat-template
            self.tokenizer.chat_template = template.read_text()
        self.tokenizer.model_max_length = 1 << 40  # a render is as long as its session: the engine checks the context
        self.incremental = IncrementalEncoder.for_tokenizer(self.tokenizer)
        self.segments = _segmented(self.tokenizer.chat_template)
        self.inputs = TemplateInputs(self.tokenizer)

    @functools.cached_property
    def compiled(self) -> Any:
        """The template compiled in the environment transformers renders it in."""
        from transformers.utils.chat_template_utils import _compile_jinja_template

        return _compile_jinja_template(self.tokenizer.chat_template)

    def render_sync(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        kwargs: dict[str, Any],
        cache: TokenCache | None = None,
    ) -> list[int]:
        def whole() -> str:
            if not self.inputs.alias_reasoning:  # apply_chat_template would alias: render as the engine does
                prepared = [self.inputs.prepare(m) for m in messages]
                return self.inputs.render(self.compiled, prepared, tools, kwargs)
            view = _as_vllm_sees_them(messages)
            return self.tokenizer.apply_chat_template(
                view, tools=tools, add_generation_prompt=True, tokenize=False, **kwargs
            )

        if cache is None:
            return self.encode(whole())
        with cache.lock:
            text = self._template(whole, messages, tools, kwargs, cache)
            if self.incremental is not None:
                return self.incremental.encode(text, cache)
            return self.encode(text)

    def _template(
        self, whole: Any, messages: list[dict[str, Any]], tools: Any, kwargs: dict[str, Any], cache: TokenCache
    ) -> str:
        """The template's text over messages prepared once each (``TemplateInputs``), running it over the new
        messages only where ``SegmentedTemplate`` proves that enough; ``cache.template_how`` says which."""
        last = cache.template
        try:
            keys = _keys(messages, last)
            last.written = (list(messages), keys)  # the list as it is now: a caller may append to its own
            prepared = self.inputs.prepared(messages, keys, last.messages, last.prepared)
        except Exception as exc:  # a message transformers' preparation refuses: it raises the same again
            cache.template = TemplateCache()
            cache.template_how = f"full:{type(exc).__name__}"
            return whole()

        def render(template: Any, **marks: Any) -> str:
            return self.inputs.render(template, prepared, tools, {**kwargs, **marks})

        if self.segments is None or START in kwargs or MARK in kwargs or last.whole_only:
            text = render(self.compiled)  # raises what the template raises for this conversation
            last.messages, last.prepared = keys, prepared
            cache.template_how = "full:not_segmentable"
            return text
        try:
            text, cache.template_how = self.segments.render(render, messages, tools, kwargs, last, keys)
            last.prepared = prepared
            return text
        except NotSegmentable as exc:  # iterations skipped, or the mark in a message: this session renders whole
            cache.template = TemplateCache(messages=keys, prepared=prepared, whole_only=True)
            cache.template_how = f"full:{type(exc).__name__}"
            return render(self.compiled)
        except Exception as exc:  # the derived template's state not JSON, or the template raises: render whole
            cache.template = TemplateCache()
            cache.template_how = f"full:{type(exc).__name__}"
            return whole()  # raises what the template itself raises for this conversation

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    async def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        kwargs: dict[str, Any],
        cache: TokenCache | None = None,
    ) -> list[int]:
        try:
            if cache is not None and cache.text and not self.appends_in_thread:
                return self.render_sync(messages, tools, kwargs, cache)
            return await asyncio.to_thread(self.render_sync, messages, tools, kwargs, cache)
        except Exception as exc:  # whatever the template raises for this input: a 400, as vLLM answers it
            raise template_refused(exc) from None


def _ends(before: dict[int, list[int]], kept: int, tail: list[tuple[int, int, int]]) -> dict[int, list[int]]:
    """Each boundary token's ends in ``ids[:kept]`` (``before``'s up to there) followed by those in ``tail``: the work
    is what the render added, not the history."""
    ends = {token: at[: bisect.bisect_right(at, kept)] for token, at in before.items()}
    for _, end, token in tail:
        ends.setdefault(token, []).append(end)
    return ends


@dataclass
class TokenCache:
    """One session's last rendered prompt: its text, its ids, and where each boundary token ends in both. Used and
    replaced by :meth:`IncrementalEncoder.encode`; ``how`` says how the last prompt was tokenized."""

    text: str = ""
    ids: list[int] = field(default_factory=list)
    # (char end, token end, token id) after each boundary token; empty, with text, when ids may hold more of them
    marks: list[tuple[int, int, int]] = field(default_factory=list)
    ends: dict[int, list[int]] = field(default_factory=dict)  # boundary token id -> each of its token ends in ids
    kinds: frozenset[int] = frozenset()  # the boundary tokens' ids
    how: str = ""
    template: TemplateCache = field(default_factory=TemplateCache)
    template_how: str = ""
    lock: threading.RLock = field(default_factory=threading.RLock)  # held across the template and the tokenization

    def token_ends(self, ids: list[int], token: int) -> list[int] | None:
        """Where each ``token`` in ``ids`` ends (the index after it), when ``ids`` is this cache's last render and
        ``token`` a boundary token whose every place in it the cache knows; else None (search ``ids``)."""
        with self.lock:
            if ids is not self.ids or not self.text or token not in self.kinds:
                return None
            return self.ends.get(token, [])


class IncrementalEncoder:
    """Tokenizes only what a render appended to the session's previous one.

    Why the ids equal the full tokenization, at no cost of a full one: a Hugging Face fast tokenizer first splits
    the text at its added tokens (matched on the raw text) and then normalizes, pre-tokenizes and BPE-encodes each
    piece between them on its own. So when the new text extends the previous one's text up to the end of an added
    token (here: one with no lstrip/rstrip/single_word, not normalized, and no prefix of another added token, so
    no longer match can cross the cut), the ids up to there are the previous ids up to that token, and the rest
    is the encoding of the rest. Where the cut cannot be proven (no such token in the common prefix, or the
    previous ids did not show the added tokens where its text has them), the whole text is tokenized and
    ``cache.how`` says why.
    """

    def __init__(self, tokenizer: Any, boundaries: dict[str, int]) -> None:
        self.tokenizer = tokenizer
        backend = tokenizer.backend_tokenizer
        self._batch = getattr(backend, "encode_batch_fast", None) or backend.encode_batch
        self.kinds = frozenset(boundaries.values())
        self.by_text = boundaries
        self.pattern = re.compile("|".join(re.escape(t) for t in sorted(boundaries, key=len, reverse=True)))

    @classmethod
    def for_tokenizer(cls, tokenizer: Any) -> IncrementalEncoder | None:
        added = getattr(tokenizer, "added_tokens_decoder", None)
        if not getattr(tokenizer, "is_fast", False) or not added:
            return None
        texts = [tok.content for tok in added.values()]
        boundaries = {
            tok.content: idx
            for idx, tok in added.items()
            if not (tok.lstrip or tok.rstrip or tok.single_word or tok.normalized)
            and not any(tok.content in other[:-1] for other in texts)  # no other added token spans the cut
        }
        return cls(tokenizer, boundaries) if boundaries else None

    def _encode(self, text: str) -> list[int]:
        # The Rust tokenizer's batch call: it tokenizes with the GIL released (its single-text encode holds it, and a
        # session's first, whole render would stall every other session's call meanwhile) and, without offsets, ~30%
        # faster. Called directly: the transformers wrapper's argument handling alone took ~0.5 ms a call in a
        # loaded proxy, as much as tokenizing a turn. The same ids (test_incremental_render checks them against it).
        return self._batch([text], add_special_tokens=False)[0].ids

    def _marks(self, text: str, ids: list[int], start: tuple[int, int]) -> list[tuple[int, int, int]] | None:
        """(char end, token end, token id) of each boundary token, or None when text and ids do not show the same
        ones."""
        at = [i for i, t in enumerate(ids) if t in self.kinds]
        found = list(self.pattern.finditer(text))
        if len(found) != len(at) or any(self.by_text[m.group()] != ids[i] for m, i in zip(found, at, strict=True)):
            return None
        return [(start[0] + m.end(), start[1] + i + 1, ids[i]) for m, i in zip(found, at, strict=True)]

    def encode(self, text: str, cache: TokenCache) -> list[int]:
        with cache.lock:
            kept, how = self._kept(cache, text)
            chars, tokens = cache.marks[kept - 1][:2] if kept else (0, 0)  # (0, 0): the whole text
            tail = self._encode(text[chars:])
            tail_marks = self._marks(text[chars:], tail, (chars, tokens))
            # In place: copying the kept ids cost ~1 ms a call at 64k tokens in a loaded proxy (each id's reference
            # count is touched). The list is the cache's own (Renderer.render: a caller copies what it keeps).
            ids = cache.ids
            del ids[tokens:]
            ids += tail
            cache.how, cache.kinds = how, self.kinds
            if tail_marks is None:  # the next call cannot cut anywhere in this one
                cache.text, cache.marks, cache.ends = "", [], {}
            else:
                cache.text, cache.marks = text, cache.marks[:kept] + tail_marks
                cache.ends = _ends(cache.ends, tokens, tail_marks)
            return ids

    @staticmethod
    def _kept(cache: TokenCache, text: str) -> tuple[int, str]:
        """How many of the last render's boundary marks lie in its common prefix with ``text``, and what that
        means for ``cache.how``."""
        if not cache.text:
            return 0, "full:first"
        k = bisect.bisect_right(cache.marks, (common_prefix(cache.text, text), sys.maxsize))
        if k == 0:
            return 0, "full:no_boundary_in_common_prefix"
        return k, f"tail:{len(text) - cache.marks[k - 1][0]}"


def _keys(messages: list[dict[str, Any]], last: TemplateCache) -> list[bytes]:
    """Each message's JSON: the last render's where the message is the same dict (a conversation's messages hand the
    template the same dict on every call and never change it: ``Message.to_template``), else written."""
    before, keys = last.written
    shared = same_objects(messages, before)
    return [*keys[:shared], *map(fastjson.dumps, messages[shared:])]


def _segmented(template: Any) -> SegmentedTemplate | None:
    """The template derived for rendering only new messages, or None (it is then rendered whole every call)."""
    if not isinstance(template, str):
        return None
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template  # the environment it renders in

        return SegmentedTemplate.derive(template, _compile_jinja_template(template).environment)
    except (ImportError, NotSegmentable, TemplateSyntaxError) as exc:
        log.info("the chat template runs over the whole history on every call: %s", exc)
        return None


async def verified_local_renderer(engine: EngineClient) -> LocalRenderer | None:
    """A local renderer that renders the probe conversations the template takes exactly as the engine does, or
    None. A mid-turn conversation (reasoning before a tool call, then its result) shows whether the engine's
    transformers aliases reasoning fields; the local renderer follows whichever it finds."""
    root = await engine.model_root()
    if root is None or not (Path(root) / "tokenizer_config.json").exists():
        return None
    try:
        local = await asyncio.to_thread(LocalRenderer, Path(root))
        probes = [(m, t) for m, t in VERIFY if await _render_or_none(local, m, t) is not None]
    except Exception as exc:  # a missing dependency or an unusual tokenizer: the engine renders
        log.warning("local rendering unavailable (%r); using the engine's /tokenize", exc)
        return None
    if not probes:
        log.warning("the chat template takes none of the probe conversations; using the engine's /tokenize")
        return None
    theirs = [await engine.tokenize_chat(m, t, {}) for m, t in probes]
    for alias in (True, False):
        local.inputs.alias_reasoning = alias
        if [await local.render(m, t, {}) for m, t in probes] == theirs:
            if not alias:
                log.info("the engine's template sees reasoning only under the name it was sent with")
            return local
    log.warning("local render differs from the engine's; using the engine's /tokenize")
    return None


async def _render_or_none(
    renderer: Renderer, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> list[int] | None:
    """The render's ids, or None where the template refuses it (a client error)."""
    try:
        return await renderer.render(messages, tools, {})
    except ProxyError as err:
        if err.status != 400:
            raise
        log.info("the chat template refuses %s: %s", [m["role"] for m in messages], err.message)
        return None
