"""Grade a patch with SWE-bench's own functions, in a fresh sandbox that is never the one the agent ran in.

Rewards follow the paper: 1.0 if resolved, else 0.0. What is trainable matters as much: an empty patch or one
that does not apply is a real 0 (the policy produced it); a test-suite timeout, a test patch that does not apply
or a sandbox failure is the infrastructure's fault and gets ``mask_sample`` (never trained on), with the reason.
"""

from __future__ import annotations

import shlex
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from nemo_polar.env.runtime import Runtime, SandboxSpec, get_runtime
from nemo_polar.env.workspace import prepare_workspace
from nemo_polar.rewards.instance import SWEInstance

EVAL_SCRIPT = Path(__file__).with_name("eval.sh")
EVAL_MOUNT = "/polar/eval"
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
    timings: dict[str, float] = Field(default_factory=dict)
    log_path: Path | None = None


def _swebench():
    """swebench's grading functions (imported lazily: the package pulls in datasets, docker, modal)."""
    from swebench.harness import grading
    from swebench.types import TestSpec

    return grading, TestSpec


def test_targets(instance: SWEInstance) -> list[str]:
    """The test files to run: those of the F2P/P2P ids and of the test patch (SWE-bench runs the latter)."""
    files = [t.split("::")[0] for t in [*instance.FAIL_TO_PASS, *instance.PASS_TO_PASS]]
    return list(dict.fromkeys([*files, *instance.test_files]))


class Evaluator:
    """A fresh evaluation sandbox for one instance. ``prepare()`` can run while the agent works (prewarm);
    ``grade()`` then only applies the patch and runs the tests. One grade per evaluator."""

    def __init__(self, instance: SWEInstance, runtime: str | Runtime = "bwrap", work_dir: Path | None = None) -> None:
        self.instance = instance
        self.runtime = get_runtime(runtime) if isinstance(runtime, str) else runtime
        self._own_dir = work_dir is None
        base = work_dir or Path(tempfile.mkdtemp(prefix="polar-grade-"))
        self.dir = base / f"{instance.instance_id}-{uuid.uuid4().hex[:8]}"
        self.prepared_s: float | None = None
        self._used = False

    def prepare(self) -> Evaluator:
        t0 = time.monotonic()
        inst, d = self.instance, self.dir
        eval_dir = d / "eval"
        eval_dir.mkdir(parents=True)
        prepare_workspace(inst.task(), d / "workspace")
        (eval_dir / "test.patch").write_text(inst.test_patch)
        (eval_dir / "test_files.txt").write_text("".join(f + "\n" for f in inst.test_files))
        (eval_dir / "setup.sh").write_text(inst.setup_command or "")
        (eval_dir / "test.sh").write_text(f"{inst.test_command} {shlex.join(test_targets(inst))}\n")
        shutil.copy(EVAL_SCRIPT, eval_dir / "eval.sh")
        mounts = {EVAL_MOUNT: eval_dir}
        if inst.python_env is not None:
            if not (inst.python_env / "bin" / "python").exists():
                raise FileNotFoundError(
                    f"python_env {inst.python_env} of {inst.instance_id} does not exist; run make setup"
                )
            mounts[str(inst.python_env)] = inst.python_env
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
        if inst.python_env is not None:
            env["PATH"] = f"{inst.python_env}/bin:/usr/local/bin:/usr/bin:/bin"
            env["VIRTUAL_ENV"] = str(inst.python_env)
        t0 = time.monotonic()
        done = self.runtime.exec(
            ["bash", f"{EVAL_MOUNT}/eval.sh"],
            env,
            cwd=None,
            timeout=inst.test_timeout_s + 60,
            log_prefix=self.dir / "eval",
        )
        timings = {"prepare_s": self.prepared_s or 0.0, "eval_s": time.monotonic() - t0}
        log = done.stdout
        result = self._judge(model_patch, log, done.timed_out, done.returncode)
        result.timings, result.log_path = timings, log
        return result

    def _judge(self, model_patch: str, log: Path, timed_out: bool, code: int | None) -> GradeResult:
        inst = self.instance
        grading, TestSpec = _swebench()
        text = log.read_text(errors="replace")

        def outcome(status: Status, reason: str | None = None, **kw: object) -> GradeResult:
            resolved = status == "resolved"
            return GradeResult(
                instance_id=inst.instance_id,
                reward=1.0 if resolved else 0.0,
                resolved=resolved,
                status=status,
                mask_sample=status in MASKED,
                reason=reason,
                **kw,  # type: ignore[arg-type]
            )

        if timed_out or ">>>>> Tests Timed Out" in text:
            return outcome("tests_timeout", f"the tests ran past {inst.test_timeout_s:.0f} s")
        if "polar: model patch does not apply" in text:
            return outcome("patch_failed", "the model patch does not apply (git apply, patch --fuzz=5)")
        if "polar: test patch does not apply" in text:
            return outcome("infra_failure", "the instance's test patch does not apply over the base")
        if code != 0:
            return outcome("infra_failure", f"evaluation sandbox exited {code}: {text[-500:]}")
        spec = TestSpec(
            instance_id=inst.instance_id,
            image=inst.image or "",
            eval_script_list=[],
            repo=inst.repo,
            version=inst.version,
            FAIL_TO_PASS=inst.FAIL_TO_PASS,
            PASS_TO_PASS=inst.PASS_TO_PASS,
            log_parser=inst.log_parser,
            eval_type="pass_and_fail",
        )
        prediction = {"instance_id": inst.instance_id, "model_name_or_path": "nemo_polar", "model_patch": model_patch}
        report = grading.get_eval_report(spec, prediction, str(log), include_tests_status=True)[inst.instance_id]
        if not report["patch_successfully_applied"]:
            why = report.get("infra_failure_reason") or "no parseable test output"
            return outcome("infra_failure", f"swebench could not grade the log: {why}")
        tests = report["tests_status"]
        return outcome(
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
    instance: SWEInstance, model_patch: str | None, runtime: str = "bwrap", work_dir: Path | None = None
) -> GradeResult:
    with Evaluator(instance, runtime, work_dir) as evaluator:
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
) -> list[GradeResult]:
    """Grade in order; with ``prewarm`` the next evaluator's sandbox is prepared while the current one runs."""
    from concurrent.futures import ThreadPoolExecutor

    if not prewarm:
        return [grade(inst, patch, runtime, work_dir) for inst, patch in pairs]
    results: list[GradeResult] = []
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = [Evaluator(inst, runtime, work_dir) for inst, _ in pairs]
        ready = pool.submit(pending[0].prepare) if pending else None
        for i, (_, patch) in enumerate(pairs):
            assert ready is not None
            evaluator = ready.result()
            ready = pool.submit(pending[i + 1].prepare) if i + 1 < len(pending) else None
            with evaluator:
                results.append(evaluator.grade(patch))
    return results
