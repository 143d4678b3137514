"""The venvs NeMo Gym runs the Polar environments' servers from, on a Python older than nemo-gym's own marker.

Gym runs each server (the Polar agent, the native ``polar_env`` server, Gym's own ``legacy_agent`` relay) from a venv
it builds with ``uv`` at ``<uv_venv_dir>/<server type>/<server name>/.venv``, ``uv_venv_dir`` being the working
directory by default (nemo_gym/cli/setup_command.py ``get_venv_path``, nemo_gym/global_config.py, nemo-gym 0.7.0).
It installs ``nemo-gym==<its own version>`` there, which uv refuses on a Python below nemo-gym's ``Requires-Python``
(>= 3.13.14), though the package imports and serves fine on 3.11 (``make setup`` installs it past the marker). With
``++skip_venv_if_present=true`` Gym reuses a venv that has ``bin/python`` and ``bin/activate`` and runs no ``uv``.

So on such a Python, :func:`prepare` puts in each of those places an overlay venv: an empty venv of this interpreter
whose ``.pth`` adds this environment's site-packages (``site.addsitedir``, so the editable install's own ``.pth``
files count), checked by importing what the server imports. One that fails the check (an empty venv a failed ``uv``
left, a moved checkout) is built again. On a Python that meets the marker it does nothing: Gym's own way stands.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
import sysconfig
import venv
from dataclasses import dataclass
from pathlib import Path

import yaml
from packaging.specifiers import SpecifierSet

from nemo_polar.env.gym import environments, gym_root

OVERLAY_PTH = "_polar_overlay.pth"
# What each server's entrypoint imports first (its app.py): the check that the venv serves it.
IMPORTS = {
    "polar_agent": ("nemo_gym", "fastapi", "nemo_polar.env.gym.agent"),
    "polar_env": ("nemo_gym", "fastapi", "nemo_polar.env.gym.environment_server"),
}
GYM_IMPORTS = ("nemo_gym", "fastapi", "ray")  # Gym's own servers (legacy_agent)


class VenvError(RuntimeError):
    pass


@dataclass(frozen=True)
class ServerVenv:
    server_type: str  # responses_api_agents, environment_servers
    server_name: str  # polar_agent, polar_env, legacy_agent
    path: Path  # the venv

    @property
    def imports(self) -> tuple[str, ...]:
        return IMPORTS.get(self.server_name, GYM_IMPORTS)


def gym_requires_python() -> str:
    return importlib.metadata.metadata("nemo-gym")["Requires-Python"] or ""


def gym_builds_its_venvs(version: str | None = None) -> bool:
    """Whether this Python meets nemo-gym's ``Requires-Python``: then uv builds Gym's venvs as Gym means it to."""
    here = version or ".".join(str(part) for part in sys.version_info[:3])
    return SpecifierSet(gym_requires_python()).contains(here)


def servers(environment: str) -> list[tuple[str, str]]:
    """The (server type, server name) of each server instance an environment's config defines."""
    if environment not in environments():
        raise VenvError(f"unknown environment {environment!r}: one of {', '.join(environments())}")
    config = yaml.safe_load((gym_root() / "environments" / environment / "config.yaml").read_text())
    found = []
    for instance in config.values():
        for server_type, by_name in instance.items():
            found += [(server_type, name) for name in by_name]
    return found


def server_venvs(environments: list[str], venv_dir: Path) -> list[ServerVenv]:
    """Where Gym looks for each server's venv under ``uv_venv_dir`` = ``venv_dir`` (``get_venv_path``)."""
    wanted = dict.fromkeys(s for env in environments for s in servers(env))
    return [ServerVenv(t, n, (venv_dir / t / n / ".venv").absolute()) for t, n in wanted]


def _serves(server: ServerVenv) -> str | None:
    """None when the venv's interpreter imports what its server needs, else why not."""
    python = server.path / "bin" / "python"
    if not (python.exists() and (server.path / "bin" / "activate").exists()):
        return "no venv"
    code = "; ".join(f"import {module}" for module in server.imports)
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=300)
    return None if done.returncode == 0 else (done.stderr.strip().splitlines() or ["import failed"])[-1]


def _build(server: ServerVenv) -> None:
    if server.path.exists() or server.path.is_symlink():
        if server.path.is_symlink() or not server.path.is_dir():
            server.path.unlink()
        else:
            shutil.rmtree(server.path)
    venv.EnvBuilder(with_pip=False, symlinks=True).create(server.path)
    site = Path(sysconfig.get_paths(vars={"base": str(server.path), "platbase": str(server.path)})["purelib"])
    ours = sysconfig.get_paths()["purelib"]
    (site / OVERLAY_PTH).write_text(f"import site; site.addsitedir({ours!r})\n")


def prepare(environments: list[str], venv_dir: Path) -> list[tuple[ServerVenv, str]]:
    """Each server venv the environments need, reused where it serves, else built: (venv, "reused" | "built")."""
    done = []
    for server in server_venvs(environments, venv_dir):
        if _serves(server) is None:
            done.append((server, "reused"))
            continue
        _build(server)
        if (why := _serves(server)) is not None:
            raise VenvError(f"the venv for {server.server_type}/{server.server_name} at {server.path}: {why}")
        done.append((server, "built"))
    return done


def gym_overrides(venv_dir: Path, cwd: Path | None = None) -> list[str]:
    """What the ``gym`` command is given so that it reuses those venvs (nemo-gym's ``skip_venv_if_present`` and
    ``uv_venv_dir`` keys)."""
    overrides = ["++skip_venv_if_present=true"]
    if venv_dir.resolve() != (cwd or Path.cwd()).resolve():
        overrides.append(f"++uv_venv_dir={venv_dir.resolve()}")
    return overrides
