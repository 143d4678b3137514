"""Where an instance's environment comes from: one decision, taken by the agent's runtime and the grader alike.

- **image** (SWE-bench 5 rows and task directories): the instance's image is its system and its ``/testbed`` the
  code. ``docker`` runs fresh containers of it; ``bwrap`` runs its filesystem unpacked once into a cached,
  read-only rootfs (skopeo + umoci: no daemon, for clusters). Either way the code is bound in writable at
  ``/testbed`` from a host copy: the agent gets the tree one commit deep (no other commit reachable, SWE-bench#465),
  the grader the image's ``/testbed`` as it is, history included (eval scripts check out the base commit's test
  files).
- **checkout** (bundled tasks, a local repository + ``python_env``): the host's system, the code at ``/workspace``.
"""

from __future__ import annotations

import contextlib
import io
import shutil
import tarfile
import tempfile
from pathlib import Path

from pydantic import BaseModel

from nemo_polar.paths import cache_dir
from nemo_polar.sandbox import Runtime, RuntimeUnavailable, get_runtime
from nemo_polar.sandbox.workspace import Task, prepare_workspace

IMAGE_WORKDIR = "/testbed"  # where SWE-bench images keep the repository


class InstanceEnvironment(BaseModel):
    instance_id: str
    image: str | None = None
    repo: Path | None = None
    base_commit: str | None = None
    python_env: Path | None = None

    @property
    def kind(self) -> str:
        return "image" if self.image else "checkout"

    def runtime(self, name: str) -> Runtime:
        """A runtime ``name`` that runs this environment's system (an image: ``bwrap`` or ``docker``)."""
        if self.image is None:
            return get_runtime(name)
        return get_runtime(name, image=self.image, workdir=IMAGE_WORKDIR)

    def code(self, runtime: str) -> Path:
        """The host directory holding the code as the environment has it (read it, never write it)."""
        if self.image is None:
            assert self.repo is not None
            return self.repo
        if runtime == "docker":
            return docker_testbed(self.image)
        from nemo_polar.sandbox.images import image_rootfs

        testbed = image_rootfs(self.image) / IMAGE_WORKDIR.lstrip("/")
        if not testbed.is_dir():
            raise RuntimeUnavailable(f"image {self.image} has no {IMAGE_WORKDIR}: not a SWE-bench instance image")
        return testbed

    def task(self, problem_statement: str, runtime: str) -> Task:
        """What the agent works on: the code as a new one-commit repository (for an image, its tree as it is,
        build outputs included, minus its history)."""
        return Task(
            instance_id=self.instance_id,
            problem_statement=problem_statement,
            repo=self.code(runtime),
            base_commit=None if self.image else self.base_commit,
            whole_tree=self.image is not None,
        )

    def grading_workspace(self, runtime: str, dest: Path) -> Path:
        """The tree the grader patches and tests: the image's /testbed with its history, else the checkout."""
        if self.image is None:
            return prepare_workspace(self.task("", runtime), dest)
        shutil.copytree(self.code(runtime), dest, symlinks=True)
        return dest

    def tool_mounts(self) -> tuple[dict[str, Path], dict[str, str]]:
        """Read-only mounts and environment that give tools the instance's Python: a checkout's ``python_env``
        first on PATH (an image has its own)."""
        if self.python_env is None:
            return {}, {}
        if not (self.python_env / "bin" / "python").exists():
            raise FileNotFoundError(f"python_env {self.python_env} of {self.instance_id} does not exist; make setup")
        env = {"PATH": f"{self.python_env}/bin:/usr/local/bin:/usr/bin:/bin", "VIRTUAL_ENV": str(self.python_env)}
        return {str(self.python_env): self.python_env}, env


def docker_testbed(image: str) -> Path:
    """The image's /testbed exported once from the local docker daemon (pulled by name if it is missing there),
    cached by the image's id: a rebuilt image gets a new copy."""
    from nemo_polar.sandbox.docker import docker_client, find_image

    client = docker_client()
    try:
        from docker.errors import NotFound

        found = find_image(client, image, pull=True)
        root = cache_dir() / "testbeds" / found.id.replace(":", "-")
        out = root / "testbed"
        if out.is_dir():
            return out
        root.mkdir(parents=True, exist_ok=True)
        container = client.containers.create(found.id, command=["true"])
        try:
            stream, _ = container.get_archive(IMAGE_WORKDIR)
            staging = Path(tempfile.mkdtemp(dir=root))
            with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
                tar.extractall(staging, filter="tar")
        except NotFound:
            raise RuntimeUnavailable(f"image {image} has no {IMAGE_WORKDIR}: not a SWE-bench instance image") from None
        finally:
            container.remove(force=True)
        with contextlib.suppress(OSError):  # another process got there first: keep its copy
            (staging / "testbed").rename(out)
        shutil.rmtree(staging, ignore_errors=True)
        return out
    finally:
        client.close()
