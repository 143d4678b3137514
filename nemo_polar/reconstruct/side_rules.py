"""Side calls: the model calls a harness makes beside its agent's own (titles, memory, reviews, routing), each
recognised by a rule and kept out of the agent's chains.

The rules are data keyed by the harness that makes the calls (``HARNESS_SIDE_RULES``; each key is the harness's
``name`` and each adapter reads its own rules through ``Harness.side_rules()``). They live here rather than on the
adapters because a call record does not say which CLI made it and every reader of records (``polar reconstruct``,
the view, the learning loops, the bench) builds traces with the same defaults, while reconstruct sits below the
harness adapters and cannot import them.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, Field


class SideRule(BaseModel):
    """A call matching every given condition is a harness side call (kept out of the agent's chains)."""

    name: str
    api: str | None = Field(default=None, description="only calls in this API dialect")
    system_contains: str | None = None
    last_user_contains: str | None = Field(
        default=None, description="in the text of the request's last message when it is the user's (tool results aside)"
    )
    max_tools: int | None = None


HARNESS_SIDE_RULES: dict[str, tuple[SideRule, ...]] = {
    "qwen_code": (SideRule(name="qwen_code_memory_extraction", system_contains="managed memory extraction subagent"),),
    # Codex's auto-reviewer (approvals_reviewer="auto_review"): judges one planned action, in its own conversation
    "codex": (SideRule(name="codex_auto_review", system_contains="You are judging one planned coding-agent action"),),
    # CLAUDE_CODE_EMIT_TOOL_USE_SUMMARIES: a label for each tool batch, asked for beside the agent's next call
    "claude_code": (
        SideRule(
            name="claude_code_tool_use_summary",
            system_contains="summary label describing what these tool calls",
            max_tools=0,
        ),
    ),
    # Gemini CLI's utility calls (each on a built-in model alias, not the -m model): the router when no model is
    # pinned, the LLM loop check, the next-speaker check (model.skipNextSpeakerCheck: false), the session summary.
    # Only in its dialect and without tools: its agent turns always carry tools, and another harness's user messages
    # may hold what the agent printed (mini-swe-agent's text mode), which must not make an agent call a side call.
    "gemini_cli": (
        SideRule(
            name="gemini_cli_router", api="gemini", system_contains="You are a specialized Task Routing AI", max_tools=0
        ),
        SideRule(
            name="gemini_cli_loop_check", api="gemini", system_contains="stuck in an unproductive loop", max_tools=0
        ),
        SideRule(
            name="gemini_cli_next_speaker",
            api="gemini",
            last_user_contains="determine who should logically speak next",
            max_tools=0,
        ),
        SideRule(
            name="gemini_cli_session_summary",
            api="gemini",
            last_user_contains="Summarize the user's primary intent or goal in this conversation",
            max_tools=0,
        ),
    ),
}

# Any CLI's: a title for the conversation, asked for without tools.
TITLE_GENERATION = SideRule(name="title_generation", system_contains="title", max_tools=0)

# In the order they are tried (the first rule a call matches names it): the title rule before Gemini CLI's, as ever.
DEFAULT_SIDE_RULES = [
    *HARNESS_SIDE_RULES["qwen_code"],
    *HARNESS_SIDE_RULES["codex"],
    *HARNESS_SIDE_RULES["claude_code"],
    TITLE_GENERATION,
    *HARNESS_SIDE_RULES["gemini_cli"],
]


# Where a CLI carries only part of a summary reply into the history it rewrites (compaction): the tag around that
# part, by harness. Claude Code keeps what is inside <summary>...</summary>.
HARNESS_SUMMARY_TAGS: dict[str, str] = {"claude_code": "summary"}
_CARRIED = [re.compile(rf"<{tag}>(.*?)</{tag}>", re.S) for tag in dict.fromkeys(HARNESS_SUMMARY_TAGS.values())]


def carried_summary(text: str) -> str:
    """The part of a summary reply a CLI carries into its rewritten history: inside a harness's tag, else all."""
    for tag in _CARRIED:
        if found := tag.search(text):
            return found.group(1).strip()
    return text
