"""bubblewrap runtime (the default): own pid/mount/net/ipc/uts namespaces, read-only system, only the workspace and
the harness home writable, no capabilities, and no network but the relayed proxy."""

from __future__ import annotations

from nemo_polar.sandbox.base import Runtime, SandboxPaths, SandboxSpec
from nemo_polar.sandbox.hostside import ETC, RunDir, base_env, require

HOST_ETC = ["ssl", "ca-certificates", "localtime", "alternatives"]  # read-only, harmless, some tools expect them


class BwrapRuntime(Runtime):
    name = "bwrap"

    def __init__(self) -> None:
        super().__init__()
        self.run: RunDir | None = None

    @property
    def paths(self) -> SandboxPaths:
        return SandboxPaths(workspace="/workspace", home="/root")

    def start(self, spec: SandboxSpec) -> None:
        require(
            "bwrap", "socat", hint="install bubblewrap and socat (`make setup` does: apt-get install bubblewrap socat)"
        )
        self.spec = spec
        self.run = RunDir(spec)
        self.audit = self.run.audit

    def command(self, argv: list[str], env: dict[str, str], cwd: str) -> list[str]:
        assert self.spec is not None, "start() first"
        spec, paths = self.spec, self.paths
        cmd = ["bwrap", "--ro-bind", "/usr", "/usr"]
        for link in ("bin", "lib", "lib64", "sbin"):
            cmd += ["--symlink", f"usr/{link}", f"/{link}"]
        cmd += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--dir", "/etc"]
        for name in ETC:
            cmd += ["--ro-bind", str(spec.run_dir / "etc" / name), f"/etc/{name}"]
        for name in HOST_ETC:
            cmd += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
        cmd += ["--ro-bind", str(spec.run_dir), "/run/polar"]
        cmd += ["--bind", str(spec.workspace), paths.workspace, "--bind", str(spec.home), paths.home]
        for inside, host in spec.mounts.items():  # after the home bind, which would otherwise hide mounts under it
            cmd += ["--ro-bind", str(host), inside]
        cmd += ["--unshare-all", "--hostname", "sandbox", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
        # Binding port 53 for the DNS audit needs this one capability; the sandbox has no route anywhere anyway.
        cmd += ["--cap-add", "CAP_NET_BIND_SERVICE", "--clearenv"]
        for key, value in {**base_env(paths.home, proxy=spec.proxy_url is not None), **env}.items():
            cmd += ["--setenv", key, value]
        cmd += ["--chdir", cwd, "/bin/bash", "/run/polar/init.sh", *argv]
        return cmd

    def stop(self) -> None:
        if self.run is not None:
            self.run.close()
            self.run = None
