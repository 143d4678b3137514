"""``polar gym-root``, ``polar gym-recipe`` and ``polar gym-venvs``: what a NeMo Gym or NeMo-RL user runs before
``gym env start``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    gym = subparsers.add_parser(
        "gym-root",
        help="print the NeMo Gym root to export as NEMO_GYM_EXTRA_ROOTS",
        description="Print the NeMo Gym root (export it as NEMO_GYM_EXTRA_ROOTS). With --wheel: build nemo_polar's "
        "wheel from this checkout and print its directory instead, for UV_FIND_LINKS: the agent's requirements.txt "
        "installs nemo-polar by name into the venv Gym builds (examples/nemo_rl/README.md).",
    )
    gym.add_argument("--wheel", action="store_true", help="build the wheel into $POLAR_CACHE/dist, print that dir")
    gym.add_argument("--wheel-dir", type=Path, metavar="DIR", help="build the wheel into DIR instead (implies --wheel)")
    gym.set_defaults(func=_gym_root)

    grecipe = subparsers.add_parser(
        "gym-recipe",
        help="check NeMo-RL GRPO recipes before any GPU time",
        description="Load each recipe the way NeMo-RL does (its defaults inheritance), merge its Gym part with "
        "nemo-gym's own parser, validate the Polar agents it configures and check that every dataset row routes to "
        "one of them; print each recipe's summary as JSON, or exit 1 naming the first problem. Needs "
        "POLAR_GYM_ROOT=$(polar gym-root) exported, as NeMo-RL does.",
    )
    grecipe.add_argument("recipes", nargs="+", type=Path, metavar="RECIPE", help="a NeMo-RL recipe (YAML)")
    grecipe.set_defaults(func=_gym_recipe)

    gvenvs = subparsers.add_parser(
        "gym-venvs",
        help="prepare the server venvs `gym env start` runs, on a Python older than nemo-gym's marker",
        description="On a Python older than nemo-gym's Requires-Python (uv will not install nemo-gym there), put a "
        "venv of this environment where Gym looks for each server's venv (the Polar agent, the native server, "
        "Gym's legacy_agent relay), reusing those that import what their server needs, and print the gym "
        "overrides that make Gym reuse them (++skip_venv_if_present=true). On a Python that meets the marker, "
        "print nothing: Gym builds its venvs itself. Use it as `gym env start ... $(polar gym-venvs ...)`.",
    )
    gvenvs.add_argument(
        "--environment", action="append", metavar="NAME", help="a polar_* environment (repeatable; default: all)"
    )
    gvenvs.add_argument(
        "--venv-dir", type=Path, metavar="DIR", help="Gym's uv_venv_dir (default: the working directory, as Gym's)"
    )
    gvenvs.set_defaults(func=_gym_venvs)


def _gym_root(args: argparse.Namespace) -> int:
    from nemo_polar.env.gym import gym_root

    if not (args.wheel or args.wheel_dir):
        print(gym_root())
        return 0
    from nemo_polar.env.gym.wheel import WheelError, build_wheel

    try:
        wheel = build_wheel(args.wheel_dir)
    except WheelError as exc:
        raise SystemExit(f"polar gym-root: {exc}") from None
    print(wheel.parent)
    return 0


def _gym_recipe(args: argparse.Namespace) -> int:
    """Check NeMo-RL recipes as NeMo-RL loads them, before any GPU time: each one's summary as JSON, or the first
    problem."""
    from nemo_polar.env.gym.recipes import RecipeError, check_recipe

    for path in args.recipes:
        try:
            summary = check_recipe(path)
        except RecipeError as exc:
            raise SystemExit(f"polar gym-recipe: {exc}") from None
        print(summary.model_dump_json(indent=1))
    return 0


def _gym_venvs(args: argparse.Namespace) -> int:
    """Print the gym overrides that reuse prepared server venvs (nothing where Gym builds its own), a line per venv
    on stderr."""
    from nemo_polar.env.gym import ENVIRONMENTS, venvs

    environments, venv_dir = args.environment or list(ENVIRONMENTS), args.venv_dir or Path.cwd()
    try:
        venvs.server_venvs(environments, venv_dir)  # the names checked first, whatever this Python
    except venvs.VenvError as exc:
        raise SystemExit(f"polar gym-venvs: {exc}") from None
    if venvs.gym_builds_its_venvs():
        print(
            f"polar gym-venvs: Python {sys.version.split()[0]} meets nemo-gym's {venvs.gym_requires_python()}: "
            "Gym builds its server venvs itself",
            file=sys.stderr,
        )
        return 0
    try:
        done = venvs.prepare(environments, venv_dir)
    except venvs.VenvError as exc:
        raise SystemExit(f"polar gym-venvs: {exc}") from None
    for server, how in done:
        print(f"polar gym-venvs: {how} {server.path}", file=sys.stderr)
    print(" ".join(venvs.gym_overrides(venv_dir)))
    return 0
