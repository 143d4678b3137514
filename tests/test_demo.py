"""``make demo`` on the shared engine: the real CLIs each solve a bundled task through the proxy, every session is
graded 1.0, merges into one audited main chain with zero breaks, and the HTML report is written. One CLI per dialect
in ``make test``; every CLI in ``make test-full``."""

from __future__ import annotations

from pathlib import Path

import pytest

from nemo_polar import demo
from nemo_polar.env.frontends import demo_runs
from nemo_polar.env.gym import ENVIRONMENTS
from tests.helpers.demo import DIALECT_ENVS, run_demo
from tests.helpers.lanes import lane

pytestmark = pytest.mark.engine


@pytest.mark.parametrize("envs", lane(["dialects", "all"], ["dialects"]))
def test_demo_runs_the_whole_loop(
    engine_url: str,
    envs: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run_demo(engine_url, tmp_path, monkeypatch, capsys, DIALECT_ENVS if envs == "dialects" else None)


def test_every_environment_has_a_demo_task_and_a_bad_env_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert set(demo_runs.TASKS) == set(ENVIRONMENTS)
    with pytest.raises(SystemExit):
        demo.main(["--env", "polar_cursor"])
    assert "invalid choice: 'polar_cursor'" in capsys.readouterr().err
