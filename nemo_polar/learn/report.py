"""Several seeds of ``polar learn``, a progress bar per step, and what a user reads afterwards: ``learn.json`` (held-out
reward before -> after per seed, its spread, the per-step curves) and ``learn.html`` (reward and the trainer/engine
logprob mismatch per step, one line per seed)."""

from __future__ import annotations

import base64
import html
import io
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from nemo_polar.learn.harness_loop import (
    HarnessLearnConfig,
    HarnessLearnResult,
    HarnessStep,
    WarmupResult,
    learn_through_harness,
)
from nemo_polar.learn.loop import LearnConfig, LearnResult, StepResult, learn
from nemo_polar.learn.rollouts import PhaseStats


class SeedSummary(BaseModel):
    seed: int
    held_out_before: float
    held_out_after: float
    gain: float
    reward_per_step: list[float]
    mismatch_per_step: list[float] = Field(description="mean |engine logprob - trainer logprob| on trained tokens")
    versions_per_step: list[list[int | None]]
    served_vs_trained: float
    served_vs_base: float
    wall_s: float


class LearnSummary(BaseModel):
    seeds: list[SeedSummary]
    mean_gain: float
    gain_spread: float = Field(description="max - min of the per-seed gains")
    before_spread: float = Field(description="max - min of the per-seed held-out rewards before training")
    outputs: dict[str, Path]


def summarise(result: LearnResult) -> SeedSummary:
    return SeedSummary(
        seed=result.config.seed,
        held_out_before=result.held_out_before,
        held_out_after=result.held_out_after,
        gain=result.held_out_after - result.held_out_before,
        reward_per_step=[s.reward_mean for s in result.steps],
        mismatch_per_step=[s.trainer["mean_abs_logprob_delta"] for s in result.steps],
        versions_per_step=[s.record_versions for s in result.steps],
        served_vs_trained=result.served.vs_trained,
        served_vs_base=result.served.vs_base,
        wall_s=result.wall_s,
    )


def run_seeds(configs: list[LearnConfig], out: Path) -> LearnSummary:
    out.mkdir(parents=True, exist_ok=True)
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[status]}"),
    )
    seeds = []
    with Progress(*columns) as progress:
        for cfg in configs:
            task = progress.add_task(f"learn seed {cfg.seed}", total=cfg.steps, status="held-out before…")

            def on_step(step: StepResult, task: int = task) -> None:
                status = f"reward {step.reward_mean:.2f} · |Δ| {step.trainer['mean_abs_logprob_delta']:.1e}"
                progress.update(task, advance=1, status=status)

            seeds.append(summarise(learn(cfg, on_step=on_step)))
            progress.update(task, status=f"held-out {seeds[-1].held_out_before:.2f} → {seeds[-1].held_out_after:.2f}")
    gains = [s.gain for s in seeds]
    befores = [s.held_out_before for s in seeds]
    outputs = {"json": out / "learn.json", "html": out / "learn.html"}
    summary = LearnSummary(
        seeds=seeds,
        mean_gain=statistics.fmean(gains),
        gain_spread=max(gains) - min(gains),
        before_spread=max(befores) - min(befores),
        outputs=outputs,
    )
    outputs["json"].write_text(summary.model_dump_json(indent=2))
    outputs["html"].write_text(render_html(summary))
    return summary


def curves_png(summary: LearnSummary) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (reward, mismatch) = plt.subplots(1, 2, figsize=(9, 3))
    for s in summary.seeds:
        steps = range(len(s.reward_per_step))
        reward.plot(steps, s.reward_per_step, marker="o", label=f"seed {s.seed} (rollouts)")
        reward.scatter([0, len(s.reward_per_step)], [s.held_out_before, s.held_out_after], marker="s")
        mismatch.plot(steps, s.mismatch_per_step, marker="o", label=f"seed {s.seed}")
    reward.set(title="reward per step (squares: held-out before/after)", xlabel="step (policy version)")
    mismatch.set(title="mean |engine − trainer logprob|", xlabel="step", yscale="log")
    reward.legend(fontsize=7)
    mismatch.legend(fontsize=7)
    return _png(fig)


def _png(fig: Any) -> str:
    """The figure as base64 PNG (inline in the HTML report), closed after."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _img(png: Callable[[], str]) -> str:
    """The plot as an inline image, or a line saying what it needs (matplotlib comes with the dev extras)."""
    try:
        return f"<img alt='learning curves' src='data:image/png;base64,{png()}'>"
    except ImportError:
        return "<p>(install matplotlib for the plot)</p>"


def harness_curves_png(summary: HarnessLearnSummary) -> str:
    """Per seed, over the run's points (base, RL start, each GRPO step's rollouts, RL end): the reward, the
    valid-tool-call rate and the tokens per session. Held-out points are squares, training rollouts circles."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.2))
    panels = (
        ("reward", "reward", "reward_per_step"),
        ("valid-tool-call rate", "valid_tool_call_rate", "valid_tool_call_rate_per_step"),
        ("tokens per session", "tokens_per_session", "tokens_per_session_per_step"),
    )
    for ax, (title, phase_key, step_key) in zip(axes, panels, strict=True):
        for s in summary.seeds:
            steps = getattr(s, step_key)
            line = ax.plot(range(1, len(steps) + 1), steps, marker="o", label=f"seed {s.seed} (GRPO rollouts)")
            held = [(-1, s.base), (0, s.warmed), (len(steps) + 1, s.final)]
            xs = [x for x, p in held if p is not None]
            ys = [getattr(p, phase_key) for _, p in held if p is not None]
            ax.scatter(xs, ys, marker="s", color=line[0].get_color())
        n = max((len(getattr(s, step_key)) for s in summary.seeds), default=0)
        ax.set_xticks(range(-1, n + 2), ["base", "start", *(str(i) for i in range(1, n + 1)), "end"])
        ax.set(title=title, xlabel="held-out (squares) and GRPO step rollouts (circles)")
        ax.legend(fontsize=7)
    return _png(fig)


def render_harness_html(summary: HarnessLearnSummary) -> str:
    cells = "".join(
        f"<tr><td>{s.seed}</td><td>{s.base.reward if s.base else float('nan'):.3f}</td>"
        f"<td>{s.held_out_before:.3f}</td><td>{s.held_out_after:.3f}</td><td>{s.gain:+.3f}</td>"
        f"<td>{s.warmed.valid_tool_call_rate:.2f} → {s.final.valid_tool_call_rate:.2f}</td><td>{s.wall_s:.0f}</td></tr>"
        for s in summary.seeds
    )
    plot = _img(lambda: harness_curves_png(summary))
    teacher = summary.seeds[0].teacher if summary.seeds else None
    return (
        f"<!doctype html><meta charset=utf-8><title>polar learn · {html.escape(summary.harness)}</title>"
        f"<h1>polar learn through {html.escape(summary.harness)}</h1>"
        f"<p>held-out gain during RL {summary.mean_gain:+.3f} (mean), spread across seeds {summary.gain_spread:.3f}"
        f"</p><table border=1 cellpadding=4><tr><th>seed</th><th>base</th><th>RL start</th><th>RL end</th>"
        f"<th>gain</th><th>valid-tool-call rate</th><th>wall s</th></tr>{cells}</table>{plot}"
        f"<p>warm-up teacher: {html.escape(teacher or 'none')}</p>"
    )


def render_html(summary: LearnSummary) -> str:
    rows = "".join(
        f"<tr><td>{s.seed}</td><td>{s.held_out_before:.3f}</td><td>{s.held_out_after:.3f}</td><td>{s.gain:+.3f}</td>"
        f"<td>{s.served_vs_trained:.1e}</td><td>{s.served_vs_base:.1e}</td><td>{s.wall_s:.0f}</td></tr>"
        for s in summary.seeds
    )
    plot = _img(lambda: curves_png(summary))
    return (
        "<!doctype html><meta charset=utf-8><title>polar learn</title><h1>polar learn</h1>"
        f"<p>mean held-out gain {summary.mean_gain:+.3f}, spread of gains {summary.gain_spread:.3f}</p>"
        "<table border=1 cellpadding=4><tr><th>seed</th><th>held-out before</th><th>after</th><th>gain</th>"
        "<th>served vs trained |Δ|</th><th>served vs base |Δ|</th><th>wall s</th></tr>"
        f"{rows}</table>{plot}<p>{html.escape('A check of the data path, not a replacement for NeMo-RL.')}</p>"
    )


class HarnessSeedSummary(BaseModel):
    """One seed through the CLI: the held-out tasks before the warm-up, at the start of RL and at its end, and
    the per-step curves a user wants (reward, valid-tool-call rate, tokens per session)."""

    seed: int
    harness: str
    base: PhaseStats | None
    warmed: PhaseStats
    final: PhaseStats
    held_out_before: float = Field(description="held-out reward at the start of RL (after any warm-up)")
    held_out_after: float = Field(description="held-out reward at the end of RL")
    gain: float
    reward_per_step: list[float]
    valid_tool_call_rate_per_step: list[float]
    tokens_per_session_per_step: list[float]
    teacher: str | None
    wall_s: float


class HarnessLearnSummary(BaseModel):
    harness: str
    seeds: list[HarnessSeedSummary]
    mean_gain: float
    gain_spread: float = Field(description="max - min of the per-seed gains during RL")
    outputs: dict[str, Path]


def summarise_harness(result: HarnessLearnResult) -> HarnessSeedSummary:
    return HarnessSeedSummary(
        seed=result.config.seed,
        harness=result.harness,
        base=result.base,
        warmed=result.warmed,
        final=result.final,
        held_out_before=result.held_out_before,
        held_out_after=result.held_out_after,
        gain=result.held_out_after - result.held_out_before,
        reward_per_step=[s.rollouts.reward for s in result.steps],
        valid_tool_call_rate_per_step=[s.rollouts.valid_tool_call_rate for s in result.steps],
        tokens_per_session_per_step=[s.rollouts.tokens_per_session for s in result.steps],
        teacher=result.warmup.teacher if result.warmup else None,
        wall_s=result.wall_s,
    )


def run_harness_seeds(configs: list[HarnessLearnConfig], out: Path) -> HarnessLearnSummary:
    """Each seed in turn, a line per phase; OUT/learn.json keeps every seed's summary."""
    out.mkdir(parents=True, exist_ok=True)
    seeds = []
    for cfg in configs:

        def phase(name: str, value: Any, seed: int = cfg.seed) -> None:
            shown = f"reward {value.reward:.2f}" if isinstance(value, PhaseStats) else "skipped"
            if isinstance(value, HarnessStep):
                shown = f"step {value.step}: reward {value.rollouts.reward:.2f}"
            elif isinstance(value, WarmupResult):
                shown = f"{value.accepted} of {value.sessions} teacher sessions accepted, {len(value.steps)} SFT steps"
            print(f"seed {seed} · {name}: {shown}", flush=True)

        seeds.append(summarise_harness(learn_through_harness(cfg, on_phase=phase)))
    gains = [s.gain for s in seeds]
    summary = HarnessLearnSummary(
        harness=configs[0].harness,
        seeds=seeds,
        mean_gain=statistics.fmean(gains),
        gain_spread=max(gains) - min(gains),
        outputs={"json": out / "learn.json", "html": out / "learn.html"},
    )
    summary.outputs["json"].write_text(summary.model_dump_json(indent=2))
    summary.outputs["html"].write_text(render_harness_html(summary))
    return summary
