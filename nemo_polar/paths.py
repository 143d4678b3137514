"""Where the project keeps its cache (engine virtualenv, models) and run state, and where its data files are."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

# Package data, so a non-editable install has them too. In a checkout, data/conf and data/swe_tasks are symlinks to
# the top-level conf/ and examples/tasks/swe/, the copies users see and edit (resolved, so paths name those); the
# wheel carries the files themselves.
DATA_DIR = Path(__file__).resolve().parent / "data"


def conf_dir() -> Path:
    """The Hydra configs ``polar rollout`` composes (``conf/`` in a checkout)."""
    return (DATA_DIR / "conf").resolve()


def bundled_tasks_dir() -> Path:
    """The bundled SWE-style tasks (``examples/tasks/swe/`` in a checkout)."""
    return (DATA_DIR / "swe_tasks").resolve()


def source_dir() -> Path | None:
    """The checkout nemo_polar runs from (an editable install), or None when it is installed from a wheel."""
    root = Path(__file__).resolve().parents[1]
    return root if (root / "pyproject.toml").is_file() and (root / "nemo_polar" / "data").is_dir() else None


def cache_dir() -> Path:
    return Path(os.environ.get("POLAR_CACHE") or Path.home() / ".cache" / "nemo_polar")


def run_dir() -> Path:
    path = cache_dir() / "run"
    path.mkdir(parents=True, exist_ok=True)
    return path


def dist_dir() -> Path:
    """Where ``polar gym-root --wheel`` builds nemo_polar's wheel: the find-links directory for Gym's venv builds."""
    return cache_dir() / "dist"


def write_between_markers(path: Path, marker: str, text: str) -> None:
    """Replace what lies between ``<!-- marker -->`` and ``<!-- /marker -->`` in ``path`` (a generated docs table)."""
    begin, end = f"<!-- {marker} -->", f"<!-- /{marker} -->"
    content = path.read_text()
    if begin not in content or end not in content:
        raise ValueError(f"{path} has no {begin} ... {end} markers")
    head, rest = content.split(begin, 1)
    _, tail = rest.split(end, 1)
    path.write_text(f"{head}{begin}\n{text}\n{end}{tail}")


def atomic_write(path: Path, data: bytes) -> None:
    """Whole or absent after a crash: a temporary file in the same directory, fsync'd, then renamed over ``path``
    (a reader in another process, or after a kill, never sees a partial file)."""
    with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".tmp-", delete=False) as fh:
        tmp = Path(fh.name)
        try:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
