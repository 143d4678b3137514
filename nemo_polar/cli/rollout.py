"""``polar rollout``: one harness session on a task, or a dataset of attempts, from Hydra overrides."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    rollout = subparsers.add_parser(
        "rollout",
        help="run one harness session on a task, or a dataset with n_samples attempts each (Hydra overrides)",
        description="Compose conf/rollout.yaml with Hydra overrides. With task=FILE: run one session of a real "
        "coding CLI through a proxy session and write its directory (records, patch, logs, transcript). With "
        "dataset=bundled|swebench: attempt every instance n_samples times through the rollout gateway, grade, "
        "reconstruct (builder=prefix_merging|per_request) and write results.jsonl, traces.jsonl and sessions/. "
        "Examples: env=polar_pi task=examples/tasks/calc_add/task.yaml engine.url=http://127.0.0.1:8011 | "
        "env=polar_codex dataset=bundled n_samples=4 engine.url=... | --cfg to print the composed config.",
    )
    rollout.add_argument("overrides", nargs="*", help="e.g. env=polar_codex task=examples/tasks/calc_add/task.yaml")
    rollout.add_argument("--cfg", action="store_true", help="print the composed config and exit")
    rollout.set_defaults(func=_rollout)


def _rollout(args: argparse.Namespace) -> int:
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from nemo_polar.env.frontends.rollout import collect_dataset, compose, rollout, summary
    from nemo_polar.progress import attempts_progress

    try:
        cfg = compose(args.overrides)
        if args.cfg:
            print(OmegaConf.to_yaml(cfg))
            return 0
        if cfg.get("dataset") is not None:
            with attempts_progress(f"{cfg.env.name} on {cfg.dataset.name}") as progress:
                report = collect_dataset(cfg, progress)
            print(report.model_dump_json(indent=2))
            return 0
        result = rollout(cfg)
    except (HydraException, OmegaConfBaseException, ValueError, FileNotFoundError) as exc:
        raise SystemExit(f"polar rollout: {exc}") from None
    print(summary(cfg, result).model_dump_json(indent=2))
    return 0 if result.status == "completed" else 1
