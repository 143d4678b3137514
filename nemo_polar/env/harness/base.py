"""The harness interface: one small adapter per coding CLI.

An adapter knows the CLI's pinned npm package, how to point it at a proxy session (config files, environment,
command line), how to read the transcript it prints, which paths it leaves in a workspace, and how the scripted
policy's actions map onto its own tools.
"""

from __future__ import annotations

import json
import subprocess
from abc import ABC, abstractmethod
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
    "node_modules",
    "__pycache__",
    "*.pyc",
    ".pytest_cache",
    ".venv",
    ".mypy_cache",
    ".ruff_cache",
)


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
        spec = f"{cls.package}@{cls.version}"
        done = subprocess.run(
            ["npm", "install", "--prefix", str(prefix), "--no-audit", "--no-fund", "--loglevel=error", spec],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise RuntimeError(f"npm install {spec} failed:\n{done.stderr[-2000:]}")
        cls.post_install(prefix)
        (prefix / ".polar-installed").write_text(spec + "\n")
        return prefix

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

    def excludes(self) -> tuple[str, ...]:
        return COMMON_EXCLUDES

    def transcript(self, stdout: str) -> Any:
        """The CLI's own account of the run, parsed from its machine-readable output (None if unreadable)."""
        text = stdout.strip()
        if not text:
            return None
        try:
            if self.transcript_format == "json":
                return json.loads(text)
            return [json.loads(line) for line in text.splitlines() if line.startswith("{")]
        except json.JSONDecodeError:
            return None

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
