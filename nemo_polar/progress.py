"""A ``rich`` progress bar for long commands that run many attempts (``polar rollout dataset=…``, ``polar
generate``): attempts done out of the total, with how many were trainable, accepted or masked so far."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Protocol

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class _Attempt(Protocol):
    @property
    def reward(self) -> float | None: ...


class AttemptsProgress:
    def __init__(self, progress: Progress, description: str) -> None:
        self._progress = progress
        self._task = progress.add_task(description, total=None, status="")
        self.done = self.rewarded = self.passed = 0

    def start(self, total: int) -> None:
        self._progress.update(self._task, total=total)

    def __call__(self, attempt: _Attempt) -> None:
        self.done += 1
        if attempt.reward is not None:
            self.rewarded += 1
            self.passed += attempt.reward > 0
        status = f"{self.passed} passed · {self.rewarded} rewarded · {self.done - self.rewarded} masked"
        self._progress.update(self._task, advance=1, status=status)


@contextlib.contextmanager
def attempts_progress(description: str) -> Iterator[AttemptsProgress]:
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=Console(stderr=True)) as progress:
        yield AttemptsProgress(progress, description)
