"""Run one harness session: a proxy session, a prepared workspace, the real CLI in a runtime, and what it left.

The session directory (an :class:`~nemo_polar.env.runtime.attempt.AttemptDir`) holds everything needed later
(reconstruction, grading, viewing): the result, the proxy's call records, the patch, the CLI's logs and transcript.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from nemo_polar.env.harness import Endpoint, Harness
from nemo_polar.env.harness.base import HARNESS_MOUNT
from nemo_polar.env.harness.script import Action
from nemo_polar.env.runtime.attempt import AttemptDir
from nemo_polar.proxy.http.client import ProxyClient
from nemo_polar.proxy.store.records import CallRecord
from nemo_polar.sandbox import Runtime, SandboxSpec
from nemo_polar.sandbox.base import PROXY_UNREACHABLE, ExecResult
from nemo_polar.sandbox.egress import EgressAttempt
from nemo_polar.sandbox.workspace import Task, extract_patch, prepare_workspace

Status = Literal["completed", "harness_error", "timeout", "cancelled", "proxy_unreachable"]


class SessionResult(BaseModel):
    session_id: str
    harness: str
    harness_version: str
    runtime: str
    instance_id: str
    status: Status
    exit_code: int | None
    error: str | None = None
    patch: str = ""
    calls: int = 0
    egress: list[EgressAttempt] = Field(default_factory=list, description="refused attempts to reach anything else")
    timings: dict[str, float] = Field(default_factory=dict)
    session_dir: Path
    records: list[CallRecord] = Field(default_factory=list, exclude=True)
    transcript: Any = Field(default=None, exclude=True)


def scripted_config(harness: Harness, script: list[Action], workspace: str) -> dict[str, Any]:
    turns = [harness.action_turn(a, workspace).model_dump() for a in script]
    # A turn takes fewer tokens than its JSON has characters, its format's markup included; free turns stay short.
    cap = max([512, *(len(json.dumps(t)) + 64 for t in turns)])
    return {"script": turns, "sampling_overrides": {"max_tokens": cap}}


def run_session(
    harness: Harness,
    task: Task,
    runtime: Runtime,
    proxy: ProxyClient,
    session_dir: Path,
    *,
    script: list[Action] | None = None,
    session_config: dict[str, Any] | None = None,
    timeout: float = 600.0,
    model: str = "local-model",
    mounts: dict[str, Path] | None = None,
    env: dict[str, str] | None = None,
    workspace_ready: bool = False,
    cancel: threading.Event | None = None,
) -> SessionResult:
    """``mounts`` (read-only, path inside -> host path) and ``env`` give the CLI's tools the task's environment,
    e.g. a Python virtualenv first on ``PATH``."""
    t0 = time.monotonic()
    attempt = AttemptDir(session_dir)
    spec = _sandbox(harness, attempt, proxy.url, mounts)
    if not workspace_ready:  # a gateway prepares it ahead, in its INIT stage
        prepare_workspace(task, attempt.workspace)
    session_id: str | None = None
    try:
        with runtime:
            runtime.start(spec)
            paths = runtime.paths
            config = _proxy_session(harness, task, script, session_config, paths.workspace)
            session_id, api_key = proxy.create_session(config)
            endpoint = Endpoint(base_url=runtime.proxy_base_url, api_key=api_key, model=model)
            launch = harness.launch(
                task.problem_statement,
                endpoint,
                root=runtime.where(HARNESS_MOUNT),
                home=paths.home,
                workspace=paths.workspace,
            )
            for rel, text in launch.files.items():  # the CLI's own config files, in its home
                (attempt.home / rel).parent.mkdir(parents=True, exist_ok=True)
                (attempt.home / rel).write_text(text)
            t_run = time.monotonic()
            done = runtime.exec(
                launch.argv,
                {**(env or {}), **launch.env},
                cwd=paths.workspace,
                timeout=timeout,
                log_prefix=attempt.harness_logs,
                cancel=cancel,
            )
            t_post = time.monotonic()
            egress = runtime.egress_attempts()
        records = proxy.records(session_id)
    finally:
        # The key stops working on every path out (a failed launch or exec included): nothing left in the sandbox
        # can call the model on this session after the runner has moved on.
        if session_id is not None:
            close_quietly(proxy, session_id)
    status, error = _outcome(done, timeout)
    patch = extract_patch(attempt.workspace, harness.excludes())
    transcript = harness.transcript(done.stdout.read_text(errors="replace"))
    result = SessionResult(
        session_id=session_id,
        harness=harness.name,
        harness_version=harness.version,
        runtime=runtime.name,
        instance_id=task.instance_id,
        status=status,
        exit_code=done.returncode,
        error=error,
        patch=patch,
        calls=len(records),
        egress=egress,
        timings={"setup_s": t_run - t0, "run_s": t_post - t_run, "collect_s": time.monotonic() - t_post},
        session_dir=session_dir,
        records=records,
        transcript=transcript,
    )
    write_session(result)
    return result


def _sandbox(harness: Harness, attempt: AttemptDir, proxy_url: str, mounts: dict[str, Path] | None) -> SandboxSpec:
    """The attempt's folders made, and the sandbox that runs the CLI in them (the CLI's install mounted read-only)."""
    root = harness.require()
    attempt.root.mkdir(parents=True, exist_ok=True)
    attempt.home.mkdir(exist_ok=True)
    attempt.run.mkdir(exist_ok=True)
    return SandboxSpec(
        workspace=attempt.workspace,
        home=attempt.home,
        run_dir=attempt.run,
        proxy_url=proxy_url,
        mounts={HARNESS_MOUNT: root, **(mounts or {})},
    )


def _proxy_session(
    harness: Harness,
    task: Task,
    script: list[Action] | None,
    session_config: dict[str, Any] | None,
    workspace: str,
) -> dict[str, Any]:
    """The proxy session's config: the caller's, over the scripted policy's turns if any, with the harness and the
    instance in its metadata."""
    config: dict[str, Any] = {**(session_config or {})}
    if script:
        config = {**scripted_config(harness, script, workspace), **config}
    config["metadata"] = {"harness": harness.name, "instance_id": task.instance_id, **config.get("metadata", {})}
    return config


def _outcome(done: ExecResult, timeout: float) -> tuple[Status, str | None]:
    """How the CLI's run ended, and why where it did not complete."""
    stderr = done.stderr.read_text(errors="replace")
    if done.cancelled:
        return "cancelled", "cancelled while the harness ran; process group killed"
    if done.timed_out:
        return "timeout", f"harness exceeded {timeout:.0f} s; process group killed"
    if done.returncode == PROXY_UNREACHABLE and "polar: the model proxy is not reachable" in stderr:
        return "proxy_unreachable", stderr.strip().splitlines()[-1]
    if done.returncode != 0:
        return "harness_error", f"exit {done.returncode}: {stderr.strip()[-2000:]}"
    return "completed", None


def close_quietly(proxy: ProxyClient, session_id: str) -> None:
    """Close a proxy session on a path that is already failing or finishing; a proxy that is gone has no key left."""
    with contextlib.suppress(ConnectionError, RuntimeError):
        proxy.close(session_id)


def write_session(result: SessionResult) -> None:
    d = AttemptDir(result.session_dir)
    d.records.write_text("".join(r.model_dump_json() + "\n" for r in result.records))
    d.patch.write_text(result.patch)
    d.transcript.write_text(json.dumps(result.transcript, indent=1))
    d.session.write_text(result.model_dump_json(indent=2))


def read_session(attempt: AttemptDir) -> SessionResult | None:
    """A session written by :func:`write_session`, with its records; None when it never finished."""
    if not attempt.session.exists():
        return None
    result = SessionResult.model_validate_json(attempt.session.read_text())
    result.records = attempt.read_records()
    return result
