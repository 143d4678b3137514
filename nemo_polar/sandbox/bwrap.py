"""bubblewrap runtime (the default): own pid/mount/net/ipc/uts namespaces, read-only system, only the workspace and
the home writable, and no network but the relayed proxy (none at all for grading).

The system is the host's /usr, or, given ``rootfs`` (or ``image``, unpacked by ``images.image_rootfs``), an OCI
image's root filesystem: a docker-free image runtime. Then the image's own bash, python, git... run with the image's
environment and /etc (docker's hosts, hostname and resolv.conf, as ``docker run`` has them), and in an agent's
sandbox only init.sh's ``socat`` and the CLIs' ``node`` come from the host (``images.HostTools``, first on PATH).
A grading sandbox over an image runs as a container of it would (hostside.py): the image's /root as its home (a
writable copy), docker's default capabilities but CAP_MKNOD (no device cgroup here to make a device node harmless),
and, where the caller is root, the whole image writable as a container's layer is: an overlay of the shared
read-only rootfs with a fresh upper directory, mounted in a mount namespace of the sandbox's own (bubblewrap 0.8 has
no overlay option), gone with it."""

from __future__ import annotations

import functools
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path, PurePosixPath

from nemo_polar.sandbox.base import PROXY_PORT, HostCommand, Runtime, RuntimeUnavailable, SandboxPaths, SandboxSpec
from nemo_polar.sandbox.hostside import RunDir, base_env, container_hostname, exec_env, image_etc, require
from nemo_polar.sandbox.images import HOST_BIN, HOST_ROOT, HostTools, host_tools, image_env, image_rootfs

HOST_ETC = ["ssl", "ca-certificates", "localtime", "alternatives"]  # read-only, harmless, some tools expect them
RUN = "/run/polar"
HOME = "/root"
OWN_TOP = {"proc", "dev", "tmp", "run", "sys"}  # never the image's: bwrap makes them (there is no /sys at all)
# docker's default capability set (moby oci/caps/defaults.go), what swebench's containers run with, less CAP_MKNOD:
# docker's device cgroup makes a device node useless in a container; a bwrap sandbox has none.
GRADING_CAPS = [
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL", "CAP_SETGID", "CAP_SETUID",
    "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_NET_RAW", "CAP_SYS_CHROOT", "CAP_AUDIT_WRITE", "CAP_SETFCAP",
]  # fmt: skip


class BwrapRuntime(Runtime):
    name = "bwrap"

    def __init__(self, rootfs: Path | None = None, workdir: str = "/workspace", *, image: str | None = None) -> None:
        """``rootfs``: an image's root filesystem as /, read-only; ``image``: the same, unpacked at ``start()``.
        ``workdir``: where the workspace appears inside (e.g. /testbed, where an image has its repository)."""
        super().__init__()
        if rootfs is not None and image is not None:
            raise ValueError("give a rootfs or an image, not both")
        if not workdir.startswith("/") or workdir in ("/", HOME, RUN):
            raise ValueError(f"workdir must be an absolute path of its own, not {workdir!r}")
        self.rootfs = rootfs
        self.image = image
        self.workdir = workdir
        self.host: HostTools | None = None
        self.run: RunDir | None = None
        self.bwrap = "bwrap"  # found on the host's PATH at start(): the command's own environment is the sandbox's
        self.hostname = "sandbox"  # an image sandbox's is new for each start(), shaped as docker's
        self.overlay: Path | None = None  # a grading sandbox's writable image root (root callers)

    @property
    def paths(self) -> SandboxPaths:
        return SandboxPaths(workspace=self.workdir, home=HOME)

    def start(self, spec: SandboxSpec) -> None:
        require(
            "bwrap", "socat", hint="install bubblewrap and socat (`make setup` does: apt-get install bubblewrap socat)"
        )
        self.bwrap = shutil.which("bwrap") or self.bwrap
        if self.image is not None and self.rootfs is None:
            self.rootfs = image_rootfs(self.image)
        if self.rootfs is not None:
            if not (self.rootfs / "bin").exists() and not (self.rootfs / "usr").is_dir():
                raise RuntimeUnavailable(f"{self.rootfs} is not a root filesystem (no /usr, no /bin)")
            self.hostname = container_hostname()
            grading = spec.proxy_url is None
            if grading:  # the image's home as a container has it: its own files, writable
                home = self.rootfs / HOME.lstrip("/")
                if home.is_dir() and not any(spec.home.iterdir()):
                    shutil.copytree(home, spec.home, symlinks=True, dirs_exist_ok=True)
                if overlays_work():
                    self.overlay = spec.run_dir / "overlay"
                    for part in OVERLAY_DIRS:
                        (self.overlay / part).mkdir(parents=True, exist_ok=True)
            else:
                self.host = host_tools()
            self.run = RunDir(spec, image_etc(self.hostname, grading))
        else:
            self.run = RunDir(spec)
        self.spec = spec
        self.audit = self.run.audit

    def command(self, argv: list[str], env: dict[str, str], cwd: str) -> HostCommand:
        assert self.spec is not None and self.run is not None, "start() first"
        spec, paths, etc = self.spec, self.paths, self.run.etc
        grading = spec.proxy_url is None
        if self.rootfs is None:
            cmd = [self.bwrap, "--ro-bind", "/usr", "/usr"]
            for link in ("bin", "lib", "lib64", "sbin"):
                cmd += ["--symlink", f"usr/{link}", f"/{link}"]
            cmd += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--dir", "/etc"]
            for name in etc:
                cmd += ["--ro-bind", str(spec.run_dir / "etc" / name), f"/etc/{name}"]
            for name in HOST_ETC:
                cmd += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
            full_env = {**base_env(paths.home), **env}
        else:
            targets = {f"/etc/{name}" for name in etc} | {paths.workspace, paths.home} | set(spec.mounts)
            if not grading:
                targets |= {RUN, HOST_ROOT, HOST_BIN}
            cmd = [*self._overlay_prefix(), self.bwrap]
            cmd += image_root_args(self.rootfs, targets, source=self.overlay / "root" if self.overlay else None)
            cmd += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
            for name in etc:
                cmd += ["--ro-bind", str(spec.run_dir / "etc" / name), f"/etc/{name}"]
            full_env = exec_env(image_env(self.rootfs), self.hostname)
            if not grading:
                assert self.host is not None
                cmd += self.host.bwrap_args()
            full_env.update(env)
        if not grading:
            cmd += ["--ro-bind", str(spec.run_dir), RUN]
            full_env["POLAR_PROXY_PORT"] = str(PROXY_PORT)
            if self.host is not None:  # only socat and node are there; everything else on PATH stays the image's
                full_env["PATH"] = f"{HOST_BIN}:{full_env['PATH']}"
        cmd += ["--bind", str(spec.workspace), paths.workspace, "--bind", str(spec.home), paths.home]
        for inside_path, host in spec.mounts.items():  # after the home bind, which would otherwise hide mounts under it
            cmd += ["--ro-bind", str(host), inside_path]
        if self.rootfs is not None:
            cmd += ["--remount-ro", "/"]  # the directories made above for mount points, not only the image's
        cmd += ["--unshare-all", "--hostname", self.hostname, "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
        if grading and self.rootfs is not None:
            cmd += [arg for cap in GRADING_CAPS for arg in ("--cap-add", cap)]
            cmd += ["--chdir", cwd, *argv]
        else:
            # Binding port 53 for the DNS audit needs this one capability; the sandbox has no route anywhere anyway.
            cmd += ["--cap-add", "CAP_NET_BIND_SERVICE"]
            init = [] if grading else ["/bin/bash", f"{RUN}/init.sh"]
            cmd += ["--chdir", cwd, *init, *argv]
        return HostCommand(cmd, full_env)  # bwrap hands its own environment, exactly this, to what it runs

    def _overlay_prefix(self) -> list[str]:
        """Run bwrap in a mount namespace of its own holding the overlay it makes the sandbox's root of."""
        if self.overlay is None or self.rootfs is None:
            return []
        return overlay_command(self.rootfs, self.overlay)

    def stop(self) -> None:
        if self.run is not None:
            self.run.close()
            self.run = None


OVERLAY_DIRS = ("upper", "work", "root")
OVERLAY_MOUNT = '"$1" -t overlay overlay -o "lowerdir=$2,upperdir=$3,workdir=$4" "$5" || exit 125; shift 5; exec "$@"'


def overlay_command(lower: Path, base: Path) -> list[str]:
    """A command prefix: a new mount namespace with ``lower`` overlaid at ``base/root`` (changes in ``base/upper``),
    then the rest of the command line in it."""
    unshare, mount = shutil.which("unshare") or "unshare", shutil.which("mount") or "mount"
    parts = [str(lower), *(str(base / part) for part in OVERLAY_DIRS)]
    return [
        unshare,
        "--mount",
        "--propagation",
        "private",
        "--",
        "/bin/sh",
        "-c",
        OVERLAY_MOUNT,
        "overlay",
        mount,
        *parts,
    ]


@functools.cache
def overlays_work() -> bool:
    """Whether this process can mount an overlay in a mount namespace of its own: root with CAP_SYS_ADMIN and a
    kernel with overlayfs (not, e.g., root in an unprivileged container). Tried once, on a scratch directory."""
    if os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("mount")):
        return False
    with tempfile.TemporaryDirectory(prefix="polar-overlay-") as scratch:
        lower, base = Path(scratch) / "lower", Path(scratch) / "overlay"
        for path in (lower, *(base / part for part in OVERLAY_DIRS)):
            path.mkdir(parents=True)
        try:
            done = subprocess.run([*overlay_command(lower, base), "true"], capture_output=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return False
        return done.returncode == 0


def image_root_args(rootfs: Path, targets: set[str], source: Path | None = None) -> list[str]:
    """bwrap arguments that make ``rootfs`` the sandbox's /, read-only, leaving room for mounts at ``targets``;
    given ``source`` (where a writable overlay of ``rootfs`` will be mounted when bwrap starts), bound from there,
    writable.

    A read-only bind of the whole rootfs at / would leave bwrap no way to create a mount point the image lacks (and
    writing one into the shared rootfs is not an option). So / is bwrap's own tmpfs, made read-only at the end
    (``--remount-ro /``), with each top-level entry of the image bound read-only or re-made as a symlink; a
    directory on the way to a missing mount point (or to a symlink there, e.g. Ubuntu's /etc/resolv.conf) is made
    too, its entries bound one by one."""
    split = {"/"}
    for target in targets:
        parts = PurePosixPath(target).parts[1:]
        for depth in range(len(parts)):
            here = "/" + "/".join(parts[: depth + 1])
            try:
                mode = os.lstat(rootfs / here.lstrip("/")).st_mode
            except OSError:
                mode = 0
            last = depth == len(parts) - 1
            if not mode or stat.S_ISLNK(mode) or (not last and not stat.S_ISDIR(mode)):
                split.update("/" + "/".join(parts[:d]) for d in range(1, depth + 1))
                break
    args: list[str] = []

    def fill(directory: str) -> None:
        with os.scandir(rootfs / directory.lstrip("/")) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                inside = f"{directory.rstrip('/')}/{entry.name}"
                if (directory == "/" and entry.name in OWN_TOP) or inside in targets:
                    continue  # bwrap makes these, or a later mount does
                if inside in split:
                    args.extend(["--dir", inside])
                    fill(inside)
                elif entry.is_symlink():
                    args.extend(["--symlink", os.readlink(entry.path), inside])
                elif source is None:
                    args.extend(["--ro-bind", entry.path, inside])
                else:
                    args.extend(["--bind", str(source / inside.lstrip("/")), inside])

    fill("/")
    return args
