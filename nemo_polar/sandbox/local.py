"""No isolation at all: the harness runs on the host and talks to the proxy directly. Development only."""

from __future__ import annotations

import logging
import os

from nemo_polar.sandbox.base import HostCommand, Runtime, SandboxPaths, SandboxSpec

log = logging.getLogger(__name__)


class LocalRuntime(Runtime):
    name = "local"

    @property
    def paths(self) -> SandboxPaths:
        assert self.spec is not None, "start() first"
        return SandboxPaths(workspace=str(self.spec.workspace), home=str(self.spec.home))

    def where(self, inside: str) -> str:
        assert self.spec is not None, "start() first"
        return str(self.spec.mounts[inside])

    @property
    def proxy_base_url(self) -> str:
        assert self.spec is not None, "start() first"
        return self.spec.proxy_url.rstrip("/")

    def start(self, spec: SandboxSpec) -> None:
        log.warning("runtime=local: NO ISOLATION - the harness runs on this machine with full network access")
        self.spec = spec

    def command(self, argv: list[str], env: dict[str, str], cwd: str) -> HostCommand:
        assert self.spec is not None, "start() first"
        # Mounts are host paths already; the harness sees the host's filesystem.
        base = {k: os.environ[k] for k in ("PATH", "LANG", "TERM") if k in os.environ}
        environment = {**base, "HOME": str(self.spec.home), **env}
        return HostCommand(["sh", "-c", 'cd "$0" && exec "$@"', cwd, *argv], environment)

    def stop(self) -> None:
        pass
