"""``polar patterns``: the scenario x CLI table of multi-context sessions."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    pat = subparsers.add_parser(
        "patterns",
        help="the scenario x CLI table of multi-context sessions (subagents, compaction, retries, ...)",
        description="Render the summary lines the pattern tests write (make patterns) as the scenario x CLI table: "
        "calls, chains by role, breaks by reason, tokens lost, audit. Exits 1 if a scripted scenario has no result, "
        "lost tokens or failed its audit.",
    )
    pat.add_argument("--tasks", type=Path, help="the scenario files (default: examples/tasks/patterns)")
    pat.add_argument("--results", type=Path, help="the tests' summary lines (default: <tasks>/results)")
    pat.add_argument(
        "--markdown", type=Path, help="also write the table between the patterns:table markers of this page"
    )
    pat.set_defaults(func=_patterns)


def _patterns(args: argparse.Namespace) -> int:
    from nemo_polar.env.frontends.patterns import patterns_table
    from nemo_polar.paths import write_between_markers

    tasks = args.tasks or _checkout("examples/tasks/patterns")
    results = args.results or tasks / "results"
    try:
        table, problems = patterns_table(tasks, results)
        if args.markdown:
            write_between_markers(args.markdown, "patterns:table", table)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"polar patterns: {exc}") from None
    print(table)
    for problem in problems:
        print(f"polar patterns: {problem}", file=sys.stderr)
    return 1 if problems else 0


def _checkout(rel: str) -> Path:
    from nemo_polar.paths import source_dir

    root = source_dir()
    if root is None:
        raise SystemExit(f"polar: not running from a checkout; give the path of {rel}")
    return root / rel
