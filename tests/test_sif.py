"""Apptainer SIF files as images of the daemonless runtime: the squashfs system partition unpacked once into the
read-only rootfs cache, the image's environment from Apptainer's env scripts, a rebuilt SIF unpacked afresh, bad
files named in one line, and docker refusing a SIF by name. (A SIF of a real project's image runs and is graded in
bwrap in ``tests/test_swebench5.py``.)"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from unittest.mock import MagicMock

import pytest

from nemo_polar.sandbox.base import RuntimeUnavailable
from nemo_polar.sandbox.images import image_env, image_rootfs
from nemo_polar.sandbox.sif import DESCRIPTOR, HEADER, SifError, is_sif, read_sif
from tests.sif import make_sif, squashfs, write_sif

pytestmark = pytest.mark.skipif(shutil.which("mksquashfs") is None, reason="squashfs-tools missing (make setup)")


def tiny_rootfs(root: Path) -> Path:
    (root / "usr" / "bin").mkdir(parents=True)
    (root / "testbed").mkdir()
    (root / "testbed" / "mod.py").write_text("x = 1\n")
    os.symlink("usr/bin", root / "bin")
    (root / "usr" / "bin" / "tool").write_text("#!/bin/sh\necho hi\n")
    (root / "usr" / "bin" / "tool").chmod(0o755)
    return root


def test_a_sif_is_unpacked_once_with_its_environment(tmp_path: Path) -> None:
    env = {"PATH": "/opt/env/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
    sif = make_sif(tiny_rootfs(tmp_path / "src"), tmp_path / "img.sif", env)
    cache = tmp_path / "cache"
    rootfs = image_rootfs(str(sif), cache)
    assert (rootfs / "testbed" / "mod.py").read_text() == "x = 1\n" and (rootfs / "bin").is_symlink()
    assert os.access(rootfs / "usr" / "bin" / "tool", os.X_OK)
    assert image_env(rootfs) == env
    assert image_rootfs(f"sif:{sif}", cache) == rootfs  # the same file by its transport name: the same rootfs

    rebuilt = make_sif(tiny_rootfs(tmp_path / "src2"), tmp_path / "img.sif", {"PATH": "/usr/bin"})
    assert image_rootfs(str(rebuilt), cache) != rootfs  # a rebuilt SIF is a new image
    assert len([p for p in cache.iterdir() if not p.name.startswith(".")]) == 2


def test_defaulted_and_other_lines_of_the_env_scripts(tmp_path: Path) -> None:
    from nemo_polar.sandbox.sif import sif_env

    env_dir = tmp_path / ".singularity.d" / "env"
    env_dir.mkdir(parents=True)
    (env_dir / "10-docker2singularity.sh").write_text(
        '#!/bin/sh\nexport PATH="/usr/local/bin:/usr/bin"\nexport HOME=${HOME:-/root}\nif [ -x x ]; then :; fi\n'
    )
    (env_dir / "90-environment.sh").write_text("export LANG='C.UTF-8'  # a comment\nexport BROKEN=\"x\n")
    os.symlink("/etc/hostname", env_dir / "95-link.sh")  # a link is never followed to a host file
    assert sif_env(tmp_path) == ["PATH=/usr/local/bin:/usr/bin", "HOME=/root", "LANG=C.UTF-8"]


def test_bad_sif_files_are_named(tmp_path: Path) -> None:
    squash = squashfs(tiny_rootfs(tmp_path / "src"), tmp_path / "root.sqfs", {})
    good = write_sif(tmp_path / "good.sif", squash).read_bytes()
    [table_offset] = HEADER.unpack_from(good)[9:10]
    cases = {
        "not_sif": (b"\x7fELF" + b"\0" * 200, "is not a SIF file"),
        "short": (good[:60], "is not a SIF file"),
        "truncated_table": (good[: table_offset + 10], "truncated SIF (the descriptor table"),
        "truncated_data": (good[:-4096], "truncated SIF (its system partition"),
    }
    for name, (data, needle) in cases.items():
        path = tmp_path / f"{name}.sif"
        path.write_bytes(data)
        with pytest.raises(SifError, match="^" + str(path)) as caught:
            read_sif(str(path))
        assert needle in str(caught.value) and "\n" not in str(caught.value), name
    no_system = bytearray(good)  # the partition is a data partition, not the system one
    part = table_offset + DESCRIPTOR.size
    no_system[part + DESCRIPTOR.size - 384 + 4 : part + DESCRIPTOR.size - 384 + 8] = (3).to_bytes(4, "little")
    (tmp_path / "data_only.sif").write_bytes(no_system)
    with pytest.raises(SifError, match="without a system partition"):
        read_sif(str(tmp_path / "data_only.sif"))
    ext3 = bytearray(good)
    ext3[part + DESCRIPTOR.size - 384 : part + DESCRIPTOR.size - 384 + 4] = (2).to_bytes(4, "little")
    (tmp_path / "ext3.sif").write_bytes(ext3)
    with pytest.raises(SifError, match="is not squashfs"):
        read_sif(str(tmp_path / "ext3.sif"))
    with pytest.raises(SifError, match="does not exist"):
        image_rootfs(str(tmp_path / "missing.sif"), tmp_path / "cache")
    garbage = bytearray(good)  # the partition's squashfs superblock overwritten
    offset = read_sif(str(tmp_path / "good.sif")).offset
    garbage[offset : offset + 4] = b"XXXX"
    (tmp_path / "garbage.sif").write_bytes(garbage)
    with pytest.raises(SifError, match="cannot unpack"):
        image_rootfs(str(tmp_path / "garbage.sif"), tmp_path / "cache")
    assert not [p for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".")]  # nothing half-made kept


def test_docker_refuses_a_sif_by_name() -> None:
    from nemo_polar.sandbox.docker import find_image

    assert is_sif("/images/sweb.eval.x86_64.a_1776_b-1.sif") and is_sif("sif:/images/x")
    assert not is_sif("swebench/sweb.eval.x86_64.a_1776_b-1:latest")
    client = MagicMock()
    with pytest.raises(RuntimeUnavailable, match="Apptainer SIF file: docker cannot run it; use runtime bwrap"):
        find_image(client, "/images/x.sif", pull=True)
    assert not client.mock_calls
