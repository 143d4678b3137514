"""The host side every isolated runtime shares: the generated /etc, the sandbox init script, the environment
inside, the proxy relay's host end and the egress audit, all living in the session's run directory.

A sandbox over an instance image is the image as swebench's harness runs it (``swebench.harness.run_evaluation.
create_container``, swebench 5.0.2: a plain container of the image, its ``ENV``, its ``/etc``, root): ``exec_env``
and ``docker_etc`` restate what docker adds, and ``tests/test_grading_environment.py`` compares a probe's view of
both, field by field, with the differences that remain listed in docs/grading_environment.md. What a sandbox adds
for a harness (the relay to the proxy, the DNS audit, the CLI's home) it adds in the agent's sandbox only."""

from __future__ import annotations

import secrets
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

from nemo_polar.sandbox.base import RuntimeUnavailable, SandboxSpec, kill_group
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


DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # docker's, for an image with none
# docker's /etc/hosts for a container with no network (moby daemon/container_operations_unix.go, measured with
# docker 28 on `docker run --network none` and with swebench's create_container on a daemon with no bridge).
DOCKER_HOSTS = (
    "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\n"
    "ff00::0\tip6-mcastprefix\nff02::1\tip6-allnodes\nff02::2\tip6-allrouters\n"
)
AUDIT_RESOLV = "nameserver 127.0.0.1\n"  # the agent's sandbox: lookups go to the DNS audit


def base_env(home: str) -> dict[str, str]:
    """The environment inside a sandbox over the host's system (no image of its own). No proxy variables: the code
    under test must see the environment it was written for, and the sandbox has no route out they could name."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": home,
        "USER": "root",
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "TMPDIR": "/tmp",
    }


def exec_env(image_env: dict[str, str], hostname: str) -> dict[str, str]:
    """What a ``docker exec`` in a container of an image starts with: the image's ``ENV``, ``HOSTNAME`` and, where
    the image sets neither, root's ``HOME`` and docker's default ``PATH``."""
    return {"PATH": DEFAULT_PATH, **image_env, "HOSTNAME": hostname, "HOME": image_env.get("HOME", "/root")}


def container_hostname() -> str:
    """A hostname shaped as docker's (the container id's first 12 hex digits), new for each sandbox."""
    return secrets.token_hex(6)


def docker_resolv_conf(host: Path = Path("/etc/resolv.conf")) -> str:
    """The resolv.conf docker gives a container: the host's, without loopback nameservers (unreachable from the
    container's own network namespace); when none is left, docker's public defaults."""
    try:
        lines = host.read_text().splitlines()
    except OSError:
        lines = []
    kept = [ln for ln in lines if not _loopback_nameserver(ln)]
    if not any(ln.split()[:1] == ["nameserver"] for ln in kept):
        kept += ["nameserver 8.8.8.8", "nameserver 8.8.4.4"]
    return "\n".join(kept) + "\n"


def _loopback_nameserver(line: str) -> bool:
    words = line.split()
    return len(words) >= 2 and words[0] == "nameserver" and (words[1].startswith("127.") or words[1] == "::1")


def image_etc(hostname: str, grading: bool) -> dict[str, str]:
    """The /etc files a sandbox over an image gets where docker generates them (the rest of /etc is the image's):
    docker's hosts and hostname, and docker's resolv.conf for grading or the DNS audit's for the agent."""
    resolv = docker_resolv_conf() if grading else AUDIT_RESOLV
    return {"hosts": DOCKER_HOSTS, "hostname": hostname + "\n", "resolv.conf": resolv}


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
    """Populate ``spec.run_dir`` (mounted at /run/polar inside) and serve its sockets for the sandbox's lifetime:
    the generated ``etc`` files, init.sh, and, for an agent's sandbox, the DNS audit and the proxy relay. A grading
    sandbox (no proxy) gets neither: its network is simply off, as in swebench's containers."""

    def __init__(self, spec: SandboxSpec, etc: dict[str, str] | None = None) -> None:
        files = ETC if etc is None else etc
        out = spec.run_dir / "etc"
        out.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (out / name).write_text(text)
        self.etc = sorted(files)
        shutil.copy(INIT, spec.run_dir / "init.sh")
        self.link: Path | None = None
        self.audit: EgressAudit | None = None
        self.relay: HostRelay | None = None
        if spec.proxy_url is None:
            return
        # Unix socket paths are limited to 108 bytes; the host binds them through a short link to the run dir.
        self.link = Path(tempfile.gettempdir()) / f"polar-{uuid.uuid4().hex[:12]}"
        self.link.symlink_to(spec.run_dir.resolve(), target_is_directory=True)
        self.audit = EgressAudit(self.link)
        try:
            self.relay = HostRelay(self.link, spec.proxy_url)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self.relay:
            self.relay.close()
        if self.audit:
            self.audit.close()
        if self.link:
            self.link.unlink(missing_ok=True)
