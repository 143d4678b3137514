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
from typing import Any, ClassVar, NamedTuple

from pydantic import BaseModel, Field

from nemo_polar.env.harness.script import Action, EditFile, Final, ReadFile, Shell, Subagent, ToolCalls
from nemo_polar.paths import cache_dir
from nemo_polar.proxy.store.sessions import ScriptCall, ScriptTurn
from nemo_polar.reconstruct.side_rules import HARNESS_SIDE_RULES, SideRule

HARNESS_MOUNT = "/opt/polar/harness"  # where the pinned install appears inside a sandbox
# Never part of a patch, besides every CLI's state folders (Harness.state_dirs): caches and environments.
GENERIC_EXCLUDES = ("node_modules", "__pycache__", "*.pyc", ".pytest_cache", ".venv", ".mypy_cache", ".ruff_cache")


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


class GymValues(BaseModel, frozen=True):
    """What a harness's NeMo Gym environment (``environments/polar_<name>/``: config.yaml, README.md) says of it
    and sets for its agent and native environment servers."""

    title: str = Field(description="the CLI as config.yaml names it: 'Qwen Code'")
    agent: str = Field(description="the README's subject: 'The Qwen Code CLI'")
    api: str = Field(description="the API it speaks, as the README says: 'OpenAI Chat Completions API'")
    runtime: str = "bwrap"
    timeout: int = 600
    concurrency: int = 8
    max_concurrent_episodes: int = 8
    queue_timeout_seconds: int = 86400
    default_episode_timeout_seconds: int = 3600
    cleanup_timeout_seconds: int = 180


class EnvOption(NamedTuple):
    """An adapter option its Polar env (``conf/env/polar_<name>.yaml``) sets, with the note written beside it."""

    key: str
    value: str | int | bool
    note: str


class Harness(ABC):
    name: ClassVar[str]
    package: ClassVar[str]
    version: ClassVar[str]
    bin: ClassVar[str]
    transcript_format: ClassVar[str] = "jsonl"  # what the CLI prints on stdout in the chosen output mode

    # -- what the project's lists say of a CLI, derived from the registry (HARNESSES) -----------------------------
    order: ClassVar[int]  # its place in every listing: the patterns table, the demo, `polar harness install`
    demo_task: ClassVar[str]  # the bundled task `make demo` gives it (a different bug for each CLI)
    state_dirs: ClassVar[tuple[str, ...]] = ()  # where it keeps state in a workspace: never part of a patch
    env_options: ClassVar[tuple[EnvOption, ...]] = ()  # the adapter options its Polar env sets
    env_note: ClassVar[str] = ""  # what its Polar env's comment says it is, where its name does not
    gym: ClassVar[GymValues]

    @classmethod
    def env_name(cls) -> str:
        """Its Polar env and Gym environment."""
        return f"polar_{cls.name}"

    @classmethod
    def side_rules(cls) -> tuple[SideRule, ...]:
        """The rules that tell its side calls from its agent's (reconstruct's defaults, keyed by its name)."""
        return HARNESS_SIDE_RULES.get(cls.name, ())

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
        """Never part of a patch: every CLI's state, wherever a CLI put it (a task repo may carry another's), caches
        and environments."""
        return (*(d for h in HARNESSES.values() for d in h.state_dirs), *GENERIC_EXCLUDES)

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


HARNESSES: dict[str, type[Harness]] = {}  # by name, in `order`; nemo_polar.env.harness registers its modules' adapters
DECLARED = ("name", "package", "version", "bin", "order", "demo_task", "gym")


def register(cls: type[Harness]) -> type[Harness]:
    """Add an adapter to ``HARNESSES``, kept in ``order``. An undeclared value, or a name or place another adapter
    holds, raises ``TypeError``."""
    missing = [attr for attr in DECLARED if not hasattr(cls, attr)]
    if missing:
        raise TypeError(f"{cls.__name__} does not declare {', '.join(missing)}")
    others = [h for h in HARNESSES.values() if h is not cls]
    if clash := [h.__name__ for h in others if h.name == cls.name or h.order == cls.order]:
        raise TypeError(f"{cls.__name__} takes the name or order of {', '.join(clash)}")
    ordered = sorted([*others, cls], key=lambda h: h.order)
    HARNESSES.clear()
    HARNESSES.update((h.name, h) for h in ordered)
    return cls


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
