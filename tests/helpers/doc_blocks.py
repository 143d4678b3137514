"""Docs' command blocks run as written: a page's bash block after an ``<!-- TAG: NAME -->`` marker, and a run of it
that must exit 0 (its output's tail is the failure message)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path


def doc_block(page: Path, tag: str, name: str) -> str:
    """The bash block after ``<!-- TAG: NAME -->`` on ``page``."""
    [block] = re.findall(rf"^<!-- {tag}: {name} -->\n```bash\n(.*?)^```", page.read_text(), flags=re.S | re.M)
    return block


def run_block(script: str, cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    """``script`` under ``bash -euo pipefail``; asserts it exited 0."""
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done
