"""Arguments that more than one subcommand takes, worded once."""

from __future__ import annotations

import argparse


def container_formatter_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--container-formatter",
        action="append",
        metavar="TEMPLATE",
        help="the image of a NeMo Gym row that names none, as Gym's SWE agents find it: a .sif path or an image name "
        "with {instance_id} (repeatable: tried in order; see docs/train.md)",
    )
