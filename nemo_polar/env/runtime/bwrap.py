"""bubblewrap runtime (the default): own pid/mount/net/ipc/uts namespaces, read-only system, only the workspace and
the harness home writable, no capabilities, and no network but the relayed proxy."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

from nemo_polar.env.runtime.base import PROXY_PORT, Runtime, RuntimeUnavailable, SandboxPaths, SandboxSpec, kill_group
from nemo_polar.env.runtime.egress import EgressAudit

INIT = Path(__file__).with_name("init.sh")
ETC = {
    "resolv.conf": "nameserver 127.0.0.1\n",
    "hosts": "127.0.0.1 localhost\n::1 localhost\n",
    "passwd": "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
    "group": "root:x:0:\nnogroup:x:65534:\n",
    "nsswitch.conf": "passwd: files\ngroup: files\nhosts: files dns\n",
}
HOST_ETC = ["ssl", "ca-certificates", "localtime", "alternatives"]  # read-only, harmless, some tools expect them


def require(*tools: str, hint: str) -> None:
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        raise RuntimeUnavailable(f"{', '.join(missing)} not found on PATH: {hint}")


def base_env(home: str) -> dict[str, str]:
    proxy = "http://127.0.0.1:3128"
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": home,
        "USER": "root",
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "TMPDIR": "/tmp",
        "HTTP_PROXY": proxy,
        "HTTPS_PROXY": proxy,
        "http_proxy": proxy,
        "https_proxy": proxy,
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
        "NODE_USE_ENV_PROXY": "1",
        "POLAR_PROXY_PORT": str(PROXY_PORT),
    }


class HostRelay:
    """Host side of the proxy route: ``run_dir/proxy.sock`` forwarded to the proxy's TCP port."""

    def __init__(self, run_dir: Path, proxy_url: str) -> None:
        url = urlsplit(proxy_url)
        self.socket = run_dir / "proxy.sock"
        self.proc = subprocess.Popen(
            ["socat", f"UNIX-LISTEN:{self.socket},fork,mode=666", f"TCP:{url.hostname}:{url.port or 80}"],
            stdin=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def close(self) -> None:
        kill_group(self.proc, grace=1.0)


class BwrapRuntime(Runtime):
    name = "bwrap"

    def __init__(self) -> None:
        super().__init__()
        self.relay: HostRelay | None = None

    @property
    def paths(self) -> SandboxPaths:
        return SandboxPaths(workspace="/workspace", home="/root")

    def start(self, spec: SandboxSpec) -> None:
        require(
            "bwrap", "socat", hint="install bubblewrap and socat (`make setup` does: apt-get install bubblewrap socat)"
        )
        self.spec = spec
        etc = spec.run_dir / "etc"
        etc.mkdir(parents=True, exist_ok=True)
        for name, text in ETC.items():
            (etc / name).write_text(text)
        shutil.copy(INIT, spec.run_dir / "init.sh")
        self.audit = EgressAudit(spec.run_dir)
        self.relay = HostRelay(spec.run_dir, spec.proxy_url)

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
        for inside, host in spec.mounts.items():
            cmd += ["--ro-bind", str(host), inside]
        cmd += ["--bind", str(spec.workspace), paths.workspace, "--bind", str(spec.home), paths.home]
        cmd += ["--unshare-all", "--hostname", "sandbox", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
        # Binding port 53 for the DNS audit needs this one capability; the sandbox has no route anywhere anyway.
        cmd += ["--cap-add", "CAP_NET_BIND_SERVICE", "--clearenv"]
        for key, value in {**base_env(paths.home), **env}.items():
            cmd += ["--setenv", key, value]
        cmd += ["--chdir", cwd, "/bin/bash", "/run/polar/init.sh", *argv]
        return cmd

    def stop(self) -> None:
        if self.relay:
            self.relay.close()
            self.relay = None
        if self.audit:
            self.audit.close()
