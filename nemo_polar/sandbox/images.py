"""OCI/docker images as plain root filesystems, for the bwrap runtime on machines with no docker daemon.

``image_rootfs(image)`` copies an image into an OCI layout with ``skopeo`` and unpacks it with ``umoci``, once, into
``$POLAR_CACHE/rootfs/<digest>/rootfs`` (an OCI runtime bundle; ``image-config.json`` beside it is the image's own
config: its ``Env``, not the runtime defaults umoci's ``config.json`` adds to it, such as ``TERM=xterm``). The key
is the image's content digest, so a rebuilt image gets a new rootfs and an unchanged one costs one lookup. The
rootfs is never written after the unpack: the sandbox binds it read-only.

An Apptainer image file (``sif:PATH`` or a path ending in ``.sif``) is unpacked from its squashfs system partition
instead (:mod:`nemo_polar.sandbox.sif`), its key the digest of its header and descriptors.

Where the image comes from: an explicit skopeo transport (``docker://``, ``docker-daemon:``, ``oci:DIR:tag``,
``oci-archive:``, ``docker-archive:``, ``dir:``, ``containers-storage:``) is used as given; a plain name is taken
from the local docker daemon when it has that image (images built here with docker), else from a registry.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from nemo_polar.paths import cache_dir
from nemo_polar.sandbox.base import RuntimeUnavailable
from nemo_polar.sandbox.hostside import require
from nemo_polar.sandbox.sif import SQUASHFS, is_sif, read_sif, sif_env

TRANSPORTS = ("docker://", "docker-daemon:", "oci:", "oci-archive:", "docker-archive:", "dir:", "containers-storage:")
INSTALL = "apt-get install skopeo umoci (scripts/setup_system.sh does)"
IMAGE_CONFIG = "image-config.json"
INSPECT_TIMEOUT = "60s"  # skopeo's own limit on a lookup (an unreachable registry would otherwise hang)


class ImageUnavailable(RuntimeUnavailable):
    """The image cannot be found, copied or unpacked; the message names it."""


def image_rootfs(image: str, cache: Path | None = None) -> Path:
    """The image's filesystem, unpacked once under ``cache`` (default ``$POLAR_CACHE/rootfs``); read-only."""
    sif = read_sif(image) if is_sif(image) else None
    if sif is None:
        require("skopeo", "umoci", hint=INSTALL)
        source, key = _resolve(image)
    else:
        require("unsquashfs", hint=SQUASHFS)
        source, key = str(sif.path), sif.key
    root = (cache or cache_dir() / "rootfs").resolve()
    bundle = root / key
    rootfs = bundle / "rootfs"
    if (bundle / IMAGE_CONFIG).is_file():
        return rootfs
    root.mkdir(parents=True, exist_ok=True)
    with (root / f".{key}.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second process asking for the same image waits here, then finds it
        if (bundle / IMAGE_CONFIG).is_file():
            return rootfs
        shutil.rmtree(bundle, ignore_errors=True)  # unpacked before the image's own config was kept
        for stale in root.glob(f".tmp-{key}-*"):  # left by a process killed mid-unpack (we hold the lock)
            shutil.rmtree(stale, ignore_errors=True)
        work = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-", dir=root))
        try:
            if sif is not None:
                (work / "bundle").mkdir()
                sif.unpack(work / "bundle" / "rootfs")
                config = {"Env": sif_env(work / "bundle" / "rootfs")}
            else:
                layout = f"{work / 'oci'}:image"
                # gzip level 1: the layers are unpacked right after, and are deleted with the layout.
                copy = ["skopeo", "--insecure-policy", "copy", "--quiet", "--dest-compress-level", "1"]
                _run([*copy, source, f"oci:{layout}"], image, "copy")
                unpack = ["umoci", "unpack", *([] if os.geteuid() == 0 else ["--rootless"]), "--image", layout]
                _run([*unpack, str(work / "bundle")], image, "unpack")
                config = _image_config(work / "oci")
            (work / "bundle" / IMAGE_CONFIG).write_text(json.dumps(config))
            os.rename(work / "bundle", bundle)  # atomic: a rootfs under its key is always complete
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return rootfs


def image_env(rootfs: Path) -> dict[str, str]:
    """The image's own environment (its ``ENV``s, PATH among them), from its config; {} without."""
    with contextlib.suppress(OSError, ValueError, AttributeError, TypeError):
        pairs = json.loads((rootfs.parent / IMAGE_CONFIG).read_text()).get("Env") or []
        return dict(pair.split("=", 1) for pair in pairs if "=" in pair)
    return {}


def _image_config(layout: Path) -> dict:
    """The ``config`` of the one image in an OCI layout (index -> manifest -> config blob)."""

    def blob(digest: str) -> dict:
        algo, _, hexdigest = digest.partition(":")
        return json.loads((layout / "blobs" / algo / hexdigest).read_text())

    [manifest] = json.loads((layout / "index.json").read_text())["manifests"]
    return blob(blob(manifest["digest"])["config"]["digest"]).get("config") or {}


def _resolve(image: str) -> tuple[str, str]:
    """(skopeo source reference, cache key): the key is the image ID for the docker daemon (the digest of its
    config), else the digest of the image's manifest."""
    if image.startswith("docker-daemon:"):
        image_id, why = _daemon_image_id(image.removeprefix("docker-daemon:"))
        if image_id is None:
            raise ImageUnavailable(f"image {image} not found in the local docker daemon: {why}")
        return f"docker-daemon:{image_id}", _key(image_id)
    if image.startswith(TRANSPORTS):
        return image, _manifest_key(image, image)
    image_id, why = _daemon_image_id(image)
    if image_id is not None:
        return f"docker-daemon:{image_id}", _key(image_id)
    try:
        return f"docker://{image}", _manifest_key(image, f"docker://{image}")
    except ImageUnavailable as exc:
        raise ImageUnavailable(f"{exc} (nor in a local docker daemon: {why})") from None


def _daemon_image_id(name: str) -> tuple[str | None, str]:
    if shutil.which("docker") is None:
        return None, "docker is not installed"
    try:
        done = subprocess.run(
            ["docker", "image", "inspect", "--format", "{{.Id}}", name], capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired:
        return None, "the docker daemon did not answer"
    if done.returncode != 0:
        return None, _last_line(done.stderr) or f"docker image inspect exited {done.returncode}"
    return done.stdout.strip(), ""


def _manifest_key(image: str, source: str) -> str:
    cmd = ["skopeo", "--insecure-policy", "--command-timeout", INSPECT_TIMEOUT, "inspect", "--raw", source]
    done = subprocess.run(cmd, capture_output=True)
    if done.returncode != 0 or not done.stdout:
        raise ImageUnavailable(f"image {image} not found: {_last_line(done.stderr.decode(errors='replace'))}")
    return _key("sha256:" + hashlib.sha256(done.stdout).hexdigest())


def _key(digest: str) -> str:
    algo, _, hexdigest = digest.partition(":")
    if not hexdigest or not hexdigest.isalnum():
        raise ImageUnavailable(f"unexpected image digest {digest!r}")
    return f"{algo}-{hexdigest}"


def _run(cmd: list[str], image: str, what: str) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise ImageUnavailable(f"cannot {what} image {image}: {_last_line(done.stderr) or f'{cmd[0]} failed'}")


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


HOST_ROOT = "/run/polar-host"  # the host's /usr (and /lib*, where not links into it), read-only inside
HOST_BIN = "/run/polar-host-bin"  # the host's socat and node, first on PATH inside
HOST_TOOLS = ("socat", "node")
PATCHELF = "apt-get install patchelf (scripts/setup_system.sh does)"
_LIB_DIRS = ("/lib64", "/usr/lib64", "/lib", "/usr/lib")


class HostTools:
    """The host's ``socat`` (init.sh's relays) and ``node`` (the CLIs) for a sandbox whose / is an image with its own
    libc, or none of either: copies patched (patchelf) to load through the host's dynamic loader and libraries as
    they appear under ``HOST_ROOT``. A real executable, not a loader-invoking script, so that ``/proc/self/exe`` (node's
    ``process.execPath``, which CLIs re-spawn themselves with) is node itself; and no ``LD_LIBRARY_PATH`` that the
    image's own programs, started by the CLI, would inherit."""

    def __init__(self, bin_dir: Path, binds: list[str]) -> None:
        self.bin_dir = bin_dir  # mount at HOST_BIN
        self.binds = binds  # host directories to mount at HOST_ROOT + path

    def bwrap_args(self) -> list[str]:
        args = [arg for host in self.binds for arg in ("--ro-bind", host, HOST_ROOT + host)]
        return [*args, "--ro-bind", str(self.bin_dir), HOST_BIN]


def host_tools(cache: Path | None = None) -> HostTools:
    """The patched tools, made once per host binary under ``cache`` (default ``$POLAR_CACHE/host-tools``)."""
    require("patchelf", hint=PATCHELF)
    found = {name: shutil.which(name) for name in HOST_TOOLS}
    if missing := [name for name, path in found.items() if path is None]:
        raise RuntimeUnavailable(f"{', '.join(missing)} not found on the host: an image sandbox runs the host's")
    binaries = {name: Path(path).resolve() for name, path in found.items() if path}
    interps = {name: _interpreter(path) for name, path in binaries.items()}
    lib_dirs = _lib_dirs([*binaries.values()], [i for i in interps.values() if i])
    binds = sorted({"/" + Path(d).parts[1] for d in [*lib_dirs, *(i for i in interps.values() if i)]})
    stamp = [(n, str(p), p.stat().st_size, p.stat().st_mtime_ns, interps[n]) for n, p in binaries.items()]
    key = hashlib.sha256(json.dumps([stamp, lib_dirs]).encode()).hexdigest()[:16]
    root = (cache or cache_dir() / "host-tools").resolve()
    out = root / key
    if out.is_dir():
        return HostTools(out, binds)
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-", dir=root))
    try:
        rpath = ":".join(HOST_ROOT + d for d in lib_dirs)
        for name, path in binaries.items():
            shutil.copy2(path, work / name)
            if interps[name]:  # a static binary runs anywhere as it is
                # DT_RPATH, not DT_RUNPATH: it also applies to the libraries' own dependencies.
                patch = ["patchelf", "--set-interpreter", HOST_ROOT + interps[name], "--force-rpath", "--set-rpath"]
                done = subprocess.run([*patch, rpath, str(work / name)], capture_output=True, text=True)
                if done.returncode != 0:
                    raise RuntimeUnavailable(f"patchelf could not patch a copy of {path}: {_last_line(done.stderr)}")
        os.chmod(work, 0o755)
        try:
            os.rename(work, out)
        except OSError:  # another process made it first
            if not out.is_dir():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return HostTools(out, binds)


def _interpreter(binary: Path) -> str:
    """The binary's dynamic loader (PT_INTERP), resolved on the host; "" for a static binary."""
    done = subprocess.run(["patchelf", "--print-interpreter", str(binary)], capture_output=True, text=True)
    return os.path.realpath(done.stdout.strip()) if done.returncode == 0 and done.stdout.strip() else ""


def _lib_dirs(binaries: list[Path], interps: list[str]) -> list[str]:
    """The host directories the binaries' libraries come from (``ldd``), then the loader's and the usual ones."""
    dirs: list[str] = []
    for binary in binaries:
        done = subprocess.run(["ldd", str(binary)], capture_output=True, text=True)
        for line in done.stdout.splitlines():
            _, arrow, rest = line.partition("=> ")
            lib = rest.split(" (", 1)[0].strip()
            if arrow and lib.startswith("/"):
                dirs += [os.path.realpath(os.path.dirname(lib)), os.path.dirname(os.path.realpath(lib))]
    dirs += [os.path.dirname(i) for i in interps]
    dirs += [os.path.realpath(d) for d in _LIB_DIRS if os.path.isdir(d)]
    return list(dict.fromkeys(dirs))
