"""``polar view``: a self-contained static HTML report of sessions, records or traces."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    view = subparsers.add_parser(
        "view",
        help="write a self-contained static HTML report of sessions, records or traces",
        description="One HTML page (inline CSS, no scripts) of session directories, a gateway state_dir, proxy record "
        "files or a traces JSONL: sessions, calls, chains and segments, tokens coloured by loss mask, break reasons "
        "and audit failures highlighted, reward and grader log.",
    )
    view.add_argument(
        "inputs",
        nargs="+",
        type=Path,
        metavar="INPUT",
        help="session directories (or directories of them), records JSONL, traces JSONL",
    )
    view.add_argument("-o", "--output", type=Path, required=True, help="the HTML file to write")
    view.add_argument("--tokenizer", type=Path, metavar="DIR", help="model directory whose tokenizer decodes ids")
    view.add_argument("--max-tokens", type=int, default=4000, help="tokens rendered per trace (default 4000)")
    view.set_defaults(func=_view)


def _view(args: argparse.Namespace) -> int:
    from nemo_polar.view.report import run

    return run(args)  # exit 2 with "polar view: <path>: ..." on bad input
