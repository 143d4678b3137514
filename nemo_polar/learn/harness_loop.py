"""``polar learn --harness NAME``: GRPO whose every rollout is a session of the unchanged CLI.

One seed, in order (all through one engine, one proxy and one trainer process):

1. **base**: the held-out tasks, the base model choosing its own actions through the CLI;
2. **warm-up** (the paper's second use, rejection sampling): the teacher's sessions on training tasks through the
   same CLI, graded; the accepted ones become SFT rows and the trainer takes ``warmup_steps`` supervised steps on
   them. No model larger than the policy runs here, so each task's script stands in as the teacher (the report
   says so). No held-out task is in the warm-up data;
3. **RL start**: the held-out tasks again (``held_out_before``);
4. **GRPO**: per step, ``groups_per_step`` training tasks × ``generations`` sessions (a group each), the graded
   rewards' group advantages on the rows NeMo-RL would build from the Gym results (masked results train with
   ``loss_multiplier`` 0), one trainer step, and the weight sync (proxy pause, in-place reload, resume with the next
   policy version);
5. **RL end**: the held-out tasks (``held_out_after``).

With ``staleness: 1`` GRPO runs as the paper's async pipeline: step ``n + 1``'s sessions run while the trainer takes
step ``n``, so the weight sync lands in the middle of them (their calls carry either version; the verdict keeps such
sessions, ``cross_version: keep``) and each token is weighted by ``exp(trainer - behaviour)`` against the logprob the
proxy recorded for it, truncated (NeMo-RL's ``tis`` with cap 2.0 by default; see ``grpo_worker``).

Each phase reports the reward, the valid-tool-call rate and the tokens per session. The task family is
:mod:`nemo_polar.learn.lookup_tasks`: its reward needs the harness's own read and edit tools.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from nemo_polar.engine.launcher import resolve_model
from nemo_polar.env.gym.nemo_rl import trainer_row
from nemo_polar.env.harness import HARNESSES
from nemo_polar.learn.lookup_tasks import write_task_repo
from nemo_polar.learn.rollouts import HarnessRollouts, PhaseStats, Rollout, busy_fraction
from nemo_polar.learn.trainer import TrainerProcess, start_engine, sync_weights
from nemo_polar.proxy.http.config import ProxyConfig
from nemo_polar.proxy.http.serve import ProxyServer
from nemo_polar.reconstruct.export import write_jsonl
from nemo_polar.rewards.advantages import group_advantages

TEACHER = "each task's script, forced token by token through the same CLI (no larger model runs here)"


class HarnessLearnConfig(BaseModel):
    harness: str = "pi"
    model: str = "smollm2-135m-instruct"
    out: Path = Path("runs/learn")
    seed: int = 0
    task_seed: int = Field(default=0, description="the task family's draw (the same for every seed)")
    train_tasks: int = Field(default=24, ge=1)
    held_out: int = Field(default=12, ge=1)
    eval_samples: int = Field(default=2, ge=1, description="sessions per held-out task in each evaluation")
    base_eval: bool = Field(default=True, description="evaluate the base model before the warm-up")
    warmup_tasks: int = Field(default=12, ge=0, description="training tasks the teacher attempts once each")
    warmup_steps: int = Field(default=4, ge=0)
    warmup_lr: float = 1e-4
    steps: int = Field(default=4, ge=0, description="GRPO steps")
    groups_per_step: int = Field(default=4, ge=1)
    generations: int = Field(default=4, ge=2, description="sessions per task: a GRPO group")
    lr: float = 3e-5
    clip: float = 0.2
    max_tokens: int = Field(default=96, ge=1, description="the cap on each model call the CLI makes")
    temperature: float = 1.0
    concurrency: int = Field(default=8, ge=1, description="CLI sessions at once")
    timeout: float = Field(default=90.0, gt=0, description="seconds for one CLI run")
    staleness: int = Field(
        default=0,
        ge=0,
        le=1,
        description="0: each step's sessions run by the weights it trains; 1: async, step n+1's sessions run while "
        "step n trains (the paper's pipeline), with truncated importance sampling",
    )
    truncation: Literal["tis", "icepop", "seq-mask-tis"] = Field(
        default="tis", description="how async GRPO truncates its importance weights (NeMo-RL's types)"
    )
    truncation_max: float = Field(default=2.0, gt=0, description="the importance weights' cap")
    truncation_min: float | None = Field(default=None, description="their floor (icepop, seq-mask-tis)")
    on_timeout: Literal["mask", "grade"] = Field(
        default="grade",
        description="a session that loops past its time is graded on the workspace it left (VerdictPolicy.on_timeout)",
    )
    engine_dtype: str | None = "float32"

    def model_post_init(self, context: Any) -> None:
        if self.harness not in HARNESSES:
            raise ValueError(f"unknown harness {self.harness!r}; choose one of {', '.join(HARNESSES)}")
        if self.warmup_tasks > self.train_tasks:
            raise ValueError(f"warmup_tasks ({self.warmup_tasks}) exceeds train_tasks ({self.train_tasks})")


class WarmupResult(BaseModel):
    teacher: str = TEACHER
    sessions: int
    accepted: int
    rows: int
    steps: list[dict[str, Any]]
    s: float


class HarnessStep(BaseModel):
    step: int
    policy_version: int = Field(description="the engine's version when the step's sessions started")
    rollouts: PhaseStats
    groups_with_signal: int
    trainer: dict[str, Any]
    sessions: list[str] = Field(description="the step's attempt directories, in group order")
    rollout_s: float
    wait_s: float = Field(description="how long the step waited for its sessions after the previous step's sync")
    train_s: float
    sync_s: float


class Collected(BaseModel):
    """One step's finished sessions."""

    done: list[Rollout]
    version: int
    s: float


class HarnessLearnResult(BaseModel):
    config: HarnessLearnConfig
    harness: str
    base: PhaseStats | None
    warmed: PhaseStats = Field(description="the held-out tasks at the start of RL (after the warm-up)")
    final: PhaseStats = Field(description="the held-out tasks at the end of RL")
    held_out_before: float = Field(description="held-out reward at the start of RL")
    held_out_after: float = Field(description="held-out reward at the end of RL")
    warmup: WarmupResult | None
    steps: list[HarnessStep]
    grpo_s: float = Field(description="the GRPO steps' wall time, first session to last sync")
    engine_busy: float = Field(description="share of the GRPO steps' wall time in which the engine served a call")
    wall_s: float


def grpo_rows(rollouts: list[Rollout], group_of: list[str]) -> tuple[list[dict[str, Any]], int]:
    """The trainer rows of a step: each group's advantages over its unmasked sessions (reward minus the group's
    mean) on the row NeMo-RL builds from each result; masked sessions go with ``sample_mask`` 0. Also how many
    groups carry signal (rewards that differ)."""
    groups: dict[str, dict[int, float]] = {}
    for i, (r, group) in enumerate(zip(rollouts, group_of, strict=True)):
        if not r.stats.masked:
            groups.setdefault(group, {})[i] = r.stats.reward
    advantages = {i: a for g in groups.values() for i, a in group_advantages(g).items()}  # type: ignore[arg-type]
    rows = [trainer_row(r.sample, advantages.get(i, 0.0)) for i, r in enumerate(rollouts) if r.sample is not None]
    return rows, sum(len(set(g.values())) > 1 for g in groups.values())


def pipelined(
    plan: list[list[Any]],
    collect: Callable[[list[Any]], Collected],
    train: Callable[[int, list[Any], Collected, float], HarnessStep],
    staleness: int,
) -> Iterator[HarnessStep]:
    """Each step's sessions collected (in a worker thread), then trained on (here, sync included). With
    ``staleness`` 1 the next step's sessions start before this step trains: generation overlaps training and the
    weight sync lands while they run. With 0 they start after the sync."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollouts") as pool:
        pending: Future[Collected] | None = pool.submit(collect, plan[0]) if plan else None
        for step, tasks in enumerate(plan):
            assert pending is not None
            t0 = time.monotonic()
            collected = pending.result()
            wait_s = time.monotonic() - t0
            following = plan[step + 1] if step + 1 < len(plan) else None
            pending = pool.submit(collect, following) if following and staleness else None
            yield train(step, tasks, collected, wait_s)
            if following and pending is None:
                pending = pool.submit(collect, following)


class Learner:
    """The running parts of one seed and the phases over them."""

    def __init__(self, cfg: HarnessLearnConfig, engine_url: str, trainer: TrainerProcess, server: ProxyServer) -> None:
        self.cfg, self.engine_url, self.trainer = cfg, engine_url, trainer
        self.proxy = server.client()
        session = {"sampling_overrides": {"max_tokens": cfg.max_tokens, "temperature": cfg.temperature}}
        self.rollouts = HarnessRollouts(
            f"polar_{cfg.harness}",
            self.proxy,
            cfg.out / "sessions",
            concurrency=cfg.concurrency,
            timeout=cfg.timeout,
            session=session,
            on_timeout=cfg.on_timeout,
        )
        self.version = 0
        self.spans: list[tuple[float, float]] = []  # the GRPO sessions' model calls (engine_busy)

    def sync(self, checkpoint: Path) -> float:
        """The weight sync: in-flight calls drain, the engine reloads in place, later calls carry the new version."""
        t0 = time.monotonic()
        self.version += 1
        sync_weights(self.proxy, self.engine_url, checkpoint, self.version)
        return time.monotonic() - t0

    def checkpoint(self) -> Path:
        return self.cfg.out / "weights" / f"v{self.version + 1}"

    def warmup(self, tasks: list[Any]) -> WarmupResult:
        t0 = time.monotonic()
        done = self.rollouts.run(tasks, 1, scripted=True)
        accepted = [r for r in done if not r.stats.masked and r.stats.reward == 1.0 and r.sample is not None]
        rows = [trainer_row(r.sample, 0.0) for r in accepted if r.sample is not None]
        steps = []
        if rows and self.cfg.warmup_steps:
            batch = self.cfg.out / "batches" / "warmup.jsonl"
            write_jsonl(rows, batch)
            for _ in range(self.cfg.warmup_steps):
                steps.append(self.trainer.call("sft_step", batch=str(batch), out_dir=str(self.checkpoint())))
            self.sync(self.checkpoint())  # the warmed-up weights are version 1: RL starts from them
            self.trainer.call("optimizer", lr=self.cfg.lr)  # GRPO starts a new stage
        elapsed = time.monotonic() - t0
        return WarmupResult(sessions=len(done), accepted=len(accepted), rows=len(rows), steps=steps, s=elapsed)

    def evaluate(self, held_out: list[Any]) -> PhaseStats:
        return PhaseStats.of(self.rollouts.run(held_out, self.cfg.eval_samples))

    def collect(self, tasks: list[Any]) -> Collected:
        """A step's groups: ``generations`` sessions of each task."""
        t0, version = time.monotonic(), self.version
        done = self.rollouts.run(tasks, self.cfg.generations)
        self.spans += [span for r in done for span in r.spans]
        return Collected(done=done, version=version, s=time.monotonic() - t0)

    def grpo_steps(self, plan: list[list[Any]]) -> Iterator[HarnessStep]:
        """The GRPO steps over ``plan`` (each step's tasks), pipelined as ``staleness`` says."""
        return pipelined(plan, self.collect, self.train, self.cfg.staleness)

    def train(self, step: int, tasks: list[Any], collected: Collected, wait_s: float) -> HarnessStep:
        """The step's rows, one trainer step and the weight sync."""
        done = collected.done
        rows, signal = grpo_rows(done, [t.instance_id for t in tasks for _ in range(self.cfg.generations)])
        t1 = time.monotonic()
        batch = self.cfg.out / "batches" / f"step-{step:03d}.jsonl"
        write_jsonl(rows, batch)
        trainable = any(r["sample_mask"] and r["advantage"] for r in rows)
        metrics = self.trainer.call("step", batch=str(batch), out_dir=str(self.checkpoint())) if trainable else {}
        t2 = time.monotonic()
        sync_s = self.sync(self.checkpoint()) if trainable else 0.0
        return HarnessStep(
            step=step,
            policy_version=collected.version,
            rollouts=PhaseStats.of(done),
            groups_with_signal=signal,
            trainer=metrics,
            sessions=[r.session_dir or "" for r in done],
            rollout_s=collected.s,
            wait_s=wait_s,
            train_s=t2 - t1,
            sync_s=sync_s,
        )

    def close(self) -> None:
        self.rollouts.close()


def learn_through_harness(
    cfg: HarnessLearnConfig, on_phase: Callable[[str, Any], None] | None = None
) -> HarnessLearnResult:
    start = time.monotonic()
    report = on_phase or (lambda name, value: None)
    cfg.out.mkdir(parents=True, exist_ok=True)
    splits = write_task_repo(cfg.out / "tasks", cfg.task_seed, cfg.train_tasks, cfg.held_out)
    train, held_out = splits["train"], splits["held_out"]
    rng = random.Random(cfg.seed)
    model_dir, _, _ = resolve_model(cfg.model)
    engine, engine_url = start_engine(cfg.model, cfg.engine_dtype, cfg.out)
    trainer = TrainerProcess(cfg.out / "trainer.log")
    try:
        lr = cfg.warmup_lr if cfg.warmup_steps and cfg.warmup_tasks else cfg.lr
        loss: dict[str, Any] = {"clip_min": cfg.clip, "clip_max": cfg.clip}
        if cfg.staleness:  # the behaviour policy may be a version behind the trainer's
            loss |= {"importance_sampling": True, "truncation": cfg.truncation}
            loss |= {"truncation_max": cfg.truncation_max, "truncation_min": cfg.truncation_min}
        trainer.call("init", model_dir=str(model_dir), lr=lr, seed=cfg.seed, loss=loss)
        # The CLIs are told to use "local-model" (PolarSettings.model): the proxy maps it to the served model.
        proxy_cfg = ProxyConfig(
            engine_url=engine_url, record_dir=cfg.out / "records", policy_version=0, model_aliases=["local-model"]
        )
        with ProxyServer(proxy_cfg) as server:
            learner = Learner(cfg, engine_url, trainer, server)
            try:
                base = learner.evaluate(held_out) if cfg.base_eval else None
                report("base", base)
                warm_tasks = rng.sample(train, cfg.warmup_tasks) if cfg.warmup_tasks else []
                warmup = learner.warmup(warm_tasks) if warm_tasks else None
                report("warmup", warmup)
                warmed = learner.evaluate(held_out)
                report("warmed", warmed)
                steps = []
                plan = [rng.sample(train, cfg.groups_per_step) for _ in range(cfg.steps)]
                grpo_start = time.time()
                for harness_step in learner.grpo_steps(plan):
                    steps.append(harness_step)
                    report("step", harness_step)
                grpo_end = time.time()
                engine_busy = busy_fraction(learner.spans, grpo_start, grpo_end)
                final = learner.evaluate(held_out)
                report("final", final)
            finally:
                learner.close()
    finally:
        trainer.close()
        engine.stop()
    result = HarnessLearnResult(
        config=cfg,
        harness=cfg.harness,
        base=base,
        warmed=warmed,
        final=final,
        held_out_before=warmed.reward,
        held_out_after=final.reward,
        warmup=warmup,
        steps=steps,
        grpo_s=grpo_end - grpo_start,
        engine_busy=engine_busy,
        wall_s=time.monotonic() - start,
    )
    (cfg.out / "learn.json").write_text(result.model_dump_json(indent=2))
    return result
