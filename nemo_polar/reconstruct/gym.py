"""A trace as NeMo Gym output items: what a Gym ``/run`` result carries to NeMo-RL for training."""

from __future__ import annotations

from typing import Any

from nemo_polar.proxy.store.records import CallRecord
from nemo_polar.reconstruct.trace import Trace


def gym_output_items(trace: Trace, records: dict[str, CallRecord]) -> list[dict[str, Any]]:
    """NeMo Gym output items for one trace: token fields on each call's item, prefix-contiguous by construction."""
    items = []
    for span in trace.spans:
        rec = records[span.call_id]
        items.append(
            {
                "type": "message",
                "id": f"msg_{rec.call_id}",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": rec.output_text or "", "annotations": []}],
                "prompt_token_ids": trace.context_before(span),
                "generation_token_ids": trace.response_ids[span.start : span.end],
                "generation_log_probs": list(rec.sampled_logprobs),
            }
        )
    return items


def check_contiguous(items: list[dict[str, Any]]) -> None:
    """NeMo-RL's rule for Gym results: each token-bearing item's prompt extends everything seen before it."""
    seen: list[int] = []
    for item in items:
        if "generation_token_ids" not in item:
            continue
        if item["prompt_token_ids"][: len(seen)] != seen:
            raise ValueError("Non-contiguous messages found!")
        seen = item["prompt_token_ids"] + item["generation_token_ids"]
