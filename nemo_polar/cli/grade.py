"""``polar grade``: SWE-bench predictions graded with swebench's grader in fresh sandboxes."""

from __future__ import annotations

import argparse
from pathlib import Path

from nemo_polar.cli.options import container_formatter_arg


def register(subparsers: argparse._SubParsersAction) -> None:
    grade = subparsers.add_parser("grade", help="grade SWE-bench predictions with swebench's grader in fresh sandboxes")
    grade.add_argument(
        "--instances", type=Path, required=True, help="JSONL, local HF dataset files, a bundled task dir, or 'bundled'"
    )
    container_formatter_arg(grade)
    grade.add_argument("--predictions", type=Path, required=True, help="{instance_id, model_patch} rows (JSONL/JSON)")
    grade.add_argument("--runtime", choices=["bwrap", "docker", "local"], default="bwrap")
    grade.add_argument(
        "-o",
        "--output",
        type=Path,
        required=True,
        help="the report (JSON); each evaluation log is kept in OUTPUT_STEM.logs/ beside it",
    )
    grade.set_defaults(func=_grade)


def _grade(args: argparse.Namespace) -> int:
    import json

    from nemo_polar.rewards.datasets import select_instances
    from nemo_polar.rewards.grader import grade_many
    from nemo_polar.rewards.predictions import grade_summary, pair_predictions, read_predictions
    from nemo_polar.sandbox import RuntimeUnavailable

    try:
        instances = select_instances(args.instances, container_formatter=args.container_formatter)
        predictions = read_predictions(args.predictions)
        pairs = pair_predictions(instances, predictions)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"polar grade: {exc}") from None
    log_dir = args.output.parent / f"{args.output.stem}.logs"  # every graded instance's evaluation log, kept
    try:
        results = grade_many(pairs, runtime=args.runtime, log_dir=log_dir)
    except RuntimeUnavailable as exc:  # no daemon, no skopeo, an image that is nowhere: say so, no traceback
        raise SystemExit(f"polar grade: {exc}") from None
    summary = grade_summary(results)
    report = {"summary": summary, "results": [r.model_dump(mode="json") for r in results]}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2))
    print(json.dumps(summary))
    return 0
