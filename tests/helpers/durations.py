"""Where the suite's time goes, kept by every run: each test's setup, call and teardown, each fixture's setup, and
the time per module, written to ``$POLAR_TEST_LOG`` (default ``$POLAR_CACHE/logs/test``) and the per-module table
printed at the end, so whoever stops sees the budget (docs/testing.md). Under pytest-xdist (make test's two worker
processes) the controller gets every test's report; each worker writes the fixtures it set up to a file of its own,
which the controller merges, and the table's header gives the wall time beside the time in tests."""

from __future__ import annotations

import csv
import os
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nemo_polar.paths import cache_dir

PHASES = ("setup", "call", "teardown")


def log_dir() -> Path:
    return Path(os.environ.get("POLAR_TEST_LOG") or cache_dir() / "logs" / "test")


class Durations:
    def __init__(self, worker: str | None = None) -> None:
        self.started = time.monotonic()
        self.worker = worker  # the pytest-xdist worker's id, None in the process that reports
        log_dir().mkdir(parents=True, exist_ok=True)
        self.running = log_dir() / "running.tsv"  # elapsed s, test s, test: one line per finished test
        if worker is None:
            self.running.write_text("")
            for stale in log_dir().glob("fixtures-*.tsv"):
                stale.unlink()
        self.tests: dict[str, dict[str, float]] = defaultdict(lambda: dict.fromkeys(PHASES, 0.0))
        self.outcomes: dict[str, str] = {}
        self.fixtures: list[tuple[str, str, str, float]] = []  # (fixture, scope, first test that needed it, seconds)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(self, fixturedef: Any, request: pytest.FixtureRequest) -> Iterator[None]:
        t0 = time.perf_counter()
        yield
        item = getattr(request, "_pyfuncitem", None)  # the test whose setup started the fixture
        seconds = time.perf_counter() - t0
        self.fixtures.append((fixturedef.argname, fixturedef.scope, getattr(item, "nodeid", ""), seconds))

    def pytest_sessionfinish(self) -> None:
        if self.worker is not None:
            with (log_dir() / f"fixtures-{self.worker}.tsv").open("w", newline="") as f:
                csv.writer(f, delimiter="\t").writerows((*row[:3], f"{row[3]:.4f}") for row in self.fixtures)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if self.worker is not None:
            return  # the controller has the same report
        nodeid = report.nodeid
        self.tests[nodeid][report.when] += report.duration
        if report.when == "call" or report.outcome != "passed":
            self.outcomes[nodeid] = report.outcome
        if report.when == "teardown":  # as it goes: a run cut short by a time limit still says where its time went
            phases = self.tests[nodeid]
            with self.running.open("a") as f:
                f.write(f"{time.monotonic() - self.started:.0f}\t{sum(phases.values()):.2f}\t{nodeid}\n")

    def per_module(self) -> list[tuple[str, int, float]]:
        modules: dict[str, list[float]] = defaultdict(list)
        for nodeid, phases in self.tests.items():
            modules[nodeid.split("::", 1)[0]].append(sum(phases.values()))
        rows = [(module, len(times), sum(times)) for module, times in modules.items()]
        return sorted(rows, key=lambda row: -row[2])

    def write(self, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        for part in sorted(out.glob("fixtures-*.tsv")):
            with part.open(newline="") as f:
                self.fixtures += [(a, b, c, float(d)) for a, b, c, d in csv.reader(f, delimiter="\t")]
            part.unlink()
        with (out / "tests.tsv").open("w", newline="") as f:
            w = csv.writer(f, delimiter="\t")
            w.writerow(["test", "outcome", *PHASES, "total_s"])
            for nodeid, phases in sorted(self.tests.items(), key=lambda kv: -sum(kv[1].values())):
                seconds = [f"{phases[p]:.2f}" for p in PHASES]
                w.writerow([nodeid, self.outcomes.get(nodeid, ""), *seconds, f"{sum(phases.values()):.2f}"])
        with (out / "fixtures.tsv").open("w", newline="") as f:
            w = csv.writer(f, delimiter="\t")
            w.writerow(["fixture", "scope", "first_needed_by", "setup_s"])
            for row in sorted(self.fixtures, key=lambda r: -r[3]):
                if row[3] >= 0.01:
                    w.writerow([*row[:3], f"{row[3]:.2f}"])
        with (out / "modules.tsv").open("w", newline="") as f:
            w = csv.writer(f, delimiter="\t")
            w.writerow(["module", "tests", "seconds"])
            w.writerows((m, n, f"{s:.1f}") for m, n, s in self.per_module())

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.worker is not None or not self.tests:
            return
        out = log_dir()
        self.write(out)
        rows = self.per_module()
        total = sum(row[2] for row in rows)
        tr = terminalreporter
        wall = (time.monotonic() - self.started) / 60
        head = f"time per module ({total / 60:.1f} min in tests, {len(self.tests)} tests, {wall:.1f} min wall)"
        tr.write_sep("=", head)
        for module, count, seconds in rows:
            tr.write_line(f"{seconds / 60:7.1f} min {100 * seconds / total:5.1f}% {count:5d} tests  {module}")
        tr.write_line(f"per test and per fixture: {out}/tests.tsv, {out}/fixtures.tsv")
