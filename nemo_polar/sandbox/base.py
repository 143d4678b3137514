"""The runtime interface: where a harness runs, and its only route out (the model proxy).

A runtime gives a harness a writable workspace (a git checkout), a writable home for its config files, the pinned
CLI installs read-only, and one network route: the proxy, reached on a loopback port inside the sandbox that a
relay forwards over a Unix socket bound in from the host. Every name a CLI looks up is refused and recorded by the
egress audit; an address has no route. A grading sandbox (``proxy_url=None``) has neither route nor audit: over an
instance image it is the image as swebench's harness runs it (hostside.py, docs/grading_environment.md).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import ClassVar, NamedTuple

from pydantic import BaseModel, Field

from nemo_polar.sandbox.egress import EgressAttempt, EgressAudit


class RuntimeUnavailable(RuntimeError):
    """The runtime's tooling is missing on this machine; the message says what to install."""


class SandboxSpec(BaseModel):
    workspace: Path = Field(description="host directory with the task checkout; writable inside")
    home: Path = Field(description="host directory used as the harness's HOME; writable inside")
    run_dir: Path = Field(description="host directory for sockets and generated files")
    proxy_url: str | None = Field(
        description="the proxy's model API (never its admin listener) as the host reaches it, e.g. "
        "http://127.0.0.1:8000; None: no route out at all (grading)"
    )
    mounts: dict[str, Path] = Field(default_factory=dict, description="read-only: path inside -> host path")


class HostCommand(NamedTuple):
    """A host command line and the environment it runs with. What the command inside sees travels in ``env``,
    never on the command line: a session's API key in argv is readable by every local user (/proc/<pid>/cmdline),
    its environment only by its owner."""

    argv: list[str]
    env: dict[str, str]


class SandboxPaths(BaseModel):
    """Paths as the harness sees them inside the runtime."""

    workspace: str
    home: str


class ExecResult(BaseModel):
    argv: list[str]
    returncode: int | None = Field(description="None when the command was killed (timeout or cancel)")
    timed_out: bool
    cancelled: bool = False
    duration_s: float
    stdout: Path
    stderr: Path


PROXY_PORT = 18080  # inside the sandbox's own network namespace, so a fixed port never collides
PROXY_UNREACHABLE = 97  # exit status of the sandbox init when the proxy does not answer /health


class Runtime(ABC):
    name: ClassVar[str]

    def __init__(self) -> None:
        self.spec: SandboxSpec | None = None
        self.audit: EgressAudit | None = None

    @property
    @abstractmethod
    def paths(self) -> SandboxPaths: ...

    def where(self, inside: str) -> str:
        """Where a read-only mount of ``spec.mounts`` appears to the harness."""
        return inside

    @property
    def proxy_base_url(self) -> str:
        """The proxy's URL as a harness inside the runtime must use it (no trailing /v1)."""
        return f"http://127.0.0.1:{PROXY_PORT}"

    @abstractmethod
    def start(self, spec: SandboxSpec) -> None: ...

    @abstractmethod
    def command(self, argv: list[str], env: dict[str, str], cwd: str) -> HostCommand:
        """How the host runs ``argv`` inside the runtime with ``env`` (and the runtime's own variables)."""

    def exec(
        self,
        argv: list[str],
        env: dict[str, str],
        *,
        cwd: str | None,
        timeout: float,
        log_prefix: Path,
        cancel: threading.Event | None = None,
    ) -> ExecResult:
        """Run a command inside; on timeout or ``cancel`` the whole process group is killed."""
        stdout, stderr = log_prefix.with_suffix(".stdout.log"), log_prefix.with_suffix(".stderr.log")
        launch = self.command(argv, env, cwd or self.paths.workspace)
        t0 = time.monotonic()
        code: int | None = None
        timed_out = cancelled = False
        with stdout.open("wb") as out, stderr.open("wb") as err:
            proc = subprocess.Popen(
                launch.argv, env=launch.env, stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True
            )
            while code is None:
                try:
                    code = proc.wait(timeout=0.2)
                except subprocess.TimeoutExpired:
                    cancelled = cancel is not None and cancel.is_set()
                    timed_out = time.monotonic() - t0 > timeout
                    if cancelled or timed_out:
                        kill_group(proc)
                        break
        return ExecResult(
            argv=argv,
            returncode=code,
            timed_out=timed_out,
            cancelled=cancelled,
            duration_s=time.monotonic() - t0,
            stdout=stdout,
            stderr=stderr,
        )

    def egress_attempts(self) -> list[EgressAttempt]:
        return list(self.audit.attempts) if self.audit else []

    @abstractmethod
    def stop(self) -> None: ...

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def kill_group(proc: subprocess.Popen, grace: float = 3.0) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue
