"""The import graph is the data flow: the layer and no-cycle contracts in pyproject.toml ([tool.importlinter]) hold,
checked by import-linter itself, and they cover every module (a new one must be placed in a layer)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import nemo_polar

ROOT = Path(__file__).resolve().parents[1]
CONTRACTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def test_the_import_contracts_are_kept() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run(
        [str(lint), "--config", "pyproject.toml", "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert f"{len(CONTRACTS)} kept, 0 broken" in done.stdout


def _children(package: Path) -> set[str]:
    return {
        p.stem if p.is_file() else p.name
        for p in package.iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p.is_dir() and (p / "__init__.py").exists())
    }


def _layered(contract: dict) -> set[str]:
    names = {n.strip() for layer in contract["layers"] for n in layer.replace(":", "|").split("|")}
    return {n.removeprefix("nemo_polar.") for n in names}


def test_every_module_has_a_layer() -> None:
    by_container = {tuple(c.get("containers", ["nemo_polar"])): c for c in CONTRACTS if c["type"] == "layers"}
    package = Path(nemo_polar.__file__).parent
    for container, path in (("nemo_polar", package), ("nemo_polar.env", package / "env")):
        missing = _children(path) - _layered(by_container[(container,)]) - {"data", "__main__"}
        assert not missing, f"{container}: place {sorted(missing)} in a layer of pyproject.toml"
    gateway = by_container[("nemo_polar.env.gateway",)]
    assert _children(package / "env" / "gateway") == _layered(gateway)
    assert any(c["type"] == "acyclic_siblings" and c["ancestors"] == ["nemo_polar"] for c in CONTRACTS)
