"""make bench's plumbing (no figure is measured here): every bench make bench runs has a row spec, results
become a table that says which targets are met, and docs/performance.md's table is replaced between its markers only."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import report
from bench.run import BENCHES


def test_every_bench_make_bench_runs_has_a_spec() -> None:
    assert {name for name, _, _ in BENCHES} == set(report.SPECS)


def test_results_become_a_table_with_verdicts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    results = {
        "staging": {"figures": {"serial_busy": 0.6, "pipelined_busy": 0.93}, "line": "busy 93%"},
        "capacity": {
            "figures": {"peak_in_run": 95, "published": 256, "lost_records": 0, "sessions": 256},
            "line": "peak 95",
        },
    }
    table = report.performance_table(results)
    assert "| busy 93% | ≥ 90% engine busy pipelined | yes |" in table
    assert "| peak 95 | ≥ 1,000 sessions in RUN at once, all published, no lost record | **no** |" in table
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{report.BEGIN}\nold table\n{report.END}\nrest\n")
    monkeypatch.setattr(report, "PAGE", readme)
    report.update_page(table)
    assert readme.read_text() == f"intro\n{report.BEGIN}\n{table}\n{report.END}\nrest\n"
    out = tmp_path / "report.html"
    report.write_html(results, out)
    page = out.read_text()
    assert page.count("data:image/png;base64,") == 2 and "misses its target" in page and "meets its target" in page
