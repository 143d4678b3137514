"""OpenHands SDK: an OpenHands agent (terminal, file editor, task tracker and ``task`` sub-agents, with its
LLM-summarising condenser) run by a small runner (:mod:`._openhands_runner`) through litellm's ``openai/`` provider
against the proxy's Chat Completions.

The SDK needs Python 3.12 while the system's is 3.11, and a sandbox sees only the system's ``/usr`` and the
harness's own install: so the install carries its interpreter. A Python 3.12 found on the host is copied into the
prefix with its ELF run paths made relative (``patchelf``: they name the host's install), its ``site-packages``
emptied (nothing of the host's), and the SDK installed into it with byte-code compiled (the prefix is mounted
read-only).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from importlib import resources
from pathlib import Path
from typing import Any

from nemo_polar.env.harness.base import Endpoint, EnvOption, GymValues, Launch, PythonHarness, _run_install, uv_binary

PYTHON = "3.12"
RUNNER = ".polar/openhands_runner.py"  # under HOME, written for each run
# openhands-tools requires browser-use and tom-swe (a browser agent and a user model), which the terminal, file
# editor, task tracker and task tools never import: it goes in without its requirements, after the ones those
# tools do import (its own pins on them).
TOOLS_REQUIREMENTS = (
    "tree-sitter>=0.24",
    "tree-sitter-bash>=0.23",
    "binaryornot>=0.6.0",
    "cachetools",
    "libtmux>=0.53.0",
    "func-timeout>=4.3.5",
)


def host_python(version: str = PYTHON) -> Path:
    """The base install (``sys.base_prefix``) of a Python ``version`` on this machine: ``python<version>`` on PATH,
    else one that pyenv or uv installed; or a clear error."""
    home = Path.home()
    pyenv = Path(os.environ.get("PYENV_ROOT") or home / ".pyenv") / "versions"
    uv = Path(os.environ.get("UV_PYTHON_INSTALL_DIR") or home / ".local" / "share" / "uv" / "python")
    candidates = [shutil.which(f"python{version}") or ""]
    candidates += sorted(str(p) for p in pyenv.glob(f"{version}*/bin/python{version}"))
    candidates += sorted(str(p) for p in uv.glob(f"cpython-{version}*/bin/python{version}"))
    for exe in filter(None, candidates):
        done = subprocess.run([exe, "-c", "import sys; print(sys.base_prefix)"], capture_output=True, text=True)
        if done.returncode == 0:  # (a pyenv shim on PATH fails unless that version is selected)
            return Path(done.stdout.strip())
    raise RuntimeError(
        f"openhands_sdk needs a Python {version}: python{version} on PATH, or one installed by pyenv or uv"
    )


def relocate(python: Path) -> None:
    """Run paths of a copied interpreter made relative to where they are: the executable, libpython and the
    extension modules then find each other wherever the prefix is mounted."""
    lib = python / "lib"
    elves = [*sorted((python / "bin").glob("python3*")), *sorted(lib.glob("libpython3*.so*"))]
    elves += sorted(lib.glob("python3*/lib-dynload/*.so"))
    for elf in elves:
        if elf.is_symlink() or not elf.is_file():
            continue
        rpath = subprocess.run(["patchelf", "--print-rpath", str(elf)], capture_output=True, text=True)
        if rpath.returncode != 0 or not rpath.stdout.strip():
            continue  # not an ELF file, or one with no run path to fix
        relative = os.path.relpath(lib, elf.parent)
        _run_install(["patchelf", "--set-rpath", f"$ORIGIN/{relative}".rstrip("/."), str(elf)], "relocation")


class OpenHandsSdk(PythonHarness):
    name = "openhands_sdk"
    package = "openhands-sdk"
    version = "1.58.2"
    bin = "python3.12"
    module = "openhands"  # not started with -m: the runner is a script
    order = 10
    demo_task = "polar__humanfmt-1"
    state_dirs = (".openhands",)
    env_options = (
        EnvOption("stream", False, "the SDK's default: one JSON answer per call"),
        EnvOption("max_iterations", 100, "its step budget"),
        EnvOption(
            "condenser_max_size", 80, "its condenser summarises the history past this many events (the SDK preset's)"
        ),
    )
    env_note = "an OpenHands SDK agent"
    gym = GymValues(
        title="An OpenHands SDK agent", agent="An OpenHands SDK agent", api="OpenAI Chat Completions through litellm"
    )

    def __init__(
        self,
        stream: bool = False,
        max_iterations: int = 100,
        condenser_max_size: int = 80,
        condenser_keep_first: int = 4,
    ) -> None:
        """``stream``: the SDK's own default is one JSON answer per call. ``max_iterations``: its step budget.
        ``condenser_max_size`` / ``condenser_keep_first``: its LLM-summarising condenser (the SDK preset's 80 and 4)
        summarises the history once it holds more events than ``condenser_max_size``, keeping the first
        ``condenser_keep_first``."""
        self.options = {
            "stream": stream,
            "max_iterations": max_iterations,
            "condenser_max_size": condenser_max_size,
            "condenser_keep_first": condenser_keep_first,
        }

    @classmethod
    def install_into(cls, prefix: Path) -> str:
        if shutil.which("patchelf") is None:
            raise RuntimeError("openhands_sdk's install needs patchelf (make setup installs it)")
        if not (uv := uv_binary()):  # the copied interpreter has no pip: its site-packages start empty
            raise RuntimeError("openhands_sdk's install needs uv (the project's venv has it: make setup)")
        python = prefix / "python"
        shutil.rmtree(python, ignore_errors=True)
        shutil.copytree(
            host_python(),
            python,
            symlinks=True,
            ignore=shutil.ignore_patterns("test", "idlelib", "__pycache__", "*.a"),
        )
        site = next(python.glob("lib/python3*/site-packages"))
        shutil.rmtree(site)
        site.mkdir()
        relocate(python)
        exe = str(python / "bin" / cls.bin)
        spec = f"{cls.package}=={cls.version}"
        install = [uv, "pip", "install", "--quiet", "--compile-bytecode", "--python", exe]
        _run_install([*install, spec, *TOOLS_REQUIREMENTS], spec)
        _run_install([*install, "--no-deps", f"openhands-tools=={cls.version}"], spec)
        return f"{spec} openhands-tools=={cls.version}"

    def executable(self, root: str) -> str:
        return f"{root}/python/bin/{self.bin}"

    def launch(self, instruction: str, endpoint: Endpoint, *, root: str, home: str, workspace: str) -> Launch:
        env = {
            "LLM_MODEL": f"openai/{endpoint.model}",  # litellm's OpenAI-compatible provider; the body names the model
            "LLM_BASE_URL": f"{endpoint.base_url}/v1",
            "LLM_API_KEY": endpoint.api_key,
            "POLAR_OPENHANDS": json.dumps(self.options),
            # litellm's bundled cost map, not a download when it is imported; no .env search; no banner
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "LITELLM_MODE": "PRODUCTION",
            "OPENHANDS_SUPPRESS_BANNER": "1",
        }
        runner = resources.files("nemo_polar.env.harness").joinpath("_openhands_runner.py").read_text()
        argv = [self.executable(root), f"{home}/{RUNNER}", workspace, instruction]
        return Launch(argv=argv, env=env, files={RUNNER: runner})

    def shell(self, command: str) -> tuple[str, dict[str, Any]]:
        return "terminal", {"command": command}

    def read_file(self, path: str) -> tuple[str, dict[str, Any]]:
        return "file_editor", {"command": "view", "path": path}

    def edit_file(self, path: str, old: str, new: str) -> tuple[str, dict[str, Any]]:
        return "file_editor", {"command": "str_replace", "path": path, "old_str": old, "new_str": new}

    def subagent(self, description: str, prompt: str) -> tuple[str, dict[str, Any]]:
        return "task", {"description": description, "prompt": prompt, "subagent_type": "general-purpose"}
