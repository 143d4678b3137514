"""The trace: what the trainer consumes. Trainable tokens are exactly what the policy sampled."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator

Role = Literal["main", "subagent", "compaction", "side"]


class Span(BaseModel):
    """Where one call's tokens sit in ``Trace.response_ids``: context ``[context_start, start)``, sampled
    ``[start, end)``. The first call's context is ``prompt_ids`` itself (``context_start == start == 0``)."""

    call_id: str
    context_start: int
    start: int
    end: int
    finish_reason: str | None = None
    policy_versions: list[int] = Field(
        default_factory=list, description="the versions its tokens were sampled under: two across a weight update"
    )


class Trace(BaseModel):
    trace_id: str
    session_id: str
    prompt_ids: list[int] = Field(description="non-trainable context the first call was given")
    response_ids: list[int]
    loss_mask: list[int] = Field(description="1 = sampled by the policy, 0 = context (tool results, template glue)")
    logprobs: list[float | None] = Field(description="engine logprobs on trainable positions, None elsewhere")
    spans: list[Span]
    role: Role = "main"
    segment: int = 0
    break_reason: str | None = Field(default=None, description="why this trace starts here instead of extending")
    policy_versions: list[int] = Field(default_factory=list)
    weight: float = 1.0
    reward: float | None = None
    advantage: float | None = Field(default=None, description="the session's GRPO advantage")

    @model_validator(mode="after")
    def _aligned(self) -> Trace:
        n = len(self.response_ids)
        if len(self.loss_mask) != n or len(self.logprobs) != n:
            raise ValueError(f"trace {self.trace_id}: response_ids, loss_mask and logprobs differ in length")
        return self

    @property
    def call_ids(self) -> list[str]:
        return [s.call_id for s in self.spans]

    @property
    def trainable_tokens(self) -> int:
        return sum(self.loss_mask)

    def context_before(self, span: Span) -> list[int]:
        """The exact token context the engine was given for ``span``'s call, as this trace stitches it."""
        return self.prompt_ids + self.response_ids[: span.start]
