"""``polar convert-rows``: legacy SWE rows given the eval script, log parser and image they lack."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    conv = subparsers.add_parser(
        "convert-rows",
        help="convert legacy rows (SWE-Gym, SWE-bench before 5.0) into rows with eval_script, log_parser and image",
        description="Write each row's eval script, log parser and eval type with a pre-5.0 swebench's own spec tables "
        "(in a tool venv under $POLAR_CACHE/envs, built once), and name its image. Rows that already have an eval "
        "script are kept. Nothing is written unless every row converts.",
    )
    conv.add_argument("source", type=Path, help="JSONL, parquet/json files or a save_to_disk directory")
    conv.add_argument("-o", "--output", type=Path, required=True, help="the converted rows (JSONL)")
    conv.add_argument(
        "--image",
        required=True,
        help="'swebench' (swebench/sweb.eval.x86_64.<id, __ as _1776_>), 'swe-gym' (xingyaoww/..., __ as _s_), or a "
        "template with {instance_id}, {id_1776} or {id_s}",
    )
    conv.add_argument("--specs", type=Path, help="YAML {repo: {version: spec}} for repositories the tables lack")
    conv.add_argument(
        "--swebench", default="swebench==4.1.0", metavar="REQUIREMENT", help="the swebench to take the tables from"
    )
    conv.set_defaults(func=_convert_rows)


def _convert_rows(args: argparse.Namespace) -> int:
    from nemo_polar.rewards.legacy import convert_file

    try:
        rows = convert_file(args.source, args.output, args.image, args.specs, args.swebench)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"polar convert-rows: {exc}") from None
    print(f"{len(rows)} rows -> {args.output}")
    return 0
