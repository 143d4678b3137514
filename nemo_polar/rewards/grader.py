"""Grade a patch with SWE-bench's own functions, in a fresh sandbox that is never the one the agent ran in.

Rewards follow the paper: 1.0 if resolved, else 0.0. What is trainable matters as much: an empty patch or one
that does not apply is a real 0 (the policy produced it); a test-suite timeout, a test patch that does not apply
or a sandbox failure is the infrastructure's fault and gets ``mask_sample`` (never trained on), with the reason.
The policy is an adversary of this grader: what its patch does to the test infrastructure is undone before the
tests run (guard.py), and only what the test runner itself reports is graded (testlog.py), so neither a hack nor
a crash turns a 0 into a 1 or into a masked sample.
"""

from __future__ import annotations

import json
import secrets
import shlex
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

import nemo_polar.rewards.testlog as testlog
from nemo_polar.rewards.instance import SWEInstance
from nemo_polar.sandbox import ExecResult, Runtime, SandboxSpec

HERE = Path(__file__).parent
EVAL_FILES = [HERE / "eval.sh", HERE / "guard.py"]
EVAL_MOUNT = "/polar/eval"
EVAL_SLACK_S = 120.0  # beyond the tests' own budget: patches, the guard's scans of the tree, the setup command
Status = Literal["resolved", "unresolved", "empty_patch", "patch_failed", "tests_timeout", "infra_failure"]
MASKED: set[str] = {"tests_timeout", "infra_failure"}


class GradeResult(BaseModel):
    instance_id: str
    reward: float
    resolved: bool
    status: Status
    mask_sample: bool = Field(description="infrastructure failure or timeout: never train on this sample")
    reason: str | None = None
    fail_to_pass: float | None = Field(default=None, description="fraction of FAIL_TO_PASS tests that pass")
    pass_to_pass: float | None = Field(default=None, description="fraction of PASS_TO_PASS tests still passing")
    resolution: str | None = Field(default=None, description="RESOLVED_FULL | RESOLVED_PARTIAL | RESOLVED_NO")
    tests_status: dict | None = None
    reverted_paths: list[str] = Field(
        default_factory=list, description="what of the patch the guard undid: test files and test infrastructure"
    )
    timings: dict[str, float] = Field(default_factory=dict)
    log_path: Path | None = None


class GuardEvent(BaseModel):
    """A message of eval.sh or guard.py: a line that starts with the grader's one-time tag."""

    event: str
    path: str | None = None
    reason: str | None = None


# Each ends the part of the evaluation that runs no repository code; no message after it is read.
FINAL_EVENTS = {"ready", "snapshot_failed", "model_patch_failed", "git_tampered", "guard_failed", "test_patch_failed"}


def guard_events(log: str, tag: str) -> tuple[list[GuardEvent], str]:
    """The grader's own messages, up to the first final one, and the log after it."""
    events: list[GuardEvent] = []
    lines = log.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.startswith(tag + " "):
            event, _, payload = line[len(tag) + 1 :].strip().partition(" ")
            events.append(GuardEvent(event=event, **(json.loads(payload) if payload else {})))
            if event in FINAL_EVENTS:
                return events, "".join(lines[i + 1 :])
    return events, ""


def _swebench():
    """swebench's grading functions (imported lazily: the package pulls in datasets, docker, modal)."""
    from swebench.harness import grading
    from swebench.types import TestSpec

    return grading, TestSpec


def model_patch_commands() -> list[str]:
    """How swebench's harness applies a model patch: each command in turn on a pristine tree until one succeeds
    (``swebench.harness.run_evaluation.GIT_APPLY_CMDS``; eval.sh runs them, then the same reverse check)."""
    from swebench.harness.run_evaluation import GIT_APPLY_CMDS

    return list(GIT_APPLY_CMDS)


def test_targets(instance: SWEInstance) -> list[str]:
    """The test files to run: those of the F2P/P2P ids and of the test patch (SWE-bench runs the latter)."""
    files = [t.split("::")[0] for t in [*instance.FAIL_TO_PASS, *instance.PASS_TO_PASS]]
    return list(dict.fromkeys([*files, *instance.test_files]))


def swebench_report(instance: SWEInstance, model_patch: str, log: Path) -> dict[str, Any]:
    """swebench's own ``get_eval_report`` for one instance's test log (with the per-test statuses)."""
    grading, TestSpec = _swebench()
    spec = TestSpec(
        instance_id=instance.instance_id,
        image=instance.image or "",
        eval_script_list=[],
        repo=instance.repo,
        version=instance.version,
        FAIL_TO_PASS=instance.FAIL_TO_PASS,
        PASS_TO_PASS=instance.PASS_TO_PASS,
        log_parser=instance.log_parser,
        eval_type=instance.eval_type,
    )
    prediction = {"instance_id": instance.instance_id, "model_name_or_path": "nemo_polar", "model_patch": model_patch}
    return grading.get_eval_report(spec, prediction, str(log), include_tests_status=True)[instance.instance_id]


class Evaluator:
    """A fresh evaluation sandbox for one instance. ``prepare()`` can run while the agent works (prewarm);
    ``grade()`` then only applies the patch and runs the tests. One grade per evaluator."""

    def __init__(
        self,
        instance: SWEInstance,
        runtime: str | Runtime = "bwrap",
        work_dir: Path | None = None,
        guard: bool = True,
        log_dir: Path | None = None,
    ) -> None:
        """``guard=False`` restores only the test patch's files, as SWE-bench does: for tests that prove a hack
        the guard stops really works. Never for rewards. ``log_dir``: where the evaluation log is kept
        (``<instance_id>.eval.log``); without it the log stays in ``work_dir``, or is gone with the temporary
        directory (then ``log_path`` is None)."""
        self.log_dir = log_dir
        self.instance = instance
        self.guard = guard
        self.environment = instance.environment()
        self.runtime = self.environment.runtime(runtime) if isinstance(runtime, str) else runtime
        self._own_dir = work_dir is None
        base = work_dir or Path(tempfile.mkdtemp(prefix="polar-grade-"))
        self.dir = base / f"{instance.instance_id}-{uuid.uuid4().hex[:8]}"
        self.prepared_s: float | None = None
        self._used = False
        self._tool_env: dict[str, str] = {}

    def prepare(self) -> Evaluator:
        t0 = time.monotonic()
        inst, d = self.instance, self.dir
        eval_dir = d / "eval"
        eval_dir.mkdir(parents=True)
        self.environment.grading_workspace(self.runtime.name, d / "workspace")
        (eval_dir / "test_files.txt").write_text("".join(f + "\n" for f in inst.test_files))
        (eval_dir / "targets.txt").write_text("".join(f + "\n" for f in test_targets(inst)))
        (eval_dir / "apply_cmds.txt").write_text("".join(c + "\n" for c in model_patch_commands()))
        if inst.eval_script is not None:  # the row's own script: it applies the test patch and runs the tests
            parts = testlog.split_eval_script(inst.eval_script)
            (eval_dir / "row_setup.sh").write_text(parts.setup)
            (eval_dir / "test.sh").write_text(parts.tests)
        else:
            (eval_dir / "test.patch").write_text(inst.test_patch)
            (eval_dir / "setup.sh").write_text(inst.setup_command or "")
            (eval_dir / "test.sh").write_text(f"{inst.test_command} {shlex.join(test_targets(inst))}\n")
        for path in EVAL_FILES:
            shutil.copy(path, eval_dir / path.name)
        tool_mounts, self._tool_env = self.environment.tool_mounts()
        mounts = {EVAL_MOUNT: eval_dir, **tool_mounts}
        (d / "home").mkdir()
        (d / "run").mkdir()
        spec = SandboxSpec(workspace=d / "workspace", home=d / "home", run_dir=d / "run", proxy_url=None, mounts=mounts)
        self.runtime.start(spec)
        self.prepared_s = time.monotonic() - t0
        return self

    def grade(self, model_patch: str | None) -> GradeResult:
        if self._used:
            raise RuntimeError("an Evaluator grades one patch: the sandbox must be fresh")
        self._used = True
        inst = self.instance
        if model_patch is None or not model_patch.strip():
            return GradeResult(
                instance_id=inst.instance_id, reward=0.0, resolved=False, status="empty_patch", mask_sample=False
            )
        if self.prepared_s is None:
            self.prepare()
        eval_dir = self.dir / "eval"
        (eval_dir / "model.patch").write_text(model_patch if model_patch.endswith("\n") else model_patch + "\n")
        env = {"POLAR_WORKSPACE": self.runtime.paths.workspace, "POLAR_TEST_TIMEOUT": str(inst.test_timeout_s)}
        env |= self._tool_env
        if inst.eval_script is not None:
            env["POLAR_ROW_EVAL"] = "1"
        # Only eval.sh's first part, before any repository code runs, knows this tag: its messages carry it.
        tag = f"polar-{secrets.token_hex(8)}"
        env |= {"POLAR_TAG": tag, "POLAR_GUARD": "on" if self.guard else "off"}
        t0 = time.monotonic()
        done = self.runtime.exec(
            ["bash", f"{EVAL_MOUNT}/eval.sh"],
            env,
            cwd=None,
            timeout=inst.test_timeout_s + EVAL_SLACK_S,
            log_prefix=self.dir / "eval",
        )
        events, after = guard_events(done.stdout.read_text(errors="replace"), tag)
        result = self._judge_preparation(done, events) or self._judge_tests(model_patch, done, after)
        result.reverted_paths = [e.path for e in events if e.event == "reverted" and e.path is not None]
        result.timings = {"prepare_s": self.prepared_s or 0.0, "eval_s": time.monotonic() - t0}
        result.log_path = self._keep_log(done.stdout)
        return result

    def _keep_log(self, log: Path) -> Path | None:
        if self.log_dir is None:
            return None if self._own_dir else log
        self.log_dir.mkdir(parents=True, exist_ok=True)
        kept = self.log_dir / f"{self.instance.instance_id}.eval.log"
        n = 1
        while kept.exists():  # a second prediction for the instance keeps its own
            n += 1
            kept = self.log_dir / f"{self.instance.instance_id}.{n}.eval.log"
        shutil.copyfile(log, kept)
        return kept

    def _outcome(self, status: Status, reason: str | None = None, **kw: object) -> GradeResult:
        resolved = status == "resolved"
        return GradeResult(
            instance_id=self.instance.instance_id,
            reward=1.0 if resolved else 0.0,
            resolved=resolved,
            status=status,
            mask_sample=status in MASKED,
            reason=reason,
            **kw,  # type: ignore[arg-type]
        )

    def _judge_preparation(self, run: ExecResult, events: list[GuardEvent]) -> GradeResult | None:
        """The outcome when the tests did not get to run; None when they did."""
        final = events[-1].event if events and events[-1].event in FINAL_EVENTS else None
        if final == "ready":
            return None
        if final == "model_patch_failed":
            tried = ", ".join(model_patch_commands())
            return self._outcome("patch_failed", f"the model patch does not apply ({tried})")
        if final == "git_tampered":
            return self._outcome("unresolved", f"the model patch writes into .git ({events[-1].path})")
        if final == "guard_failed":  # only the patch can make it fail: not a way out of a 0
            return self._outcome("unresolved", "the grading guard failed on what the model patch left (see the log)")
        if final == "test_patch_failed":
            return self._outcome("infra_failure", "the instance's test patch does not apply over the base")
        tail = run.stdout.read_text(errors="replace")[-500:]
        why = "timed out" if run.timed_out else f"exited {run.returncode}"
        return self._outcome("infra_failure", f"evaluation sandbox {why} before the tests: {tail}")

    def _judge_tests(self, model_patch: str, run: ExecResult, log: str) -> GradeResult:
        """Grade what was printed after the preparation: the setup command's output, then the tests'."""
        inst = self.instance
        # A test command that exits 124 itself is no timeout: only a run that lasted the whole budget is.
        if run.timed_out or (run.returncode in (124, 137) and run.duration_s >= inst.test_timeout_s):
            return self._outcome("tests_timeout", f"the tests ran past {inst.test_timeout_s:.0f} s")
        output = testlog.test_output(log)
        if output is None:
            return self._outcome("infra_failure", f"evaluation sandbox exited {run.returncode}: {log[-500:]}")
        pytest = testlog.is_pytest_parser(inst.log_parser)
        if pytest:
            report_text = testlog.pytest_report(output)
            if report_text is None:
                why = "pytest printed no final summary line: it crashed, was killed or exited before reporting"
                return self._outcome("unresolved", why)
            output = report_text
        graded = self.dir / "eval.graded.log"
        graded.write_text(testlog.graded_log(output, run.returncode))
        grading, _ = _swebench()
        report = swebench_report(inst, model_patch, graded)
        if not report["patch_successfully_applied"]:
            why = report.get("infra_failure_reason") or "no parseable test output"
            if pytest:  # pytest finished its run: whatever it reported is the patch's doing
                why = f"pytest's report holds no consistent results ({why}, exit {run.returncode})"
                return self._outcome("unresolved", why)
            return self._outcome("infra_failure", f"swebench could not grade the log: {why}")
        tests = report["tests_status"]
        return self._outcome(
            "resolved" if report["resolved"] else "unresolved",
            fail_to_pass=grading.compute_fail_to_pass(tests),
            pass_to_pass=grading.compute_pass_to_pass(tests),
            resolution=grading.get_resolution_status(tests),
            tests_status=tests,
        )

    def close(self) -> None:
        self.runtime.stop()
        if self._own_dir:
            shutil.rmtree(self.dir.parent, ignore_errors=True)

    def __enter__(self) -> Evaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def grade(
    instance: SWEInstance,
    model_patch: str | None,
    runtime: str = "bwrap",
    work_dir: Path | None = None,
    log_dir: Path | None = None,
) -> GradeResult:
    with Evaluator(instance, runtime, work_dir, log_dir=log_dir) as evaluator:
        return evaluator.grade(model_patch)


class Prediction(BaseModel):
    """One row of a SWE-bench predictions file."""

    instance_id: str
    model_patch: str | None
    model_name_or_path: str = "nemo_polar"


def grade_many(
    pairs: list[tuple[SWEInstance, str | None]],
    runtime: str = "bwrap",
    work_dir: Path | None = None,
    prewarm: bool = True,
    log_dir: Path | None = None,
) -> list[GradeResult]:
    """Grade in order; with ``prewarm`` the next evaluator's sandbox is prepared while the current one runs."""
    from concurrent.futures import ThreadPoolExecutor

    if not prewarm:
        return [grade(inst, patch, runtime, work_dir, log_dir) for inst, patch in pairs]
    results: list[GradeResult] = []
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = [Evaluator(inst, runtime, work_dir, log_dir=log_dir) for inst, _ in pairs]
        ready = pool.submit(pending[0].prepare) if pending else None
        for i, (_, patch) in enumerate(pairs):
            assert ready is not None
            evaluator = ready.result()
            ready = pool.submit(pending[i + 1].prepare) if i + 1 < len(pending) else None
            with evaluator:
                results.append(evaluator.grade(patch))
    return results
