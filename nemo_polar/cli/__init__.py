"""The ``polar`` command line: one module per subcommand (or group of them), each holding its arguments beside its
handler in a ``register(subparsers)``."""

from __future__ import annotations

import argparse

from nemo_polar.cli import (
    convert_rows,
    engine,
    generate,
    grade,
    gym,
    harness,
    learn,
    patterns,
    proxy,
    reconstruct,
    rollout,
    view,
)

# The order `polar --help` lists the subcommands in.
COMMANDS = (engine, proxy, patterns, reconstruct, rollout, generate, learn, grade, convert_rows, view, gym, harness)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="polar",
        description="nemo_polar: RL of coding agents inside their real CLIs. Start an engine (polar engine up), "
        "then run sessions (polar rollout), datasets (polar rollout dataset=bundled n_samples=4) or SFT generation "
        "(polar generate); inspect with polar view, polar audit, polar reconstruct.",
        epilog="Every command has its own --help. Quick start: make demo; docs/quickstart.md has the rest.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)
