"""nemo_polar as NeMo Gym installs it into the Polar agent's venv.

Gym builds a server's venv itself, from the server directory's ``requirements.txt``
(``nemo_gym/cli/setup_command.py::setup_env_command``). Our root sits outside Gym's tree (no ``../../pyproject.toml``),
so Gym takes its non-editable branch: ``nemo-gym==<its own version>`` plus ``requirements.txt`` minus every line
that contains ``../..``. nemo_polar can therefore not come from the checkout by relative path: ``requirements.txt``
names it by package name at exactly this version, and uv finds it on the cluster's package index or in a
find-links directory (``UV_FIND_LINKS``) holding its wheel, which :func:`build_wheel` builds from a checkout.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

from nemo_polar.paths import dist_dir, source_dir

PACKAGE = "nemo-polar"
# What a wheel build reads from a checkout: the package (data/ links into conf/ and examples/tasks/swe/).
BUILD_INPUTS = ("pyproject.toml", "README.md", "nemo_polar", "conf", "examples/tasks/swe")
SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", ".venv*")


class WheelError(RuntimeError):
    pass


def requirement(version: str) -> str:
    """The ``requirements.txt`` line of the agent server: nemo_polar by name, pinned to the driver's version."""
    return f"{PACKAGE}=={version}"


def checkout() -> Path:
    src = source_dir()
    if src is None:
        raise WheelError(
            "nemo_polar is installed from a wheel, not run from a checkout: point UV_FIND_LINKS at the directory "
            f"of that wheel, or publish it to the package index your cluster's uv uses ({PACKAGE} is installed by name)"
        )
    return src


def checkout_version(src: Path) -> str:
    return tomllib.loads((src / "pyproject.toml").read_text())["project"]["version"]


def build_wheel(out: Path | None = None) -> Path:
    """Build nemo_polar's wheel from the checkout into ``out`` (default ``$POLAR_CACHE/dist``) and return its path.

    The build runs on a copy of the checkout's build inputs: setuptools leaves ``build/`` behind in the tree it
    builds, and a stale ``build/lib`` would put deleted modules back into later wheels.
    """
    src = checkout()
    out = (out or dist_dir()).resolve()
    out.mkdir(parents=True, exist_ok=True)
    name = f"nemo_polar-{checkout_version(src)}-py3-none-any.whl"
    with tempfile.TemporaryDirectory(prefix="polar-wheel-") as tmp:
        for rel in BUILD_INPUTS:
            source, target = src / rel, Path(tmp) / rel
            if source.is_dir():
                shutil.copytree(source, target, symlinks=True, ignore=SKIP)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target)
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", tmp + "/dist", tmp]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode:
            raise WheelError(f"building the nemo_polar wheel failed:\n{proc.stdout}{proc.stderr}")
        # Replaced whole, so uv never sees a half-written wheel of the same name.
        part = out / f".{name}.part"
        shutil.copyfile(Path(tmp) / "dist" / name, part)
        part.replace(out / name)
    return out / name
