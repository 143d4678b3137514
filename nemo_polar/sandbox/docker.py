"""Docker runtime: one container per session from a locally built image (``scripts/setup_docker.sh``), with no
network at all, no capabilities, a read-only root, CPU/memory/pids limits, and the same view as bwrap: the workspace
and home writable, the harness installs and the host's node read-only, and the proxy reached through the relays.

A grading container (no proxy) is the image as swebench's harness runs it (``create_container``): root, docker's
default capabilities (not the CAP_SYS_ADMIN swebench adds for browser sandboxes: in a container on cgroup v1 it is a
way out), the image's own environment, /etc and home, its root writable; only the network is off and the
limits stay. Commands run through ``docker exec``: an agent's through the same ``init.sh`` (fail-fast proxy check),
a grader's as they are. The relays themselves belong to the container's first process, which keeps them for its
lifetime: an exec's own relays would hold its output open, and ``docker exec`` waits for that (2 s per exec).
``init.sh`` finds the ports taken, its relays exit at once, and its proxy check runs as under bwrap. Killing a
``docker exec`` client leaves the command running in the container, so a timeout also kills, inside, everything
outside the first process's session.

The runtime does not start a daemon or build the image itself: that needs root, so ``make docker`` does it once.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nemo_polar.sandbox.base import (
    PROXY_PORT,
    ExecResult,
    HostCommand,
    Runtime,
    RuntimeUnavailable,
    SandboxPaths,
    SandboxSpec,
)
from nemo_polar.sandbox.hostside import AUDIT_RESOLV, DEFAULT_PATH, RunDir, base_env, require

if TYPE_CHECKING:
    from docker import DockerClient
    from docker.models.containers import Container
    from docker.models.images import Image

    from nemo_polar.sandbox.images import HostTools

IMAGE = "nemo-polar/runtime:1"
GRADING_USER = "root"  # swebench.image_builder.constants.CONTAINER_USER (5.0.2), the user its harness runs as
SETUP = "run `make docker` (scripts/setup_docker.sh: installs docker.io, starts dockerd, builds the image)"
RUN = "/run/polar"
LABEL = "nemo_polar.runtime"
READY = "polar-relays-ready"


def keeper(proxy: bool) -> str:
    """The container's first process: init.sh's relays (an agent's: the DNS audit and the proxy), held for the
    container's lifetime, then a reaper loop (bash reaps orphans; a timeout kill ends its sleep, not it). Ready once
    they all listen (/proc/net: hex ports, 0A = LISTEN); probing them by connecting would show up in the audit."""
    relays, listening = [], []
    if proxy:
        relays += [
            f"UDP4-RECVFROM:53,bind=127.0.0.1,fork UNIX-CONNECT:{RUN}/egress-dns.sock",
            f"TCP-LISTEN:{PROXY_PORT},bind=127.0.0.1,fork,reuseaddr UNIX-CONNECT:{RUN}/proxy.sock",
        ]
        listening += ["grep -q ':0035 ' /proc/net/udp", f"grep -q ':{PROXY_PORT:04X} 00000000:0000 0A' /proc/net/tcp"]
    wait = f"for _ in $(seq 500); do {' && '.join(listening)} && break; sleep 0.01; done\n" if listening else ""
    return "".join(f"socat {r} 2>/dev/null &\n" for r in relays) + (
        f"{wait}echo {READY}\ntrap 'exit 0' TERM\nwhile :; do sleep 86400 & wait $!; done\n"
    )


def docker_client(timeout: float = 60) -> DockerClient:
    try:
        import docker
        from docker.errors import DockerException
    except ImportError:
        raise RuntimeUnavailable("the docker runtime needs the docker SDK: pip install 'docker>=7'") from None
    try:
        client = docker.from_env(timeout=int(timeout))
        client.ping()
    except DockerException as exc:
        raise RuntimeUnavailable(f"no docker daemon answers ({exc}); {SETUP}") from None
    return client


def find_image(client: DockerClient, name: str, pull: bool) -> Image:
    """The daemon's image ``name``; with ``pull`` (a task's own image) pulled by name if the daemon lacks it."""
    from docker.errors import ImageNotFound

    from nemo_polar.sandbox.sif import is_sif

    if is_sif(name):
        raise RuntimeUnavailable(f"image {name} is an Apptainer SIF file: docker cannot run it; use runtime bwrap")
    try:
        return client.images.get(name)
    except ImageNotFound:
        if not pull:
            raise RuntimeUnavailable(f"docker image {name} is missing; {SETUP}") from None
    try:
        return client.images.pull(name)
    except Exception as exc:  # no registry reachable, unknown name, no credentials
        raise RuntimeUnavailable(f"image {name} is not on this docker daemon and not pullable: {exc}") from None


# Variables the docker client reads itself (where its config is, how it reaches the daemon, its temp files).
CLIENT_READS = {
    "PATH", "HOME", "TMPDIR", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy",
    "DOCKER_HOST", "DOCKER_CONFIG", "DOCKER_CONTEXT", "DOCKER_CERT_PATH", "DOCKER_TLS_VERIFY",
}  # fmt: skip


class DockerRuntime(Runtime):
    name = "docker"

    def __init__(
        self,
        image: str | None = None,
        *,
        cpus: float = 2.0,
        memory: str = "4g",
        pids: int = 1024,
        node: Path | None = None,
        workdir: str = "/workspace",
        instance_image: bool = False,
    ) -> None:
        """``instance_image``: ``image`` is a task's own (SWE-bench's: the code at ``workdir``, its environment
        installed around it), pulled by name if the daemon lacks it; its root stays writable, as swebench's
        harness runs it (eval scripts may write outside the tree), and every container is fresh."""
        super().__init__()
        self.image = image or os.environ.get("POLAR_DOCKER_IMAGE") or IMAGE
        self.workdir = workdir
        self.instance_image = instance_image
        self.host: HostTools | None = None
        self.path = ""  # an instance image's PATH inside
        self.cpus = min(cpus, os.cpu_count() or 1)  # the daemon refuses more CPUs than the machine has
        self.memory = memory
        self.pids = pids
        self.node = node
        self.client: DockerClient | None = None
        self.container: Container | None = None
        self.run: RunDir | None = None

    @property
    def paths(self) -> SandboxPaths:
        return SandboxPaths(workspace=self.workdir, home="/root")

    def start(self, spec: SandboxSpec) -> None:
        require("docker", "socat", hint=f"install docker.io and socat; {SETUP}")
        node = self.node or (Path(found).resolve() if (found := shutil.which("node")) else None)
        if node is None or not node.is_file():
            raise RuntimeUnavailable("node not found on the host: the harnesses run on the host's node, bound in")
        client = docker_client()
        try:
            found = find_image(client, self.image, pull=self.instance_image)
        except RuntimeUnavailable:
            client.close()
            raise
        self.client = client
        grading = spec.proxy_url is None
        if self.instance_image and not grading:  # its own PATH (conda's...), with the host's socat and node first
            from nemo_polar.sandbox.images import HOST_BIN, host_tools

            self.host = host_tools()
            image_env = dict(e.split("=", 1) for e in found.attrs["Config"].get("Env") or [] if "=" in e)
            self.path = f"{HOST_BIN}:{image_env.get('PATH') or DEFAULT_PATH}"

        self.spec = spec
        self.run = RunDir(spec, {} if grading else {"resolv.conf": AUDIT_RESOLV})
        self.audit = self.run.audit
        command = ["/bin/bash", "-c", keeper(proxy=not grading)]
        config = self._grading_config(spec) if grading else self._config(spec, node)
        if self.path:
            config["environment"] = {"PATH": self.path}
        self.container = client.containers.run(self.image, command, **config)
        self._wait_ready()

    def _config(self, spec: SandboxSpec, node: Path) -> dict[str, Any]:
        from docker.types import Mount

        def bind(target: str, source: Path, read_only: bool = True) -> Mount:
            return Mount(target, str(source), type="bind", read_only=read_only)

        mounts = [bind("/etc/resolv.conf", spec.run_dir / "etc" / "resolv.conf"), bind(RUN, spec.run_dir)]
        if self.host is None:
            mounts.append(bind("/usr/bin/node", node))
        else:  # a task's image has its own libc, or no node: the host's tools, patched to load the host's libraries
            from nemo_polar.sandbox.images import HOST_BIN, HOST_ROOT

            mounts += [bind(HOST_ROOT + d, Path(d)) for d in self.host.binds]
            mounts.append(bind(HOST_BIN, self.host.bin_dir))
        mounts += [bind(inside, host) for inside, host in spec.mounts.items()]
        mounts += [bind(self.paths.workspace, spec.workspace, False), bind(self.paths.home, spec.home, False)]
        return {
            **self._limits(spec),
            "mounts": mounts,
            # As under bwrap: the caller's own uid, so what the harness writes stays the caller's.
            "user": f"{os.getuid()}:{os.getgid()}",
            "read_only": not self.instance_image,
            "tmpfs": {"/tmp": "rw,exec,nosuid,nodev,mode=1777"},
            # No capabilities at all: the DNS audit's port 53 is made unprivileged in the container's own netns.
            "cap_drop": ["ALL"],
            "sysctls": {"net.ipv4.ip_unprivileged_port_start": "0"},
            "security_opt": ["no-new-privileges"],
        }

    def _grading_config(self, spec: SandboxSpec) -> dict[str, Any]:
        """swebench's container (``create_container``: root, docker's default capabilities, the image's own home,
        /etc and /tmp, its root writable), with no network, the limits and the grader's read-only mounts."""
        from docker.types import Mount

        mounts = [Mount(inside, str(host), type="bind", read_only=True) for inside, host in spec.mounts.items()]
        mounts.append(Mount(self.paths.workspace, str(spec.workspace), type="bind", read_only=False))
        return {**self._limits(spec), "mounts": mounts, "user": GRADING_USER}

    def _limits(self, spec: SandboxSpec) -> dict[str, Any]:
        return {
            "detach": True,
            "network_mode": "none",
            "working_dir": self.paths.workspace,
            "nano_cpus": int(self.cpus * 1e9),
            "mem_limit": self.memory,
            "memswap_limit": self.memory,
            "pids_limit": self.pids,
            "labels": {LABEL: self.name, f"{LABEL}.run_dir": str(spec.run_dir)},
        }

    def _wait_ready(self, timeout: float = 10.0) -> None:
        assert self.container is not None
        deadline = time.monotonic() + timeout
        while READY.encode() not in self.container.logs():
            self.container.reload()
            if self.container.status != "running" or time.monotonic() > deadline:
                logs = self.container.logs().decode(errors="replace")[-2000:]
                raise RuntimeError(f"docker sandbox did not start (status {self.container.status}): {logs}")
            time.sleep(0.01)

    def command(self, argv: list[str], env: dict[str, str], cwd: str) -> HostCommand:
        assert self.spec is not None and self.container is not None, "start() first"
        cmd = [shutil.which("docker") or "docker", "exec", "-i", "-w", cwd]
        if self.spec.proxy_url is None:  # grading: the container's own environment, and the grader's variables
            full_env = dict(env)
        else:  # an instance image's environment is the container's; the runtime image's is the sandbox's own
            full_env = {} if self.instance_image else base_env(self.paths.home)
            if self.path:
                full_env["PATH"] = self.path
            full_env.update(env)
            if self.path and "PATH" in env:  # a caller's PATH still finds the host's tools
                full_env["PATH"] = f"{self.path.split(':', 1)[0]}:{env['PATH']}"
            full_env["POLAR_PROXY_PORT"] = str(PROXY_PORT)
            argv = ["/bin/bash", f"{RUN}/init.sh", *argv]
        # ``-e NAME`` hands the container the docker client's own value of NAME: the values ride in the client's
        # environment, not its argv. The few the client itself reads (its PATH, HOME, proxies) keep the host's and
        # go on argv: they are the sandbox's settings, not secrets.
        own = {k: v for k, v in full_env.items() if k in CLIENT_READS}
        cmd += [a for k, v in full_env.items() for a in ("-e", f"{k}={v}" if k in own else k)]
        client_env = {**os.environ, **{k: v for k, v in full_env.items() if k not in own}}
        return HostCommand([*cmd, self.container.id, *argv], client_env)

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
        done = super().exec(argv, env, cwd=cwd, timeout=timeout, log_prefix=log_prefix, cancel=cancel)
        if done.timed_out or done.cancelled:
            self.kill_commands()
        return done

    def kill_commands(self) -> None:
        """Kill every command in the container: all processes outside the first one's session (the relays')."""
        from docker.errors import APIError

        # The container may be gone already (an OOM kill of pid 1): then nothing is left to kill.
        if self.container is not None:
            with contextlib.suppress(APIError):
                self.container.exec_run(["pkill", "-KILL", "--inverse", "--session", "1"])

    def stop(self) -> None:
        if self.container is not None:
            from docker.errors import APIError, NotFound

            if self.spec is not None and self.spec.proxy_url is None and os.getuid() != 0:
                # The grader ran as root: what it wrote into the bound workspace goes back to the caller.
                with contextlib.suppress(APIError):
                    owner = f"{os.getuid()}:{os.getgid()}"
                    self.container.exec_run(["chown", "-R", owner, self.paths.workspace], user="root")
            with contextlib.suppress(NotFound):
                self.container.remove(force=True)
            self.container = None
        if self.client is not None:
            self.client.close()
            self.client = None
        if self.run is not None:
            self.run.close()
            self.run = None
