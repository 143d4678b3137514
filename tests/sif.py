"""Apptainer SIF files for tests, where Apptainer is not installed: a root filesystem as a squashfs (mksquashfs)
with Apptainer's environment script, in a SIF laid out as sylabs/sif writes one (``pkg/sif/create.go`` at 4c44215:
the header, the descriptor table at 4096, each object aligned; a definition-file object before the system
partition and a free slot after it, as ``apptainer build`` leaves them). Checked against sylabs/sif's own test
images when written: the reader finds their squashfs partition at the offset the library put it."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from nemo_polar.sandbox.sif import DATA_PARTITION, DESCRIPTOR, FS_SQUASH, HEADER, MAGIC, PART_PRIMSYS, PARTITION

DATA_DEFFILE = 0x4001
TABLE_OFFSET = 4096
ALIGN = 4096
ARCH_AMD64 = b"02\0"


def squashfs(rootfs: Path, out: Path, env: dict[str, str]) -> Path:
    """``rootfs`` as a squashfs, with ``/.singularity.d/env/10-docker2singularity.sh`` exporting ``env``."""
    script = out.with_name(out.name + ".env.sh")
    script.write_text("#!/bin/sh\n" + "".join(f'export {k}="{v}"\n' for k, v in env.items()))
    pseudo = [
        "/.singularity.d d 755 0 0",
        "/.singularity.d/env d 755 0 0",
        f"/.singularity.d/env/10-docker2singularity.sh f 755 0 0 cat {script}",
    ]
    cmd = ["mksquashfs", str(rootfs), str(out), "-noappend", "-quiet", "-no-progress", "-comp", "lz4"]
    subprocess.run([*cmd, *(a for p in pseudo for a in ("-p", p))], check=True, capture_output=True)
    script.unlink()
    return out


def descriptor(kind: int, ident: int, offset: int, size: int, extra: bytes = b"", used: bool = True) -> bytes:
    now = int(time.time())
    group = 0xF0000001  # the first object group, as sylabs/sif groups an image's objects
    return DESCRIPTOR.pack(kind, used, ident, group, 0, offset, size, size, now, now, 0, 0, b"", extra)


def write_sif(out: Path, squash: Path, definition: bytes = b"Bootstrap: docker\n") -> Path:
    """A SIF of the squashfs ``squash`` as its system partition."""
    slots = 3
    table_size = slots * DESCRIPTOR.size
    def_offset = TABLE_OFFSET + table_size
    part_offset = -(-(def_offset + len(definition)) // ALIGN) * ALIGN
    part_size = squash.stat().st_size
    partition = PARTITION.pack(FS_SQUASH, PART_PRIMSYS, ARCH_AMD64)
    table = b"".join(
        [
            descriptor(DATA_DEFFILE, 1, def_offset, len(definition)),
            descriptor(DATA_PARTITION, 2, part_offset, part_size, partition),
            descriptor(0, 0, 0, 0, used=False),
        ]
    )
    now = int(time.time())
    launch = b"#!/usr/bin/env run-singularity\n".ljust(32, b"\0")
    header = HEADER.pack(
        launch, MAGIC, b"01\0", ARCH_AMD64, os.urandom(16), now, now, 1, slots, TABLE_OFFSET, table_size,
        def_offset, part_offset + part_size - def_offset,
    )  # fmt: skip
    with out.open("wb") as fh:
        fh.write(header)
        fh.seek(TABLE_OFFSET)
        fh.write(table)
        fh.write(definition)
        fh.seek(part_offset)
        with squash.open("rb") as src:
            shutil.copyfileobj(src, fh, 1 << 20)
    return out


def make_sif(rootfs: Path, out: Path, env: dict[str, str]) -> Path:
    squash = squashfs(rootfs, out.with_name(out.name + ".sqfs"), env)
    try:
        return write_sif(out, squash)
    finally:
        squash.unlink()
