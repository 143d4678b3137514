"""Runtimes a harness session can run in: ``bwrap`` (default), ``docker``, ``local`` (no isolation).

``get_runtime(name, image=NAME, workdir="/testbed")`` runs a task's own image (a SWE-bench instance image): ``docker``
runs containers of it; ``bwrap`` runs its root filesystem, unpacked once with skopeo and umoci
(``nemo_polar.sandbox.images``), with no docker daemon."""

from __future__ import annotations

from nemo_polar.sandbox.base import ExecResult, Runtime, RuntimeUnavailable, SandboxPaths, SandboxSpec

RUNTIMES = ("bwrap", "docker", "local")


def get_runtime(name: str, *, image: str | None = None, workdir: str | None = None) -> Runtime:
    """``image``: the sandbox's / is that image's filesystem (bwrap: unpacked at ``start()``); ``workdir``: where the
    workspace appears inside (default /workspace)."""
    if (image is not None or workdir is not None) and name not in ("bwrap", "docker"):
        raise ValueError(f"image= and workdir= are for the bwrap and docker runtimes, not {name!r}")
    if name == "bwrap":
        from nemo_polar.sandbox.bwrap import BwrapRuntime

        return BwrapRuntime(workdir=workdir or "/workspace", image=image)
    if name == "local":
        from nemo_polar.sandbox.local import LocalRuntime

        return LocalRuntime()
    if name == "docker":
        from nemo_polar.sandbox.docker import DockerRuntime

        if image is not None:
            return DockerRuntime(image=image, workdir=workdir or "/workspace", instance_image=True)
        return DockerRuntime(workdir=workdir or "/workspace")
    raise ValueError(f"unknown runtime {name!r}; choose one of {', '.join(RUNTIMES)}")


__all__ = ["RUNTIMES", "ExecResult", "Runtime", "RuntimeUnavailable", "SandboxPaths", "SandboxSpec", "get_runtime"]
