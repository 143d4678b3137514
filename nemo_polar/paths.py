"""Where the project keeps its cache (engine virtualenv, models) and run state."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    return Path(os.environ.get("POLAR_CACHE") or Path.home() / ".cache" / "nemo_polar")


def run_dir() -> Path:
    path = cache_dir() / "run"
    path.mkdir(parents=True, exist_ok=True)
    return path
