"""Docker-free image sandboxes: an image unpacked with skopeo + umoci, run under bwrap with the host's socat and node.

Real tools throughout. The test image is built once per module with the local docker daemon on the debootstrapped
base (`make docker`): a /testbed repository, a marker the host does not have, its own ENV and PATH, and no socat,
no node and not even libstdc++ (which the host's node needs), so both must come from the host.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse

from nemo_polar.proxy.http.serve import BackgroundServer
from nemo_polar.sandbox import RuntimeUnavailable, SandboxSpec, get_runtime
from nemo_polar.sandbox.base import PROXY_PORT, ExecResult
from nemo_polar.sandbox.bwrap import BwrapRuntime
from nemo_polar.sandbox.images import ImageUnavailable, image_rootfs

ROOT = Path(__file__).resolve().parents[1]
BASE = "nemo-polar/bookworm-minbase:1"
IMAGE = f"nemo-polar/test-images:{uuid.uuid4().hex[:8]}"
MARKER = "/etc/polar-test-image"
DOCKERFILE = f"""FROM {BASE}
COPY testbed /testbed
COPY marker {MARKER}
COPY hello /opt/imagebin/hello
RUN rm -f /usr/lib/x86_64-linux-gnu/libstdc++.so.6* /usr/lib/aarch64-linux-gnu/libstdc++.so.6* \\
 && mkdir -p /opt/miniconda3/bin && echo 'true' > /opt/miniconda3/bin/activate
ENV PATH=/opt/imagebin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin POLAR_IMAGE_ENV=from-image
"""


def docker_up() -> bool:
    return (
        shutil.which("docker") is not None and subprocess.run(["docker", "info"], capture_output=True).returncode == 0
    )


def ensure_docker() -> None:
    """The daemon and the base image; `make setup` may be starting them right now, so wait a little first."""
    for _ in range(3):
        if docker_up() and subprocess.run(["docker", "image", "inspect", BASE], capture_output=True).returncode == 0:
            return
        time.sleep(5)
    done = subprocess.run(["bash", str(ROOT / "scripts" / "setup_docker.sh")], capture_output=True, text=True)
    for _ in range(60):
        if docker_up():
            return
        time.sleep(5)
    pytest.skip(f"no docker daemon to build the test image with: {done.stderr.strip()[-500:]}")


BUILT: list[str] = []  # image IDs, removed after the module (a rebuild leaves the first one untagged)


def build(context: Path, marker: str) -> None:
    (context / "marker").write_text(marker + "\n")
    cmd = ["docker", "build", "--quiet", "--network", "none", "-t", IMAGE, str(context)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    BUILT.append(done.stdout.strip())


@pytest.fixture(scope="module")
def context(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    ensure_docker()
    ctx = tmp_path_factory.mktemp("image")
    (ctx / "Dockerfile").write_text(DOCKERFILE)
    (ctx / "hello").write_text("#!/bin/sh\necho hello from the image\n")
    (ctx / "hello").chmod(0o755)
    repo = ctx / "testbed"
    repo.mkdir()
    (repo / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "init"], check=True)
    build(ctx, "first")
    yield ctx
    subprocess.run(["docker", "rmi", "-f", IMAGE, *BUILT], capture_output=True)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """$POLAR_CACHE for the module: the rootfs cache and the patched host tools live there."""
    path = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("POLAR_CACHE", str(path))
        yield path
    shutil.rmtree(path, ignore_errors=True)  # two unpacked images and a copy of node


@pytest.fixture(scope="module")
def rootfs(context: Path, cache: Path) -> Path:
    t0 = time.monotonic()
    path = image_rootfs(IMAGE)
    print(f"cold unpack of {IMAGE}: {time.monotonic() - t0:.1f}s")
    return path


def make_spec(tmp_path: Path, proxy_url: str | None = None) -> SandboxSpec:
    spec = SandboxSpec(workspace=tmp_path / "ws", home=tmp_path / "home", run_dir=tmp_path / "run", proxy_url=proxy_url)
    for d in (spec.workspace, spec.home, spec.run_dir):
        d.mkdir()
    return spec


def run_in(rt: BwrapRuntime, spec: SandboxSpec, script: str | list[str], tmp_path: Path) -> ExecResult:
    rt.start(spec)
    argv = ["bash", "-c", script] if isinstance(script, str) else script
    done = rt.exec(argv, {}, cwd=None, timeout=60, log_prefix=tmp_path / "cmd")
    assert done.returncode == 0, done.stderr.read_text()
    return done


def test_rootfs_is_unpacked_once_by_digest(rootfs: Path, cache: Path) -> None:
    assert rootfs.parent.parent == cache / "rootfs" and rootfs.parent.name.startswith("sha256-")
    assert (rootfs / MARKER.lstrip("/")).read_text() == "first\n"
    assert (rootfs / "testbed" / ".git").is_dir()
    t0 = time.monotonic()
    assert image_rootfs(IMAGE) == rootfs
    assert time.monotonic() - t0 < 2  # one `docker image inspect`, no copy
    assert [p.name for p in (cache / "rootfs").iterdir() if not p.name.startswith(".sha256")] == [rootfs.parent.name]


def test_rebuilt_image_gets_a_new_rootfs_once(context: Path, rootfs: Path, cache: Path) -> None:
    build(context, "second")
    found: list[Path] = []
    threads = [threading.Thread(target=lambda: found.append(image_rootfs(IMAGE))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(found) == 2 and found[0] == found[1] != rootfs  # both asked at once: one unpack, one answer
    assert (found[0] / MARKER.lstrip("/")).read_text() == "second\n"
    assert (rootfs / MARKER.lstrip("/")).read_text() == "first\n"  # the old one is untouched
    assert not list((cache / "rootfs").glob(".tmp-*"))


def test_missing_images_and_tools_are_named(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ImageUnavailable, match="nemo-polar/no-such-image:0"):
        image_rootfs("docker-daemon:nemo-polar/no-such-image:0")
    with pytest.raises(ImageUnavailable, match=f"oci:{tmp_path}/none:x"):
        image_rootfs(f"oci:{tmp_path}/none:x")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RuntimeUnavailable, match="apt-get install skopeo umoci"):
        image_rootfs(IMAGE)


def test_sandbox_sees_the_image(rootfs: Path, tmp_path: Path) -> None:
    """A grading sandbox: the image's files, ENV and tools and nothing of ours on PATH; the image writable through
    an overlay (root callers) that never reaches the shared rootfs; the host workspace writable at /testbed."""
    assert not Path(MARKER).exists()
    spec = make_spec(tmp_path)
    (spec.workspace / "from-host").write_text("host side\n")
    script = (
        f"cat {MARKER}; echo cwd=$PWD; cat /testbed/from-host; echo env=$POLAR_IMAGE_ENV; hello; "
        "touch /usr/x 2>/dev/null && echo usr-writable; touch /x 2>/dev/null && echo root-writable; "
        "echo inside > /testbed/new; touch /root/ok /tmp/ok; "
        "test -e /testbed/calc.py && echo image-repo-visible; "
        f"test -e {ROOT} && echo host-visible; "
        "echo socat=$(command -v socat) bash=$(command -v bash); "
        "echo nets=$(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ')"
    )
    with BwrapRuntime(rootfs=rootfs, workdir="/testbed") as rt:
        assert rt.paths.workspace == "/testbed"
        out = run_in(rt, spec, script, tmp_path).stdout.read_text()
    assert "first\ncwd=/testbed\nhost side\nenv=from-image\nhello from the image\n" in out
    assert ("usr-writable" in out) == (os.geteuid() == 0) and not (rootfs / "usr" / "x").exists()
    assert "root-writable" not in out and "host-visible" not in out
    assert "image-repo-visible" not in out  # the workspace is the host's directory, bound over the image's /testbed
    assert (spec.workspace / "new").read_text() == "inside\n" and (spec.home / "ok").exists()
    assert "socat= bash=/usr/bin/bash" in out  # the image has no socat; a grader brings none
    assert "nets=lo\n" in out


def test_host_node_runs_on_the_image(rootfs: Path, tmp_path: Path) -> None:
    """The image has no libstdc++: node loads the host's, and re-spawns itself through process.execPath."""
    assert not list(rootfs.glob("usr/lib/*/libstdc++.so.6*"))
    spawn = "require('child_process').execFileSync(process.execPath, ['-e', 'console.log(\"child\", 6 * 7)'])"
    script = ["node", "-e", f"console.log(process.execPath, process.version); process.stdout.write({spawn})"]
    app = FastAPI()
    app.get("/health")(lambda: {"ok": True})
    with BackgroundServer(app) as server, BwrapRuntime(rootfs=rootfs, workdir="/testbed") as rt:
        out = run_in(rt, make_spec(tmp_path, server.url), script, tmp_path).stdout.read_text()
    node_version = subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip()
    assert out == f"/run/polar-host-bin/node {node_version}\nchild 42\n"


def test_no_network_but_the_relayed_proxy(rootfs: Path, tmp_path: Path) -> None:
    """init.sh's relays run on the host's socat: the proxy check passes, requests get through, lookups reach only
    the egress audit, and nothing listens where an HTTP proxy would."""
    app = FastAPI()
    app.get("/health")(lambda: {"ok": True})
    app.get("/hello", response_class=PlainTextResponse)(lambda: "hello through the relay")
    script = (
        f"exec 3<>/dev/tcp/127.0.0.1/{PROXY_PORT}; printf 'GET /hello HTTP/1.0\\r\\n\\r\\n' >&3; tail -1 <&3; echo; "
        f"node -e \"require('http').get('http://127.0.0.1:{PROXY_PORT}/hello', r => r.pipe(process.stdout))\"; echo; "
        "getent hosts egress-probe.invalid || echo dns-refused; "
        "(exec 4<>/dev/tcp/127.0.0.1/3128) 2>/dev/null || echo no-http-proxy; "
        "env | grep -i '_proxy=' || echo no-proxy-variables"
    )
    with BackgroundServer(app) as server, get_runtime("bwrap", image=IMAGE, workdir="/testbed") as rt:
        assert isinstance(rt, BwrapRuntime)
        out = run_in(rt, make_spec(tmp_path, server.url), script, tmp_path).stdout.read_text()
        attempts = {(a.kind, a.target) for a in rt.egress_attempts()}
        assert rt.rootfs == image_rootfs(IMAGE)  # the one unpacked before (the image as rebuilt, if it was)
    assert out.count("hello through the relay") == 2
    assert "dns-refused" in out and "no-http-proxy" in out and "no-proxy-variables" in out
    assert ("dns", "egress-probe.invalid") in attempts
