"""Apptainer / Singularity image files (SIF) as images for the daemonless runtime.

NeMo Gym's and NeMo-RL's SWE configs name instance images as ``.sif`` files (``container_formatter``). A SIF is a
header, a table of descriptors and their data objects; the image's root filesystem is the descriptor of type
``DataPartition`` whose partition is ``FsSquash`` + ``PartPrimSys``: a squashfs, unpacked here with
``unsquashfs -offset`` into the same read-only cached rootfs an OCI image gets. The layout is sylabs/sif's
(``pkg/sif/sif.go`` ``header`` and ``descriptor.go`` ``rawDescriptor`` / ``partition``, read with Go's
``binary.Read``: little-endian, packed; sylabs/sif at 4c44215). The image's environment is what Apptainer writes
into ``/.singularity.d/env/*.sh`` (``10-docker2singularity.sh`` holds a converted docker image's ``ENV``s).
"""

from __future__ import annotations

import hashlib
import re
import shlex
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

from nemo_polar.sandbox.base import RuntimeUnavailable

SQUASHFS = "apt-get install squashfs-tools (scripts/setup_system.sh does)"
HEADER = struct.Struct(
    "<32s10s3s3s16s8q"
)  # launch script, magic, version, arch, id, 8 int64 (times, descriptors, data)
DESCRIPTOR = struct.Struct(
    "<i?III7q128s384s"
)  # type, used, id, group, link, offset, size, padded, times, uid/gid, name
PARTITION = struct.Struct("<ii3s")  # the descriptor's extra bytes for a partition: fs type, partition type, arch
MAGIC = b"SIF_MAGIC\0"
DATA_PARTITION, FS_SQUASH, PART_PRIMSYS = 0x4004, 1, 2
ENV_DIR = ".singularity.d/env"
_DEFAULTED = re.compile(r"^\$\{(\w+):?-(.*)\}$")  # "${PATH:-/usr/bin}": unset in a fresh sandbox, so the default


class SifError(RuntimeUnavailable):
    """Not a SIF, or one without a squashfs system partition; the message names the file."""


def is_sif(image: str) -> bool:
    """``sif:PATH`` or a path ending in ``.sif``."""
    return image.startswith("sif:") or image.endswith(".sif")


@dataclass(frozen=True)
class SifImage:
    path: Path
    offset: int  # of the squashfs system partition
    size: int
    key: str  # the cache key: the digest of the header and descriptors (a new ID and times on every build)

    def unpack(self, rootfs: Path) -> None:
        """The partition's files into ``rootfs`` (which must not exist yet)."""
        cmd = ["unsquashfs", "-no-progress", "-quiet", "-no-xattrs", "-offset", str(self.offset), "-dest"]
        done = subprocess.run([*cmd, str(rootfs), str(self.path)], capture_output=True, text=True)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [f"exit {done.returncode}"]
            raise SifError(f"cannot unpack {self.path}: unsquashfs: {tail[0]}")


def read_sif(image: str) -> SifImage:
    """The system partition of the SIF ``image`` names."""
    path = Path(image.removeprefix("sif:"))
    try:
        with path.open("rb") as fh:
            head = fh.read(HEADER.size)
            if len(head) < HEADER.size or HEADER.unpack(head)[1] != MAGIC:
                raise SifError(f"{path} is not a SIF file (no SIF_MAGIC header)")
            *_, total, table_offset, table_size, _data_offset, _data_size = HEADER.unpack(head)[5:]
            if total < 0 or table_size != total * DESCRIPTOR.size:
                raise SifError(f"{path}: a SIF descriptor table of {table_size} bytes for {total} descriptors")
            fh.seek(table_offset)
            table = fh.read(table_size)
            file_size = fh.seek(0, 2)
    except FileNotFoundError:
        raise SifError(f"SIF image {path} does not exist") from None
    except OSError as exc:
        raise SifError(f"cannot read SIF image {path}: {exc}") from None
    if len(table) != table_size:
        raise SifError(f"{path}: truncated SIF (the descriptor table ends past the file)")
    for kind, used, *_ids, offset, size, _padded, _c, _m, _u, _g, _name, extra in DESCRIPTOR.iter_unpack(table):
        if not used or kind != DATA_PARTITION:
            continue
        fstype, parttype, _arch = PARTITION.unpack_from(extra)
        if parttype != PART_PRIMSYS:
            continue
        if fstype != FS_SQUASH:
            raise SifError(f"{path}: its system partition is not squashfs (fs type {fstype}): not supported")
        if offset < 0 or size <= 0 or offset + size > file_size:
            raise SifError(f"{path}: truncated SIF (its system partition ends past the file)")
        key = "sif-" + hashlib.sha256(head + table).hexdigest()
        return SifImage(path=path, offset=offset, size=size, key=key)
    raise SifError(f"{path}: a SIF without a system partition (no root filesystem to run)")


def sif_env(rootfs: Path) -> list[str]:
    """``NAME=value`` for each ``export NAME=value`` of the image's ``/.singularity.d/env/*.sh``, in their order;
    anything else in them (functions, conditionals) is not an environment the image declares."""
    env: dict[str, str] = {}
    folder = rootfs / ENV_DIR
    scripts = sorted(folder.glob("*.sh")) if folder.is_dir() and not folder.is_symlink() else []
    for script in (s for s in scripts if s.is_file() and not s.is_symlink()):  # never a host file by a link
        for line in script.read_text(errors="replace").splitlines():
            try:
                words = shlex.split(line, comments=True)
            except ValueError:
                continue
            if len(words) == 2 and words[0] == "export" and "=" in words[1]:
                name, value = words[1].split("=", 1)
                if match := _DEFAULTED.match(value):
                    value = env.get(match.group(1), match.group(2))
                env[name] = value
    return [f"{k}={v}" for k, v in env.items()]
