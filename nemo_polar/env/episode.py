"""One episode on a SWE instance: a harness session in the agent's sandbox, then the patch graded by swebench in a
fresh one (prepared while the agent runs). The gateway stages many of these; tests and the demo run one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel

from nemo_polar.env.harness import Harness
from nemo_polar.env.runtime import get_runtime
from nemo_polar.env.script import script_adapter
from nemo_polar.env.session import SessionResult, run_session
from nemo_polar.proxy.client import ProxyClient
from nemo_polar.rewards.grader import Evaluator, GradeResult
from nemo_polar.rewards.instance import SWEInstance


class Episode(BaseModel):
    session: SessionResult
    grade: GradeResult | None  # None when the session itself failed (its status says why)

    @property
    def reward(self) -> float | None:
        return None if self.grade is None or self.grade.mask_sample else self.grade.reward


def task_environment(instance: SWEInstance) -> tuple[dict[str, Path], dict[str, str]]:
    """Mounts and environment that give the agent's tools the instance's Python (tests runnable in the sandbox)."""
    if instance.python_env is None:
        return {}, {}
    env = {"PATH": f"{instance.python_env}/bin:/usr/local/bin:/usr/bin:/bin", "VIRTUAL_ENV": str(instance.python_env)}
    return {str(instance.python_env): instance.python_env}, env


def run_episode(
    harness: Harness,
    instance: SWEInstance,
    proxy: ProxyClient,
    session_dir: Path,
    *,
    runtime: str = "bwrap",
    scripted: bool = False,
    timeout: float = 600.0,
    session_config: dict[str, Any] | None = None,
) -> Episode:
    script = script_adapter.validate_python(instance.script) if scripted and instance.script else None
    mounts, env = task_environment(instance)
    evaluator = Evaluator(instance, runtime, work_dir=session_dir / "eval").prepare()  # prewarmed
    try:
        session = run_session(
            harness,
            instance.task(),
            get_runtime(runtime),
            proxy,
            session_dir,
            script=script,
            session_config=session_config,
            timeout=timeout,
            mounts=mounts,
            env=env,
        )
        graded = evaluator.grade(session.patch) if session.status == "completed" else None
    finally:
        evaluator.close()
    if graded is not None:
        (session_dir / "grade.json").write_text(graded.model_dump_json(indent=2))
    return Episode(session=session, grade=graded)
