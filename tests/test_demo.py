"""``make demo`` on the shared engine: the four real CLIs each solve a bundled task through the proxy, every session
is graded 1.0, merges into one audited main chain with zero breaks, and the HTML report is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from nemo_polar import demo
from nemo_polar.env.gym import ENVIRONMENTS
from tests.conftest import ENV_HARNESSES

pytestmark = pytest.mark.engine


def test_demo_runs_the_whole_loop_for_all_four_clis(
    engine_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_demo(engine_url, tmp_path, monkeypatch, capsys)


def run_demo(
    engine_url: str, out_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``make demo`` against a running engine: four sessions solved, each one audited main chain, the report."""
    monkeypatch.setenv("POLAR_DEMO_ENGINE_URL", engine_url)
    monkeypatch.setenv("POLAR_DEMO_OUT", str(out_dir))
    assert demo.main([]) == 0
    out = capsys.readouterr().out
    assert "scripted policy" in out and f"report  {out_dir / 'report.html'}" in out
    for env in ENVIRONMENTS:
        [outcome] = (out_dir / env).glob("*/outcome.json")
        assert '"reward": 1.0' in outcome.read_text()
    for harness in ENV_HARNESSES:
        row = next(line for line in out.splitlines() if line.startswith(f"│ {harness} "))
        cells = [c.strip() for c in row.strip("│").split("│")]
        assert (
            cells[2] == "completed" and cells[4] == "1" and cells[7] == "0" and cells[8] == "ok" and cells[9] == "1.0"
        )
    html = (out_dir / "report.html").read_text()
    assert html.count('class="session"') == len(ENVIRONMENTS)
