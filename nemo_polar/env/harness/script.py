"""Scripted policy: a session's model turns written as harness-neutral actions.

The embedded CPU models cannot drive a coding CLI on their own, so tests and demos give the proxy a script: each action
becomes an assistant turn, which the model's own chat template writes in its family's format, and the engine is held to
exactly those tokens for that call (:mod:`nemo_polar.proxy.generate.scripted`). The CLI is real, its tools really run,
and the ids and logprobs are really sampled by the engine; only the choice of tokens is fixed. Each harness adapter maps
an action to its own tool name and argument schema.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, TypeAdapter


class Shell(BaseModel):
    kind: Literal["shell"] = "shell"
    command: str


class ReadFile(BaseModel):
    kind: Literal["read_file"] = "read_file"
    path: str = Field(description="relative to the workspace")


class EditFile(BaseModel):
    kind: Literal["edit_file"] = "edit_file"
    path: str = Field(description="relative to the workspace")
    old: str
    new: str


class Final(BaseModel):
    """A text-only turn: the answer, or what a CLI asked for without tools (a compaction summary, a title)."""

    kind: Literal["final"] = "final"
    text: str


class Subagent(BaseModel):
    """Delegate to the CLI's own subagent tool; the subagent's calls follow in the script, then the main turn."""

    kind: Literal["subagent"] = "subagent"
    description: str
    prompt: str


Tool = Annotated[Shell | ReadFile | EditFile | Subagent, Field(discriminator="kind")]


class ToolCalls(BaseModel):
    """Several tool calls in one assistant turn (parallel tool calls)."""

    kind: Literal["tool_calls"] = "tool_calls"
    calls: list[Tool] = Field(min_length=2)


Action = Annotated[Shell | ReadFile | EditFile | Final | Subagent | ToolCalls, Field(discriminator="kind")]
Script = list[Action]
script_adapter: TypeAdapter[list[Action]] = TypeAdapter(list[Action])
