"""Where every file of one attempt lives: a harness session, its grade, and (under a gateway) its request, stage
and outcome. One directory per attempt; every module that writes or reads one goes through :class:`AttemptDir`, so
a file name is decided once.

::

    <attempt>/
      request.json      the gateway's SessionRequest            state.json     its stage and stage times
      workspace/        the task repository the CLI edits       outcome.json   the finished SessionOutcome
      home/ run/        the CLI's HOME and runtime scratch      delivered.json the callback acknowledged it
      harness.stdout.log, harness.stderr.log                    eval/          the grader's sandbox and logs
      session.json      the SessionResult                       grade.json     the GradeResult
      records.jsonl     the proxy's call records                traces.jsonl   the traces they reconstruct into
      patch.diff        the CLI's patch                         transcript.json the CLI's own transcript
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from nemo_polar.proxy.store.records import CallRecord, read_records


@dataclass(frozen=True)
class AttemptDir:
    root: Path

    @property
    def name(self) -> str:
        return self.root.name

    # -- the harness session -------------------------------------------------------------------------------------
    @property
    def workspace(self) -> Path:
        return self.root / "workspace"

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def harness_logs(self) -> Path:
        """The runtime's log prefix: ``harness.stdout.log`` and ``harness.stderr.log``."""
        return self.root / "harness"

    @property
    def session(self) -> Path:
        return self.root / "session.json"

    @property
    def records(self) -> Path:
        return self.root / "records.jsonl"

    @property
    def patch(self) -> Path:
        return self.root / "patch.diff"

    @property
    def transcript(self) -> Path:
        return self.root / "transcript.json"

    # -- grading and reconstruction ------------------------------------------------------------------------------
    @property
    def eval(self) -> Path:
        return self.root / "eval"

    @property
    def grade(self) -> Path:
        return self.root / "grade.json"

    @property
    def traces(self) -> Path:
        return self.root / "traces.jsonl"

    # -- the gateway's bookkeeping -------------------------------------------------------------------------------
    @property
    def request(self) -> Path:
        return self.root / "request.json"

    @property
    def state(self) -> Path:
        return self.root / "state.json"

    @property
    def outcome(self) -> Path:
        return self.root / "outcome.json"

    @property
    def delivered(self) -> Path:
        return self.root / "delivered.json"

    def read_records(self) -> list[CallRecord]:
        """The attempt's call records; none when the session never got as far as writing them."""
        return read_records(self.records) if self.records.exists() else []
