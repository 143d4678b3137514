"""Runtimes a harness session can run in: ``bwrap`` (default), ``docker``, ``local`` (no isolation)."""

from __future__ import annotations

from nemo_polar.sandbox.base import ExecResult, Runtime, RuntimeUnavailable, SandboxPaths, SandboxSpec

RUNTIMES = ("bwrap", "docker", "local")


def get_runtime(name: str) -> Runtime:
    if name == "bwrap":
        from nemo_polar.sandbox.bwrap import BwrapRuntime

        return BwrapRuntime()
    if name == "local":
        from nemo_polar.sandbox.local import LocalRuntime

        return LocalRuntime()
    if name == "docker":
        from nemo_polar.sandbox.docker import DockerRuntime

        return DockerRuntime()
    raise ValueError(f"unknown runtime {name!r}; choose one of {', '.join(RUNTIMES)}")


__all__ = ["RUNTIMES", "ExecResult", "Runtime", "RuntimeUnavailable", "SandboxPaths", "SandboxSpec", "get_runtime"]
