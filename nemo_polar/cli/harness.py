"""``polar harness install``: the pinned coding CLIs."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    from nemo_polar.env.harness import HARNESSES

    harness = subparsers.add_parser("harness", help="the pinned coding CLIs")
    hsub = harness.add_subparsers(dest="action", required=True)
    hinstall = hsub.add_parser("install", help="install the pinned CLIs into the shared prefix (npm)")
    hinstall.add_argument("names", nargs="*", help=f"{', '.join(HARNESSES)} (default: all)")
    hinstall.set_defaults(func=_harness_install)


def _harness_install(args: argparse.Namespace) -> int:
    from nemo_polar.env.harness import install

    install(args.names or None)
    return 0
