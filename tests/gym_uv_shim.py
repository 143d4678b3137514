"""``uv`` for NeMo Gym's venv setup as it runs on a cluster, on this machine's older Python.

nemo-gym (0.5.1 and 0.7.0) declares ``Requires-Python >=3.13.14``, like NeMo-RL, whose nodes run 3.13.14; this machine
has 3.11, on which uv refuses to resolve nemo-gym at all. The test puts this file first on PATH as ``uv`` and Gym's
commands run unchanged: ``uv venv ...`` passes through, and each ``uv pip install ARGS`` becomes

1. ``uv pip install --python-version 3.13.14 ARGS``: the resolution a 3.13.14 node makes, requires-python and markers
   included, installed into the venv Gym activated;
2. for every installed wheel this interpreter cannot load (step 1 picked the cp313 builds of compiled packages),
   ``uv pip install --only-binary :all: --reinstall-package NAME 'NAME<=VERSION' -c <everything else, pinned>``:
   the resolved version where it has a wheel for this Python, else the newest earlier one that does (numpy 2.5,
   for one, has no 3.11 wheels).

Pure-Python wheels (nemo-gym, nemo_polar, most of the tree) stay exactly as resolved for 3.13.14.
``POLAR_SHIM_REAL_UV`` names the real uv; ``POLAR_SHIM_PYTHON_VERSION`` overrides 3.13.14.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from email.parser import HeaderParser
from pathlib import Path

from packaging.tags import parse_tag, sys_tags

REAL_UV = os.environ["POLAR_SHIM_REAL_UV"]
RESOLVE_FOR = os.environ.get("POLAR_SHIM_PYTHON_VERSION", "3.13.14")


def site_packages() -> Path:
    # Gym sources the venv's bin/activate before `uv pip install`, which is how uv finds it too.
    return next(Path(os.environ["VIRTUAL_ENV"]).glob("lib/python3*/site-packages"))


def installed(site: Path) -> dict[str, tuple[str, bool]]:
    """Every installed distribution: name -> (version, whether this interpreter can load its wheel)."""
    supported = set(sys_tags())
    found = {}
    for info in sorted(site.glob("*.dist-info")):
        meta = HeaderParser().parsestr((info / "METADATA").read_text())
        wheel = info / "WHEEL"
        lines = HeaderParser().parsestr(wheel.read_text()).get_all("Tag", []) if wheel.is_file() else []
        tags = {t for line in lines for t in parse_tag(line)}
        found[meta["Name"]] = (meta["Version"], not tags or bool(tags & supported))
    return found


def main(argv: list[str]) -> int:
    if argv[:2] != ["pip", "install"]:
        os.execv(REAL_UV, [REAL_UV, *argv])
    resolved = subprocess.call([REAL_UV, "pip", "install", "--python-version", RESOLVE_FOR, *argv[2:]])
    if resolved:
        return resolved
    dists = installed(site_packages())
    foreign = sorted(name for name, (_, loads) in dists.items() if not loads)
    if not foreign:
        return 0
    print(f"uv shim: wheels resolved for {RESOLVE_FOR} that this Python cannot load: {' '.join(foreign)}", flush=True)
    # The newest build of each at most the resolved version that has a wheel for this Python (numpy 2.5, for one,
    # has none for 3.11); everything else stays exactly as resolved for RESOLVE_FOR.
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as pins:
        pins.write("".join(f"{n}=={v}\n" for n, (v, loads) in dists.items() if loads))
        pins.flush()
        cmd = [REAL_UV, "pip", "install", "--only-binary", ":all:", "-c", pins.name]
        cmd += [arg for name in foreign for arg in ("--reinstall-package", name)]
        return subprocess.call(cmd + [f"{name}<={dists[name][0]}" for name in foreign])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
