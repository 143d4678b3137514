"""The host side every isolated runtime shares: the generated /etc, the sandbox init script, the environment
inside, the proxy relay's host end and the egress audit, all living in the session's run directory."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

from nemo_polar.sandbox.base import PROXY_PORT, RuntimeUnavailable, SandboxSpec, kill_group
from nemo_polar.sandbox.egress import EgressAudit

INIT = Path(__file__).with_name("init.sh")
ETC = {
    "resolv.conf": "nameserver 127.0.0.1\n",
    "hosts": "127.0.0.1 localhost\n::1 localhost\n",
    "passwd": "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
    "group": "root:x:0:\nnogroup:x:65534:\n",
    "nsswitch.conf": "passwd: files\ngroup: files\nhosts: files dns\n",
}


def require(*tools: str, hint: str) -> None:
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        raise RuntimeUnavailable(f"{', '.join(missing)} not found on PATH: {hint}")


def base_env(home: str, proxy: bool = True) -> dict[str, str]:
    """The environment inside a sandbox; ``POLAR_PROXY_PORT`` tells init.sh to relay and check the proxy."""
    audit = "http://127.0.0.1:3128"
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": home,
        "USER": "root",
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "TMPDIR": "/tmp",
        "HTTP_PROXY": audit,
        "HTTPS_PROXY": audit,
        "http_proxy": audit,
        "https_proxy": audit,
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
        "NODE_USE_ENV_PROXY": "1",
    }
    if proxy:
        env["POLAR_PROXY_PORT"] = str(PROXY_PORT)
    return env


class HostRelay:
    """Host side of the proxy route: ``run_dir/proxy.sock`` forwarded to the proxy's TCP port."""

    def __init__(self, run_dir: Path, proxy_url: str, timeout_s: float = 10.0) -> None:
        url = urlsplit(proxy_url)
        self.socket = run_dir / "proxy.sock"
        self.proc = subprocess.Popen(
            ["socat", f"UNIX-LISTEN:{self.socket},fork,mode=666", f"TCP:{url.hostname}:{url.port or 80}"],
            stdin=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._wait_listening(timeout_s)

    def _wait_listening(self, timeout_s: float) -> None:
        # Popen returns before socat has bound the socket; a sandbox started in that gap finds no route to the
        # proxy and fails its check (seen under load), so the relay is not handed out until it listens.
        deadline = time.monotonic() + timeout_s
        while not self.socket.is_socket():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeUnavailable(f"the proxy relay (socat) did not listen on {self.socket}")
            time.sleep(0.005)

    def close(self) -> None:
        kill_group(self.proc, grace=1.0)


class RunDir:
    """Populate ``spec.run_dir`` (mounted at /run/polar inside) and serve its sockets for the sandbox's lifetime."""

    def __init__(self, spec: SandboxSpec) -> None:
        etc = spec.run_dir / "etc"
        etc.mkdir(parents=True, exist_ok=True)
        for name, text in ETC.items():
            (etc / name).write_text(text)
        shutil.copy(INIT, spec.run_dir / "init.sh")
        # Unix socket paths are limited to 108 bytes; the host binds them through a short link to the run dir.
        self.link = Path(tempfile.gettempdir()) / f"polar-{uuid.uuid4().hex[:12]}"
        self.link.symlink_to(spec.run_dir.resolve(), target_is_directory=True)
        self.audit = EgressAudit(self.link)
        self.relay: HostRelay | None = None
        if spec.proxy_url:
            try:
                self.relay = HostRelay(self.link, spec.proxy_url)
            except BaseException:
                self.close()
                raise

    def close(self) -> None:
        if self.relay:
            self.relay.close()
        self.audit.close()
        self.link.unlink(missing_ok=True)
