"""The paper's Fig. 5 with a real trainer, side by side in one run (same seed, same tasks, same starting weights):

- **per_request vs prefix_merging**: the sessions of one GRPO step of a sync run, their trainer rows built both
  ways, each batch one step of the real trainer from the same weights: rows (the paper's "trainer updates"),
  row tokens, trainer seconds, and whether both give the same loss and gradient norm (they must: every sampled
  token is trained once either way, the loss is token-level);
- **sync vs async**: the harness loop's GRPO steps run both ways (``staleness`` 0 and 1, everything else equal):
  wall time per step and the share of it in which the engine served at least one call (the paper's GPU
  utilisation, 20.4% -> 87.7% with its async pipeline).

The paper's figures (Polar, Fig. 5, 3 training steps): 1,185 -> 218 trainer updates (5.4x), 189.5 -> 35.2 min
(5.4x), engine utilisation 20.4% -> 87.7% (4.3x). ``--from SYNC ASYNC`` reads two finished ``polar learn --harness``
seed directories instead of running them.

    python -m bench.learn_ablation [--out runs/learn-ablation] [--seed 0] [--steps 3] [--from SYNC ASYNC]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from bench.common import report
from nemo_polar.engine.launcher import resolve_model
from nemo_polar.env.runtime.attempt import AttemptDir
from nemo_polar.learn.harness_loop import HarnessLearnConfig, HarnessLearnResult, learn_through_harness
from nemo_polar.learn.loop import rows
from nemo_polar.learn.trainer import TrainerProcess
from nemo_polar.reconstruct.builders import per_request, prefix_merging
from nemo_polar.reconstruct.export import write_jsonl
from nemo_polar.rewards.advantages import assign, group_advantages

PAPER = {"updates": 1185 / 218, "minutes": 189.5 / 35.2, "utilisation": 87.7 / 20.4}


def loop_config(out: Path, seed: int, steps: int, staleness: int) -> HarnessLearnConfig:
    """The loop both ways: the warm-up the policy needs to call tools at all, short evaluations, ``steps`` steps."""
    return HarnessLearnConfig(
        out=out, seed=seed, steps=steps, staleness=staleness, base_eval=False, held_out=4, eval_samples=1,
        warmup_tasks=8,
    )  # fmt: skip


def step_batches(run: HarnessLearnResult, out: Path) -> dict[str, Path]:
    """The first trainable step's unmasked sessions as trainer rows, per request and prefix-merged, with each
    session's group advantage (the step's sessions are in group order, ``generations`` each)."""
    step = next(s for s in run.steps if s.trainer)
    groups: dict[int, list[tuple[list[Any], float]]] = {}
    for i, d in enumerate(step.sessions):
        attempt = AttemptDir(Path(d))
        outcome = json.loads(attempt.outcome.read_text()) if d and attempt.outcome.is_file() else {}
        records = attempt.read_records() if outcome else []
        if records and not outcome.get("mask_sample") and outcome.get("reward") is not None:
            groups.setdefault(i // run.config.generations, []).append((records, outcome["reward"]))
    batches = {}
    for builder in (per_request, prefix_merging):
        traces = []
        for members in groups.values():
            rewards = {records[0].session_id: reward for records, reward in members}
            group = [t for records, _ in members for t in builder(records).traces if t.role == "main"]
            assign(group, rewards, group_advantages(rewards))
            traces += group
        batches[builder.__name__] = out / f"{builder.__name__}.jsonl"
        write_jsonl(rows(traces), batches[builder.__name__])
    return batches


def trainer_step(batch: Path, out: Path, seed: int, lr: float) -> dict[str, Any]:
    """One step of a fresh trainer from the base weights (the same start for both batches)."""
    trainer = TrainerProcess(out / "trainer.log")
    try:
        model_dir, _, _ = resolve_model(HarnessLearnConfig().model)
        trainer.call("init", model_dir=str(model_dir), lr=lr, seed=seed, loss={"clip_min": 0.2, "clip_max": 0.2})
        t0 = time.monotonic()
        metrics = trainer.call("step", batch=str(batch), out_dir=str(out / f"{batch.stem}-weights"))
        return metrics | {"wall_s": time.monotonic() - t0}
    finally:
        trainer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/learn-ablation"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--from", dest="done", type=Path, nargs=2, metavar=("SYNC", "ASYNC"))
    args = parser.parse_args()
    if args.done:
        sync, async_ = (HarnessLearnResult.model_validate_json((d / "learn.json").read_text()) for d in args.done)
    else:
        sync, async_ = (
            learn_through_harness(loop_config(args.out / name, args.seed, args.steps, staleness))
            for name, staleness in (("sync", 0), ("async", 1))
        )
    batches = step_batches(sync, args.out)
    split, merged = (trainer_step(batches[b], args.out, args.seed, sync.config.lr) for b in batches)
    same = (
        abs(split["loss"] - merged["loss"]) <= 1e-5 * max(1e-6, abs(merged["loss"])) + 1e-7
        and abs(split["grad_norm"] - merged["grad_norm"]) <= 1e-4 * merged["grad_norm"]
    )
    per_step = {name: run.grpo_s / max(1, len(run.steps)) for name, run in (("sync", sync), ("async", async_))}
    figures: dict[str, float | int | str] = {
        "rows_per_request": split["samples"],
        "rows_prefix_merging": merged["samples"],
        "row_tokens_per_request": split["row_tokens"],
        "row_tokens_prefix_merging": merged["row_tokens"],
        "trainer_s_per_request": split["compute_s"],
        "trainer_s_prefix_merging": merged["compute_s"],
        "same_gradient": int(same),
        "loss_per_request": split["loss"],
        "loss_prefix_merging": merged["loss"],
        "grad_norm_per_request": split["grad_norm"],
        "grad_norm_prefix_merging": merged["grad_norm"],
        "step_s_sync": per_step["sync"],
        "step_s_async": per_step["async"],
        "engine_busy_sync": sync.engine_busy,
        "engine_busy_async": async_.engine_busy,
    }
    rows_x = split["samples"] / max(1, merged["samples"])
    secs_x = split["compute_s"] / max(1e-9, merged["compute_s"])
    line = (
        f"per_request/prefix_merging: rows {rows_x:.1f}x (paper {PAPER['updates']:.1f}x), "
        f"row tokens {split['row_tokens'] / max(1, merged['row_tokens']):.1f}x, trainer s {secs_x:.1f}x "
        f"(paper {PAPER['minutes']:.1f}x), same gradient {'yes' if same else 'NO'}; "
        f"sync/async: step s {per_step['sync'] / max(1e-9, per_step['async']):.2f}x, engine busy "
        f"{sync.engine_busy:.0%} -> {async_.engine_busy:.0%} "
        f"({async_.engine_busy / max(1e-9, sync.engine_busy):.2f}x, paper {PAPER['utilisation']:.1f}x)"
    )
    report("learn_ablation", figures, line)


if __name__ == "__main__":
    main()
