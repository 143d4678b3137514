"""Session rewards onto traces, with GRPO advantages computed per session (the unit of a rollout).

A session that split into N traces must not weigh N times as much as one that did not (the per-request reward
hacking the Polar paper warns about): every trace carries its session's reward and advantage. Under a token-level
loss each sampled token is trainable in one trace only, so a split session already weighs what it would merged;
under a loss that averages per sample, the trace weights (1/N per session, see the builders) make each session one
unit of gradient.
"""

from __future__ import annotations

import statistics

from nemo_polar.reconstruct.trace import Trace


def group_advantages(rewards: dict[str, float], *, scale_by_std: bool = False, eps: float = 1e-6) -> dict[str, float]:
    """GRPO advantages for one prompt group, one value per session: reward minus the group mean (optionally
    divided by the group's standard deviation)."""
    if not rewards:
        return {}
    mean = statistics.fmean(rewards.values())
    std = statistics.pstdev(rewards.values()) if scale_by_std else 1.0
    return {sid: (r - mean) / (std + eps if scale_by_std else 1.0) for sid, r in rewards.items()}


def assign(traces: list[Trace], rewards: dict[str, float], advantages: dict[str, float]) -> None:
    """Carry each session's reward and advantage to all of its traces; a trace of an unknown session raises."""
    for trace in traces:
        if trace.session_id not in rewards:
            raise KeyError(f"no reward for session {trace.session_id!r} (trace {trace.trace_id})")
        trace.reward = rewards[trace.session_id]
        trace.advantage = advantages[trace.session_id]
