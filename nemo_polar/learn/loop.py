"""``polar learn``: GRPO on the project's own traces, the whole way through its real parts.

Each step: sample prompts from the training pool; for each, ``generations`` sessions through the proxy (one chat
call each, sent as any OpenAI client would); reward each session's reply with the task's checker; fetch the
session's records, prefix-merge them into traces, and give every trace its session's GRPO advantage (the rows the
Gym agent returns to NeMo-RL); one trainer step on those rows (``grpo_worker``); then the weight sync: the proxy
pauses (in-flight calls drain, new ones wait), the engine reloads the new checkpoint in place, and the proxy resumes
with the next policy version, which every later record carries. Held-out prompts are scored before the first step
and after the last.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import random
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from nemo_polar.engine.launcher import resolve_model
from nemo_polar.env.runtime.verdict import VerdictPolicy, cross_version
from nemo_polar.learn.tasks import Task, split
from nemo_polar.learn.trainer import TrainerProcess, start_engine, sync_weights
from nemo_polar.proxy.http.client import ProxyClient, thread_client
from nemo_polar.proxy.http.config import ProxyConfig
from nemo_polar.proxy.http.serve import ProxyServer
from nemo_polar.proxy.store.records import CallRecord
from nemo_polar.reconstruct.builders import prefix_merging
from nemo_polar.reconstruct.trace import Trace
from nemo_polar.rewards.advantages import assign, group_advantages

FOLLOW_UP = "Answer with only the number."
EVAL_PHASE = 100_000  # request seeds of the held-out evaluations (steps use their index)
STRADDLE_PHASE = 200_000  # request seeds of the sessions that span a sync


class LearnConfig(BaseModel):
    model: str = "smollm2-135m-instruct"
    out: Path = Path("runs/learn")
    seed: int = 0
    steps: int = Field(default=12, ge=1)
    prompts_per_step: int = Field(default=8, ge=1)
    generations: int = Field(default=8, ge=2, description="sessions per prompt: a GRPO group")
    held_out: int = Field(default=32, ge=1, description="held-out prompts, disjoint from the training pool")
    eval_samples: int = Field(default=4, ge=1, description="sessions per held-out prompt")
    max_tokens: int = Field(default=16, ge=1)
    temperature: float = 1.0
    lr: float = 2e-5
    clip: float = 0.2
    concurrency: int = Field(default=32, ge=1)
    # fp32 on CPU: the trainer computes in fp32, and CPUs without native bf16 run an fp32 engine ~4x faster.
    engine_dtype: str | None = "float32"
    cross_version: Literal["keep", "mask"] = Field(
        default="mask",
        description="sessions spanning a weight sync: mask (the trainer here applies no importance correction, so "
        "tokens of the previous version would be trained as on-policy) or keep",
    )


class Sample(BaseModel):
    task_id: str
    session_id: str
    reply: str
    reward: float
    records: list[CallRecord]

    @classmethod
    def of(cls, task: Task, session_id: str, reply: str, records: list[CallRecord]) -> Sample:
        """The session's reward is the checker's verdict on its last reply."""
        return cls(task_id=task.task_id, session_id=session_id, reply=reply, reward=task.reward(reply), records=records)


class Straddle(BaseModel):
    task: Task
    session_id: str
    key: str
    messages: list[dict[str, str]]


class CarriedSession(BaseModel):
    """The step's session that spans the weight sync after it: its first call sampled by this step's version, its
    second by the next. The cross-version rule (``env.verdict.cross_version``) decides whether it is trained on:
    masked, it still goes to the trainer with ``sample_mask`` 0 (NeMo-RL's ``loss_multiplier``)."""

    session_id: str
    record_versions: list[int | None]
    trace_versions: list[list[int]]
    verdict: str = Field(description="'cross_version' when the rule masks it, else 'trainable'")
    sample_mask: int


class StepResult(BaseModel):
    step: int
    policy_version: int = Field(description="the version that sampled this step's rollouts")
    record_versions: list[int | None] = Field(description="distinct policy versions on the step's records")
    reward_mean: float
    groups_with_signal: int = Field(description="groups whose rewards differ (non-zero advantages)")
    traces: int
    trainer: dict[str, Any]
    carried: CarriedSession | None = Field(default=None, description="the session spanning this step's sync")
    rollout_s: float
    train_s: float
    sync_s: float


class ServedProbe(BaseModel):
    """Which weights the engine serves after the last sync: one held-out reply the engine sampled through the proxy,
    scored by the trainer's final weights and by the base model (mean |engine logprob - trainer logprob|)."""

    tokens: int
    vs_trained: float
    vs_base: float


class LearnResult(BaseModel):
    config: LearnConfig
    held_out_before: float
    held_out_after: float
    steps: list[StepResult]
    served: ServedProbe
    wall_s: float


def rows(traces: list[Trace], sample_mask: int = 1) -> list[dict[str, Any]]:
    """Trainer rows from traces: the whole sequence, the policy's own tokens as the mask, the engine's logprobs and
    the session's advantage. The loss is token-level (a sum over the batch's policy tokens over their count,
    NeMo-RL's ``token_level_loss``), and each sampled token is trainable in exactly one trace, so the advantage goes
    unscaled: a session split per request then trains as the same session merged (the same gradient). The traces'
    ``weight`` (1/N per session) is for a loss that averages per sample; side calls (weight 0) are not trained."""
    out = []
    for t in traces:
        if t.advantage is None:
            raise ValueError(f"trace {t.trace_id} has no advantage")
        if t.role == "side":
            continue
        context = [0] * len(t.prompt_ids)
        out.append(
            {
                "input_ids": t.prompt_ids + t.response_ids,
                "token_mask": context + t.loss_mask,
                "generation_logprobs": [0.0] * len(t.prompt_ids) + [lp or 0.0 for lp in t.logprobs],
                "advantage": t.advantage,
                "sample_mask": sample_mask,
            }
        )
    return out


class Learner:
    def __init__(self, cfg: LearnConfig, proxy: ProxyClient, served: str) -> None:
        self.cfg = cfg
        self.proxy = proxy
        self.served = served

    def chat(self, key: str, messages: list[dict[str, str]], seed: int) -> str:
        """One chat call through the proxy, as an OpenAI client sends it. ``seed`` makes the engine's sampling of
        this request reproducible (vLLM seeds each request's generator)."""
        body = {
            "model": self.served,
            "messages": messages,
            "temperature": self.cfg.temperature,
            "max_tokens": self.cfg.max_tokens,
            "seed": seed,
        }
        headers = {"authorization": f"Bearer {key}"}  # on this thread's client (thread_client: one pool per thread)
        resp = thread_client().post(f"{self.proxy.url}/v1/chat/completions", json=body, headers=headers, timeout=600)
        if resp.is_error:  # the proxy's own words say which part failed (engine, prompt check, session)
            raise RuntimeError(f"the proxy answered {resp.status_code}: {resp.text[:1000]}")
        return resp.json()["choices"][0]["message"]["content"] or ""

    def attempt(self, task: Task, seed: int) -> Sample:
        """One session of one call."""
        session_id, key = self.proxy.create_session({"metadata": {"task_id": task.task_id}})
        try:
            reply = self.chat(key, [{"role": "user", "content": task.prompt}], seed)
            records = self.proxy.records(session_id)
        finally:
            self.proxy.close(session_id)
        return Sample.of(task, session_id, reply, records)

    def begin_straddle(self, task: Task, seed: int) -> Straddle:
        """The first call of a two-call session that will span the coming weight sync."""
        session_id, key = self.proxy.create_session({"metadata": {"task_id": task.task_id, "straddle": True}})
        messages = [{"role": "user", "content": task.prompt}]
        messages.append({"role": "assistant", "content": self.chat(key, messages, seed)})
        return Straddle(task=task, session_id=session_id, key=key, messages=messages)

    def end_straddle(self, straddle: Straddle, seed: int) -> Sample:
        """Its second call, after the sync: sampled by the next version."""
        try:
            messages = [*straddle.messages, {"role": "user", "content": FOLLOW_UP}]
            reply = self.chat(straddle.key, messages, seed)
            records = self.proxy.records(straddle.session_id)
        finally:
            self.proxy.close(straddle.session_id)
        return Sample.of(straddle.task, straddle.session_id, reply, records)

    def attempts(self, tasks: list[Task], each: int, phase: int) -> list[Sample]:
        """``each`` sessions per task, all at once; request seeds differ per (run seed, phase, sample)."""
        chosen = [t for t in tasks for _ in range(each)]
        seeds = [self.request_seed(phase, i) for i in range(len(chosen))]
        with cf.ThreadPoolExecutor(self.cfg.concurrency) as pool:
            return list(pool.map(self.attempt, chosen, seeds))

    def request_seed(self, phase: int, index: int) -> int:
        return (self.cfg.seed * 1_000_003 + phase) * 10_007 + index

    def evaluate(self, tasks: list[Task], phase: int) -> float:
        samples = self.attempts(tasks, self.cfg.eval_samples, phase)
        return sum(s.reward for s in samples) / len(samples)


def build_batch(samples: list[Sample]) -> tuple[list[Trace], int]:
    """Prefix-merged traces of every session with its group's GRPO advantage; also how many groups carry signal."""
    groups: dict[str, dict[str, float]] = {}
    for s in samples:
        groups.setdefault(s.task_id, {})[s.session_id] = s.reward
    traces: list[Trace] = []
    for s in samples:
        traces += prefix_merging(s.records).traces
    rewards = {sid: r for g in groups.values() for sid, r in g.items()}
    advantages = {sid: a for g in groups.values() for sid, a in group_advantages(g).items()}
    assign(traces, rewards, advantages)
    signal = sum(len(set(g.values())) > 1 for g in groups.values())
    return traces, signal


def learn(cfg: LearnConfig, on_step: Any = None) -> LearnResult:
    start = time.monotonic()
    cfg.out.mkdir(parents=True, exist_ok=True)
    model_dir, served, _ = resolve_model(cfg.model)
    train_pool, held_out = split(cfg.seed, cfg.held_out)
    rng = random.Random(cfg.seed)
    engine, engine_url = start_engine(cfg.model, cfg.engine_dtype, cfg.out)
    trainer = TrainerProcess(cfg.out / "trainer.log")
    try:
        trainer.call("init", model_dir=str(model_dir), lr=cfg.lr, seed=cfg.seed, loss={"clip_min": cfg.clip})
        proxy_cfg = ProxyConfig(engine_url=engine_url, record_dir=cfg.out / "records", policy_version=0)
        with ProxyServer(proxy_cfg) as server:
            learner = Learner(cfg, server.client(), served)
            before = learner.evaluate(held_out, phase=EVAL_PHASE)
            steps: list[StepResult] = []
            policy = VerdictPolicy(cross_version=cfg.cross_version)
            carried_rows: list[dict[str, Any]] = []
            for step in range(cfg.steps):
                version = step
                t0 = time.monotonic()
                tasks = rng.sample(train_pool, cfg.prompts_per_step)
                samples = learner.attempts(tasks, cfg.generations, phase=step)
                traces, signal = build_batch(samples)
                straddle = learner.begin_straddle(tasks[0], learner.request_seed(STRADDLE_PHASE + step, 0))
                batch = cfg.out / "batches" / f"step-{step:03d}.jsonl"
                batch.parent.mkdir(parents=True, exist_ok=True)
                batch.write_text("".join(json.dumps(r) + "\n" for r in rows(traces) + carried_rows))
                t1 = time.monotonic()
                checkpoint = cfg.out / "weights" / f"v{version + 1}"
                metrics = trainer.call("step", batch=str(batch), out_dir=str(checkpoint))
                t2 = time.monotonic()
                sync_weights(learner.proxy, engine_url, checkpoint, version + 1)
                sync_s = time.monotonic() - t2
                done = learner.end_straddle(straddle, learner.request_seed(STRADDLE_PHASE + step, 1))
                carried, carried_rows = carry(done, policy)
                result = StepResult(
                    step=step,
                    policy_version=version,
                    record_versions=versions_of(r for s in samples for r in s.records),
                    reward_mean=sum(s.reward for s in samples) / len(samples),
                    groups_with_signal=signal,
                    traces=len(traces),
                    trainer=metrics,
                    carried=carried,
                    rollout_s=t1 - t0,
                    train_s=t2 - t1,
                    sync_s=sync_s,
                )
                steps.append(result)
                if on_step is not None:
                    on_step(result)
            # The same request seeds as before: a paired comparison.
            after = learner.evaluate(held_out, phase=EVAL_PHASE)
            served = probe(learner.attempt(held_out[0], seed=cfg.seed).records[-1], trainer, model_dir)
    finally:
        trainer.close()
        engine.stop()
    result = LearnResult(
        config=cfg,
        held_out_before=before,
        held_out_after=after,
        steps=steps,
        served=served,
        wall_s=time.monotonic() - start,
    )
    (cfg.out / "learn.json").write_text(result.model_dump_json(indent=2))
    return result


def versions_of(records: Iterable[CallRecord]) -> list[int | None]:
    return sorted({r.policy_version for r in records}, key=lambda v: (v is None, v or 0))


def carry(sample: Sample, policy: VerdictPolicy) -> tuple[CarriedSession, list[dict[str, Any]]]:
    """A session that spans a sync, judged by the cross-version rule; its rows for the next step's batch. Alone in
    its group, its GRPO advantage is 0: it is there to be tagged and handled, not to move the policy."""
    build = prefix_merging(sample.records)
    masked = cross_version(build, policy, sample.reward)
    assign(build.traces, {sample.session_id: sample.reward}, group_advantages({sample.session_id: sample.reward}))
    summary = CarriedSession(
        session_id=sample.session_id,
        record_versions=versions_of(sample.records),
        trace_versions=[t.policy_versions for t in build.traces],
        verdict=masked.kind if masked else "trainable",
        sample_mask=0 if masked else 1,
    )
    return summary, rows(build.traces, summary.sample_mask)


def probe(record: CallRecord, trainer: TrainerProcess, base: Path) -> ServedProbe:
    sequence = record.prompt_token_ids + record.sampled_token_ids
    first = len(record.prompt_token_ids) - 1  # position t scores token t + 1

    def gap(model_dir: str | None) -> float:
        scored = trainer.call("score", sequences=[sequence], model_dir=model_dir)["logprobs"][0][first:]
        return sum(abs(a - b) for a, b in zip(scored, record.sampled_logprobs, strict=True)) / len(scored)

    return ServedProbe(tokens=len(record.sampled_token_ids), vs_trained=gap(None), vs_base=gap(str(base)))
