"""``polar learn``: a closed GRPO loop on this machine, quick mode or through a harness."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def register(subparsers: argparse._SubParsersAction) -> None:
    learn = subparsers.add_parser(
        "learn",
        help="a closed GRPO loop on this machine: rollouts through the proxy, traces, update, weights into vLLM",
        description="SmolLM2-135M-Instruct learns on this machine. With --harness NAME every rollout is a session of "
        "that unchanged CLI, run by the path the Gym environments serve NeMo-RL with (sandbox, proxy, swebench's "
        "grade, the verdict's mask), on generated tasks whose value exists only in a workspace file: a warm-up from "
        "the teacher's accepted sessions (SFT), then GRPO; held-out tasks are scored before the warm-up, at the start "
        "of RL and at its end. Without it, the quick mode: 'which number is bigger?' in one chat call per session. "
        "Each step: prefix-merged rows with per-session GRPO advantages, one step of NeMo-RL's clipped "
        "policy-gradient loss (torch, in the engine's virtualenv), then the proxy pauses, vLLM reloads the new "
        "weights in place and the proxy resumes with the next policy version. Writes OUT/seed-N/learn.json, "
        "OUT/learn.json and OUT/learn.html.",
    )
    learn.add_argument("-o", "--output", type=Path, default=Path("runs/learn"), help="the output directory")
    learn.add_argument("--harness", help="learn through this CLI (pi, mini_swe_agent, ...); default: the quick mode")
    learn.add_argument("--seed", type=int, action="append", help="a seed (repeatable; default: 0 and 1)")
    learn.add_argument("--steps", type=int, help="GRPO steps (default: 12; 4 with --harness)")
    learn.add_argument("--prompts", type=int, help="tasks per step, a GRPO group each (default: 8; 4 with --harness)")
    learn.add_argument("--generations", type=int, help="sessions per task: the group (default: 8; 4 with --harness)")
    learn.add_argument("--held-out", type=int, help="held-out tasks (default: 32; 12 with --harness)")
    learn.add_argument("--eval-samples", type=int, help="sessions per held-out task (default: 4; 2 with --harness)")
    learn.add_argument("--warmup-steps", type=int, help="--harness: SFT steps on the teacher's accepted sessions")
    learn.add_argument("--lr", type=float, help="GRPO's learning rate (default: 2e-5; 3e-5 with --harness)")
    learn.add_argument(
        "--staleness",
        type=int,
        choices=(0, 1),
        help="--harness: 1 runs step n+1's sessions while step n trains (async, truncated importance sampling)",
    )
    learn.set_defaults(func=_learn, seed=None)


def _learn(args: argparse.Namespace) -> int:
    from nemo_polar.learn.report import run_harness_seeds, run_seeds

    try:
        if args.harness:
            summary: Any = run_harness_seeds(_harness_learn_configs(args), args.output)
        else:
            summary = run_seeds(_learn_configs(args), args.output)
    except (OSError, ValueError, RuntimeError) as exc:
        raise SystemExit(f"polar learn: {exc}") from None
    print(summary.model_dump_json(indent=2))
    return 0


def _learn_configs(args: argparse.Namespace) -> list[Any]:
    from nemo_polar.learn.loop import LearnConfig

    given = {"steps": args.steps, "lr": args.lr, "held_out": args.held_out, "eval_samples": args.eval_samples}
    given |= {"prompts_per_step": args.prompts, "generations": args.generations}
    given = {k: v for k, v in given.items() if v is not None}
    return [LearnConfig(out=args.output / f"seed-{seed}", seed=seed, **given) for seed in args.seed or [0, 1]]


def _harness_learn_configs(args: argparse.Namespace) -> list[Any]:
    from nemo_polar.learn.harness_loop import HarnessLearnConfig

    given = {"steps": args.steps, "lr": args.lr, "held_out": args.held_out, "eval_samples": args.eval_samples}
    given |= {"groups_per_step": args.prompts, "generations": args.generations, "warmup_steps": args.warmup_steps}
    given |= {"staleness": args.staleness}
    given = {k: v for k, v in given.items() if v is not None}
    return [
        HarnessLearnConfig(harness=args.harness, out=args.output / f"seed-{seed}", seed=seed, **given)
        for seed in args.seed or [0, 1]
    ]
