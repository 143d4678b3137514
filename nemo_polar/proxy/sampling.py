"""Sampling parameters: one model for what the harness asked, what a session pins and what the engine was sent.

Every field is optional: ``None`` means "not given" (the engine's default applies). :meth:`SamplingParams.resolve`
is the one merge rule: a pinned value wins over the asked one, except ``max_tokens``, where the pin is a cap on
what the harness asked (the smaller of the two).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


class SamplingParams(BaseModel):
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int | None = None
    stop: list[str] | None = None
    seed: int | None = None

    @classmethod
    def resolve(cls, asked: SamplingParams, pinned: SamplingParams) -> SamplingParams:
        """What is sent to the engine for a call that asked ``asked`` in a session that pins ``pinned``."""
        merged = {name: getattr(asked, name) for name in cls.model_fields}
        merged.update(pinned.model_dump(exclude_none=True))
        if asked.max_tokens is not None and pinned.max_tokens is not None:
            merged["max_tokens"] = min(asked.max_tokens, pinned.max_tokens)
        return cls.model_validate(merged)

    def engine_fields(self) -> dict[str, Any]:
        """The given parameters, as fields of a vLLM completions / chat request body."""
        return self.model_dump(exclude_none=True)
