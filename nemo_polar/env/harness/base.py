"""The harness interface: one small adapter per coding CLI.

An adapter knows the CLI's pinned npm package, how to point it at a proxy session (config files, environment,
command line), how to read the transcript it prints, which paths it leaves in a workspace, and how the scripted
policy's actions map onto its own tools.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from abc import ABC, abstractmethod
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, Field

from nemo_polar.env.script import Action, EditFile, Final, ReadFile, Shell, Subagent, ToolCalls
from nemo_polar.paths import cache_dir
from nemo_polar.proxy.sessions import ScriptCall, ScriptTurn

HARNESS_MOUNT = "/opt/polar/harness"  # where the pinned install appears inside a sandbox
# Never part of a patch: harness state, caches and environments, wherever a CLI put them.
COMMON_EXCLUDES = (
    ".codex",
    ".claude",
    ".qwen",
    ".pi",
    ".opencode",
    ".gemini",
    ".hermes",
    ".copilot",
    ".cline",
    ".openhands",
    "node_modules",
    "__pycache__",
    "*.pyc",
    ".pytest_cache",
    ".venv",
    ".mypy_cache",
    ".ruff_cache",
)


def _run_install(argv: list[str], spec: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:2])} {spec} failed:\n{done.stderr[-2000:]}")


def one_of(harness: str, option: str, value: str, allowed: Iterable[str]) -> str:
    """An adapter option's value, or a clear error that names the values it takes."""
    allowed = list(allowed)
    if value not in allowed:
        raise ValueError(f"{harness} {option} must be one of {', '.join(allowed)}, not {value!r}")
    return value


def uv_binary() -> str:
    """uv, on PATH or beside the project's interpreter ('' if neither)."""
    uv = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    return uv if Path(uv).exists() else ""


class HarnessMissing(RuntimeError):
    """The pinned CLI is not installed; the message says how to install it."""


class Unsupported(ValueError):
    """The CLI has no tool for a scripted action (e.g. no subagent tool); the message says why."""


class Endpoint(BaseModel):
    """A proxy session as the harness inside the runtime reaches it."""

    base_url: str = Field(description="scheme://host:port, no /v1")
    api_key: str
    model: str = "local-model"


class Launch(BaseModel):
    argv: list[str]
    env: dict[str, str] = Field(default_factory=dict)
    files: dict[str, str] = Field(default_factory=dict, description="written under HOME before the run")


class Harness(ABC):
    name: ClassVar[str]
    package: ClassVar[str]
    version: ClassVar[str]
    bin: ClassVar[str]
    transcript_format: ClassVar[str] = "jsonl"  # what the CLI prints on stdout in the chosen output mode

    # -- installation (once, by `make setup`, into a shared prefix mounted read-only) -----------------------------
    @classmethod
    def prefix(cls) -> Path:
        return cache_dir() / "harnesses" / f"{cls.name}-{cls.version}"

    @classmethod
    def installed(cls) -> bool:
        return (cls.prefix() / ".polar-installed").exists()

    @classmethod
    def install(cls) -> Path:
        prefix = cls.prefix()
        if cls.installed():
            return prefix
        prefix.mkdir(parents=True, exist_ok=True)
        spec = cls.install_into(prefix)
        cls.post_install(prefix)
        (prefix / ".polar-installed").write_text(spec + "\n")
        return prefix

    @classmethod
    def install_into(cls, prefix: Path) -> str:
        """Install the pinned package under ``prefix``; returns what was installed."""
        spec = f"{cls.package}@{cls.version}"
        argv = ["npm", "install", "--prefix", str(prefix), "--no-audit", "--no-fund", "--loglevel=error", spec]
        _run_install(argv, spec)
        return spec

    @classmethod
    def post_install(cls, prefix: Path) -> None:
        """Fix-ups after npm (e.g. missing +x bits, generated catalogs); none by default."""
        return None

    @classmethod
    def require(cls) -> Path:
        if not cls.installed():
            raise HarnessMissing(
                f"{cls.name} ({cls.package}@{cls.version}) is not installed under {cls.prefix()}; "
                f"run `make setup` or `polar harness install {cls.name}`"
            )
        return cls.prefix()

    def executable(self, root: str) -> str:
        return f"{root}/node_modules/.bin/{self.bin}"

    # -- running ---------------------------------------------------------------------------------------------------
    @abstractmethod
    def launch(self, instruction: str, endpoint: Endpoint, *, root: str, home: str, workspace: str) -> Launch:
        """Config files, environment and command line for one headless run."""

    @staticmethod
    def chained(runs: list[list[str]]) -> list[str]:
        """One command line for several CLI runs, each after the one before it succeeded (a session's follow-ups)."""
        if len(runs) == 1:
            return runs[0]
        return ["/bin/sh", "-c", " && ".join(shlex.join(run) for run in runs)]

    def excludes(self) -> tuple[str, ...]:
        return COMMON_EXCLUDES

    def transcript(self, stdout: str) -> Any:
        """The CLI's own account of the run, parsed from its machine-readable output (None if unreadable)."""
        text = stdout.strip()
        if not text:
            return None
        try:
            if self.transcript_format == "json":
                return self._json_documents(text)
            return [json.loads(line) for line in text.splitlines() if line.startswith("{")]
        except json.JSONDecodeError:
            return None

    @staticmethod
    def _json_documents(text: str) -> Any:
        """One JSON document, or the list of those a session of several runs (follow-ups) printed one after another."""
        decoder, docs, at = json.JSONDecoder(), [], 0
        while at < len(text):
            doc, at = decoder.raw_decode(text, at)
            docs.append(doc)
            while at < len(text) and text[at].isspace():
                at += 1
        return docs[0] if len(docs) == 1 else docs

    # -- scripted policy -------------------------------------------------------------------------------------------
    @abstractmethod
    def shell(self, command: str) -> tuple[str, dict[str, Any]]: ...

    @abstractmethod
    def read_file(self, path: str) -> tuple[str, dict[str, Any]]: ...

    @abstractmethod
    def edit_file(self, path: str, old: str, new: str) -> tuple[str, dict[str, Any]]: ...

    def subagent(self, description: str, prompt: str) -> tuple[str, dict[str, Any]]:
        raise Unsupported(f"{self.name} has no subagent tool")

    def action_turn(self, action: Action, workspace: str) -> ScriptTurn:
        """The assistant turn the engine is held to for this action (the model's template writes it in its format)."""
        if isinstance(action, Final):
            return ScriptTurn(content=action.text)
        if isinstance(action, ToolCalls):
            return ScriptTurn(
                tool_calls=[c for call in action.calls for c in self.action_turn(call, workspace).tool_calls]
            )
        if isinstance(action, Shell):
            name, args = self.shell(action.command)
        elif isinstance(action, ReadFile):
            name, args = self.read_file(f"{workspace}/{action.path}")
        elif isinstance(action, EditFile):
            name, args = self.edit_file(f"{workspace}/{action.path}", action.old, action.new)
        elif isinstance(action, Subagent):
            name, args = self.subagent(action.description, action.prompt)
        else:  # pragma: no cover - the union is closed
            raise TypeError(action)
        return ScriptTurn(tool_calls=[ScriptCall(name=name, arguments=args)])


# The interpreter Python harnesses' venvs are made from: the system's, which every sandbox sees under /usr (a venv
# keeps a link to its base interpreter, so one made from a Python elsewhere on the host would not start inside).
SYSTEM_PYTHON = "/usr/bin/python3"


class PythonHarness(Harness):
    """A harness from PyPI, in a venv of its own (its pins conflict with the project's), started as ``python -m``:
    the venv's entry-point scripts name the host path of its interpreter, which a sandbox does not see."""

    module: ClassVar[str]

    @classmethod
    def install_into(cls, prefix: Path) -> str:
        spec = f"{cls.package}=={cls.version}"
        if not Path(SYSTEM_PYTHON).exists():
            raise RuntimeError(f"{cls.name} needs {SYSTEM_PYTHON} (the system's python3 and python3-venv)")
        _run_install([SYSTEM_PYTHON, "-m", "venv", str(prefix / "venv")], spec)
        python = str(prefix / "venv" / "bin" / "python")
        if uv := uv_binary():  # several times faster than pip at a few hundred pinned packages
            _run_install([uv, "pip", "install", "--quiet", "--python", python, spec], spec)
        else:
            _run_install([python, "-m", "pip", "install", "--quiet", spec], spec)
        return spec

    def executable(self, root: str) -> str:
        return f"{root}/venv/bin/python"

    def command(self, root: str) -> list[str]:
        return [self.executable(root), "-m", self.module]
