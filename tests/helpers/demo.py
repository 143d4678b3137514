"""``make demo`` against a running engine, as the demo tests and the family demos run it."""

from __future__ import annotations

from pathlib import Path

import pytest

from nemo_polar import demo
from nemo_polar.env.gym import ENVIRONMENTS
from tests.helpers.lanes import DIALECT_HARNESSES

DIALECT_ENVS = [f"polar_{h}" for h in DIALECT_HARNESSES.values()]


def run_demo(
    engine_url: str,
    out_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    envs: list[str] | None = None,
) -> list[str]:
    """``make demo`` (``--env`` for each of ``envs``; default every environment) against a running engine: each
    session solved (reward 1.0), one audited main chain with no breaks, and the report. Returns the environments."""
    envs = list(ENVIRONMENTS) if envs is None else envs
    monkeypatch.setenv("POLAR_DEMO_ENGINE_URL", engine_url)
    monkeypatch.setenv("POLAR_DEMO_OUT", str(out_dir))
    assert demo.main([arg for env in envs for arg in ("--env", env)]) == 0
    out = capsys.readouterr().out
    assert "scripted policy" in out and f"report  {out_dir / 'report.html'}" in out
    assert sorted(p.name for p in out_dir.iterdir() if p.name.startswith("polar_")) == sorted(envs)
    for env in envs:
        [outcome] = (out_dir / env).glob("*/outcome.json")
        assert '"reward": 1.0' in outcome.read_text()
        harness = env.removeprefix("polar_")
        row = next(line for line in out.splitlines() if line.startswith(f"│ {harness} "))
        cells = [c.strip() for c in row.strip("│").split("│")]
        assert (
            cells[2] == "completed" and cells[4] == "1" and cells[7] == "0" and cells[8] == "ok" and cells[9] == "1.0"
        )
    html = (out_dir / "report.html").read_text()
    assert html.count('class="session"') == len(envs)
    return envs
