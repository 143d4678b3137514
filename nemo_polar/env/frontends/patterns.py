"""Pattern scenarios: scripted sessions that make a real CLI produce the multi-context shapes of long agent runs.

One file per scenario and CLI, ``<tasks>/<scenario>/<harness>.yaml``, all on the shared ``<tasks>/repo``. A file
either scripts the session (the instruction, the CLI's own settings that trigger the feature, the faults injected
around the proxy, the engine's turns in call order) and says what reconstruction must find (each exact outcome,
where a race inside the CLI decides between them), or says why the CLI has no such feature (``unsupported``). Tests
run every scripted file with the real CLI in bubblewrap.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, model_validator

from nemo_polar.env.harness import HARNESSES
from nemo_polar.env.harness.script import Action
from nemo_polar.reconstruct.patterns import PatternRow, markdown_table


def harness_order() -> dict[str, int]:
    """Each registered CLI's column in the table (its ``order``: the paper's CLIs, then ours)."""
    return {name: h.order for name, h in HARNESSES.items()}


SCENARIOS = (
    "subagent",
    "compaction",
    "parallel_tools",
    "tool_error",
    "engine_retry",
    "client_disconnect",
    "side_calls",
)


class Fault(BaseModel):
    """A fault on one model call. ``engine``: between the proxy and vLLM, the call's ``/v1/completions`` is answered
    500 (the proxy gives the CLI a 502). ``client``: between the CLI and the proxy, the proxy's whole answer is
    read (the call completes and is recorded) and the CLI gets the first half of it before the connection drops."""

    at: Literal["engine", "client"]
    call: int = Field(ge=0, description="which model call, counted from 0 at this point")

    @property
    def kind(self) -> str:
        return "http_500" if self.at == "engine" else "disconnect"


class Expect(BaseModel):
    """What reconstruction must find: exact counts (a silent fallback to fresh rendering changes them)."""

    calls: int = Field(ge=1, description="records, failed ones included")
    failed_calls: int = 0
    chains: dict[str, int] = Field(description="traces by role; retry siblings count as 'retry'")
    breaks: dict[str, int] = Field(default_factory=dict, description="break reasons, as prefix_merging counts them")
    render_reasons: dict[str, int] = Field(description="how the proxy rendered each call's prompt")

    @classmethod
    def observed(cls, row: PatternRow) -> Expect:
        """What a session's summary line shows, in the form a scenario file expects it."""
        return cls.model_validate(row.model_dump(include=set(cls.model_fields)))


class PatternTask(BaseModel):
    scenario: str
    harness: str
    about: str = Field(description="what the CLI does in this scenario, or why it cannot")
    unsupported: bool = False
    blocked: str | None = Field(
        default=None, description="the CLI has the feature but the proxy cannot serve it yet: what is missing"
    )
    instruction: str = ""
    harness_options: dict[str, Any] = Field(default_factory=dict, description="the adapter's own settings")
    session: dict[str, Any] = Field(default_factory=dict, description="SessionConfig fields for the proxy session")
    faults: list[Fault] = Field(default_factory=list)
    script: list[Action] = Field(default_factory=list)
    expect: Expect | None = None
    also: list[Expect] = Field(
        default_factory=list, description="other exact outcomes a race inside the CLI itself can give (see `about`)"
    )
    timeout_s: float = 300.0

    @model_validator(mode="after")
    def _complete(self) -> PatternTask:
        if self.scenario not in SCENARIOS:
            raise ValueError(f"unknown scenario {self.scenario!r}; one of {', '.join(SCENARIOS)}")
        if not self.unsupported and (not self.instruction or not self.script or self.expect is None):
            raise ValueError(f"{self.scenario}/{self.harness}: a supported scenario needs instruction, script, expect")
        return self

    @property
    def id(self) -> str:
        return f"{self.scenario}-{self.harness}"


def load_pattern(path: Path) -> PatternTask:
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a pattern file is a mapping")
    task = PatternTask.model_validate({"scenario": path.parent.name, "harness": path.stem, **data})
    if (task.scenario, task.harness) != (path.parent.name, path.stem):
        raise ValueError(f"{path}: scenario and harness are the directory and file names")
    return task


def load_patterns(root: Path) -> list[PatternTask]:
    return [load_pattern(p) for p in sorted(root.glob("*/*.yaml"))]


def patterns_table(tasks_dir: Path, results_dir: Path) -> tuple[str, list[str]]:
    """The scenario x CLI table from the tests' summary lines, and what is wrong with it (a scripted scenario with
    no result, tokens lost, an audit failure)."""
    tasks = load_patterns(tasks_dir)
    rows = [PatternRow.model_validate_json(p.read_text()) for p in sorted(results_dir.glob("*.json"))]
    by_key = {(r.scenario, r.harness): r for r in rows}
    order = harness_order()
    harnesses = list(dict.fromkeys(t.harness for t in sorted(tasks, key=lambda t: order.get(t.harness, 99))))
    unsupported = {(t.scenario, t.harness): t.about for t in tasks if t.unsupported}
    blocked = {(t.scenario, t.harness): t.blocked for t in tasks if t.blocked}
    runnable = [t for t in tasks if not t.unsupported and not t.blocked]
    problems = [f"{t.id}: not run" for t in runnable if (t.scenario, t.harness) not in by_key]
    problems += [f"{r.scenario}-{r.harness}: {r.tokens_lost} tokens lost" for r in rows if r.tokens_lost]
    problems += [f"{r.scenario}-{r.harness}: audit failed {r.audit_failures}" for r in rows if not r.audit_ok]
    table = markdown_table(
        [r for r in rows if (r.scenario, r.harness) not in blocked], unsupported, blocked, SCENARIOS, harnesses
    )
    return table, problems
