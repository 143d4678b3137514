"""Sessions of an unchanged CLI for ``polar learn --harness``, run by the path the Gym environments serve NeMo-RL
with: one Gym row per attempt into :class:`~nemo_polar.env.gym.episodes.PolarEpisodes` (rollout gateway, sandboxed
CLI, the learner's proxy, swebench's grade, the verdict's mask), and the result turned into a trainer row the way
NeMo-RL turns it into a sample (:mod:`nemo_polar.env.gym.nemo_rl`). Besides the reward, each session says how the
model used the harness's protocol: how many of its calls asked for tools, and how many of those were valid (every
call names a tool the harness offered, with a JSON object as arguments).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from nemo_polar.env.gym.episodes import PolarEpisodes, PolarRunRequest, PolarSettings
from nemo_polar.env.gym.nemo_rl import nemo_rl_sample
from nemo_polar.env.gym.rows import example_row
from nemo_polar.env.runtime.attempt import AttemptDir
from nemo_polar.proxy.conversation import ToolCall
from nemo_polar.proxy.http.client import ProxyClient
from nemo_polar.proxy.store.records import CallRecord
from nemo_polar.rewards.instance import SWEInstance

AGENT = "polar_learn"


class SessionStats(BaseModel):
    instance_id: str
    reward: float
    masked: bool
    failure_kind: str | None = None
    calls: int
    tool_calls: int = Field(description="calls whose reply the engine's parser turned into tool calls")
    valid_tool_calls: int = Field(description="of those, calls whose every tool call the harness could run")
    generated_tokens: int


class Rollout(BaseModel):
    stats: SessionStats
    sample: dict[str, Any] | None = Field(description="NeMo-RL's sample of the Gym result; None when it has none")
    session_dir: str | None = Field(default=None, description="the attempt's directory (records, outcome, grade)")
    spans: list[tuple[float, float]] = Field(
        default_factory=list, description="each model call's [start, end] (wall clock): when the engine served it"
    )


def busy_fraction(spans: list[tuple[float, float]], start: float, end: float) -> float:
    """The share of ``[start, end]`` in which the engine served at least one call: the union of the spans."""
    busy, reach = 0.0, start
    for a, b in sorted(spans):
        a, b = max(a, reach), min(b, end)
        if b > a:
            busy, reach = busy + b - a, b
    return busy / (end - start) if end > start else 0.0


class PhaseStats(BaseModel):
    """A set of sessions in a line: what a user reads per phase and per step."""

    sessions: int
    masked: int
    reward: float = Field(description="mean reward over the unmasked sessions")
    tool_call_rate: float = Field(description="model calls that asked for a tool / model calls")
    valid_tool_call_rate: float = Field(description="model calls with only valid tool calls / model calls")
    sessions_with_valid_tool_calls: float = Field(description="share of sessions with at least one valid tool call")
    tokens_per_session: float = Field(description="generated tokens per session")

    @classmethod
    def of(cls, rollouts: list[Rollout]) -> PhaseStats:
        stats = [r.stats for r in rollouts]
        kept = [s for s in stats if not s.masked]
        calls = sum(s.calls for s in stats) or 1
        return cls(
            sessions=len(stats),
            masked=len(stats) - len(kept),
            reward=sum(s.reward for s in kept) / len(kept) if kept else 0.0,
            tool_call_rate=sum(s.tool_calls for s in stats) / calls,
            valid_tool_call_rate=sum(s.valid_tool_calls for s in stats) / calls,
            sessions_with_valid_tool_calls=sum(s.valid_tool_calls > 0 for s in stats) / max(len(stats), 1),
            tokens_per_session=sum(s.generated_tokens for s in stats) / max(len(stats), 1),
        )


def learn_row(instance: SWEInstance) -> dict[str, Any]:
    """The instance as a Gym row that carries its own environment and grading (a SWE-bench 5 row with a local
    checkout), and its script for the teacher."""
    extra = {"repo_path": str(instance.repo_path), "eval_script": instance.eval_script, "script": instance.script}
    extra |= {"log_parser": instance.log_parser, "python_env": instance.python_env and str(instance.python_env)}
    return example_row(instance, AGENT) | {k: v for k, v in extra.items() if v is not None}


def offered_tools(record: CallRecord) -> set[str]:
    """The tool names the harness's request offered (chat, Responses and Messages shapes)."""
    request = record.request if isinstance(record.request, dict) else {}
    tools = request.get("tools") or []
    return {t.get("name") or (t.get("function") or {}).get("name") for t in tools if isinstance(t, dict)} - {None}


def _valid(call: dict[str, Any], offered: set[str]) -> bool:
    parsed = ToolCall.model_validate(call)  # a record leaves out the default arguments ("{}")
    try:
        arguments = json.loads(parsed.arguments)
    except json.JSONDecodeError:
        return False
    return parsed.name in offered and isinstance(arguments, dict)


def session_stats(result: dict[str, Any], records: list[CallRecord]) -> SessionStats:
    tool_calls = valid = 0
    for record in records:
        calls = (record.output or {}).get("tool_calls") or []
        if calls:
            tool_calls += 1
            offered = offered_tools(record)
            valid += all(_valid(c, offered) for c in calls)
    return SessionStats(
        instance_id=result["instance_id"],
        reward=float(result["reward"]),
        masked=bool(result["mask_sample"]),
        failure_kind=result.get("failure_kind"),
        calls=len(records),
        tool_calls=tool_calls,
        valid_tool_calls=valid,
        generated_tokens=sum(len(r.sampled_token_ids) for r in records),
    )


class HarnessRollouts:
    """The Gym episodes of one Polar env (``polar_<harness>``) through the learner's proxy: the model choosing its
    own actions, or held to each task's script (the teacher of the warm-up)."""

    def __init__(
        self,
        env: str,
        proxy: ProxyClient,
        work_dir: Path,
        *,
        concurrency: int,
        timeout: float,
        session: dict[str, Any],
        on_timeout: str = "mask",
    ) -> None:
        common = {
            "env": env,
            "proxy_url": proxy.url,
            "proxy_admin_url": proxy.admin_url,
            "proxy_admin_token": proxy.admin_token,
            "concurrency": concurrency,
            "timeout": timeout,
            "session": session,
            "gateway": {"on_timeout": on_timeout},
        }
        self.episodes = {
            scripted: PolarEpisodes(
                PolarSettings.model_validate(
                    {**common, "scripted": scripted, "work_dir": work_dir / ("teacher" if scripted else "policy")}
                ),
                AGENT,
            )
            for scripted in (False, True)
        }

    def run(self, instances: list[SWEInstance], each: int, *, scripted: bool = False) -> list[Rollout]:
        """``each`` sessions of every instance, all submitted at once (the gateway's run slots pace them), in
        instance order."""
        return asyncio.run(self._run([learn_row(i) for i in instances for _ in range(each)], scripted))

    async def _run(self, rows: list[dict[str, Any]], scripted: bool) -> list[Rollout]:
        episodes = self.episodes[scripted]
        runs = (episodes.run(PolarRunRequest.model_validate(r)) for r in rows)
        results = await asyncio.gather(*runs, return_exceptions=True)
        return [
            self._failed(row, done) if isinstance(done, Exception) else self._rollout(done.model_dump(mode="json"))
            for row, done in zip(rows, results, strict=True)
        ]

    @staticmethod
    def _failed(row: dict[str, Any], exc: Exception) -> Rollout:
        """An episode whose result could not be built (a bug, as a Gym server would answer 500): masked, so one
        session never takes a step or a run down; the error stays in the stats."""
        stats = SessionStats(
            instance_id=row["instance_id"], reward=0.0, masked=True, failure_kind=f"polar:episode_error: {exc!r}"[:500],
            calls=0, tool_calls=0, valid_tool_calls=0, generated_tokens=0,
        )  # fmt: skip
        return Rollout(stats=stats, sample=None)

    @staticmethod
    def _rollout(result: dict[str, Any]) -> Rollout:
        records = AttemptDir(Path(result["session_dir"])).read_records() if result.get("session_dir") else []
        try:
            sample = nemo_rl_sample(result)
        except ValueError:  # no generation data: nothing NeMo-RL could train on either
            sample = None
        spans = [(r.started_at, r.finished_at) for r in records if r.finished_at is not None]
        stats = session_stats(result, records)
        return Rollout(stats=stats, sample=sample, session_dir=result.get("session_dir"), spans=spans)

    def close(self) -> None:
        for episodes in self.episodes.values():
            episodes.close()
