"""Codex CLI: Responses API through a custom model provider, with a model catalog so ``apply_patch`` is offered."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nemo_polar.env.harness.base import Endpoint, GymValues, Harness, Launch
from nemo_polar.env.harness.script import Action, Subagent
from nemo_polar.proxy.store.sessions import ScriptCall, ScriptTurn

BINARY = "node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex"
TEMPLATE_SLUG = "gpt-5.5"  # a built-in entry whose tools (freeform apply_patch, shell) suit a coding policy
TEMPLATE = "polar/model_template.json"


def builtin_model(binary: bytes, slug: str) -> dict[str, Any]:
    """One entry of the model catalog compiled into the binary (a JSON document ``{"models": [...]}``)."""
    at = binary.find(f'"slug": "{slug}"'.encode())
    start = binary.rfind(b'{\n  "models"', 0, at)
    if at < 0 or start < 0:
        raise RuntimeError(f"no built-in model catalog entry {slug!r} in the codex binary")
    catalog, _ = json.JSONDecoder().raw_decode(binary[start : start + 4_000_000].decode("utf-8", "replace"))
    return next(m for m in catalog["models"] if m["slug"] == slug)


class Codex(Harness):
    name = "codex"
    package = "@openai/codex"
    version = "0.169.0"
    bin = "codex"
    order = 0
    demo_task = "polar__csvlite-1"
    state_dirs = (".codex",)
    gym = GymValues(title="Codex CLI", agent="Codex CLI", api="OpenAI Responses API")

    def __init__(
        self,
        context_window: int = 32768,
        enable: tuple[str, ...] = (),
        auto_compact_token_limit: int | None = None,
        auto_review: bool = False,
    ) -> None:
        self.context_window = context_window
        self.enable = tuple(enable)  # extra `--enable FEATURE` flags (e.g. multi_agent_v2)
        # Codex compacts the history once a call's total tokens reach this (`model_auto_compact_token_limit`).
        self.auto_compact_token_limit = auto_compact_token_limit
        # Codex's auto-reviewer judges every sandbox escalation in a call of its own (approvals_reviewer auto_review);
        # scripted commands then ask for escalation, so they run after review outside Codex's sandbox (which cannot
        # nest in the runtime's).
        self.auto_review = auto_review

    @classmethod
    def post_install(cls, prefix: Path) -> None:
        entry = builtin_model((prefix / BINARY).read_bytes(), TEMPLATE_SLUG)
        (prefix / TEMPLATE).parent.mkdir(exist_ok=True)
        (prefix / TEMPLATE).write_text(json.dumps(entry))

    def catalog(self, model: str) -> str:
        entry = json.loads((self.require() / TEMPLATE).read_text())
        entry.update(
            slug=model,
            display_name=model,
            prefer_websockets=False,
            context_window=self.context_window,
            max_context_window=self.context_window,
            upgrade=None,
        )
        return json.dumps({"models": [entry]})

    def launch(self, instruction: str, endpoint: Endpoint, *, root: str, home: str, workspace: str) -> Launch:
        provider = f'{{name="polar",base_url="{endpoint.base_url}/v1",env_key="POLAR_API_KEY",wire_api="responses"}}'
        argv = [
            self.executable(root),
            "exec",
            "--json",
            "--skip-git-repo-check",
            "--ephemeral",
            # Already inside the runtime's sandbox; Codex's own bwrap sandbox cannot nest in it.
            "-s",
            "workspace-write" if self.auto_review else "danger-full-access",
            "-C",
            workspace,
            "-c",
            "model_provider=polar",
            "-c",
            f"model={json.dumps(endpoint.model)}",
            "-c",
            f"model_providers.polar={provider}",
            "-c",
            f'model_catalog_json="{home}/.codex/catalog.json"',
            "-c",
            "analytics.enabled=false",
            "-c",
            "check_for_update_on_startup=false",
            "--disable",
            "plugins",
            "--disable",
            "apps",
            "--disable",
            "remote_plugin",
            *self.options(),
            instruction,
        ]
        env = {"CODEX_HOME": f"{home}/.codex", "POLAR_API_KEY": endpoint.api_key}
        return Launch(argv=argv, env=env, files={".codex/catalog.json": self.catalog(endpoint.model)})

    def options(self) -> list[str]:
        """The scenario settings as command-line flags (none by default)."""
        argv = [arg for feature in self.enable for arg in ("--enable", feature)]
        if self.auto_compact_token_limit is not None:
            argv += ["-c", f"model_auto_compact_token_limit={self.auto_compact_token_limit}"]
        if self.auto_review:
            argv += ["-c", 'approval_policy="on-request"', "-c", 'approvals_reviewer="auto_review"']
        return argv

    def shell(self, command: str) -> tuple[str, dict[str, Any]]:
        if self.auto_review:
            escalate = {"sandbox_permissions": "require_escalated", "justification": "Run the requested command."}
            return "exec_command", {"cmd": command, **escalate}
        return "exec_command", {"cmd": command}

    def read_file(self, path: str) -> tuple[str, dict[str, Any]]:
        return self.shell(f"cat {path}")

    def edit_file(self, path: str, old: str, new: str) -> tuple[str, dict[str, Any]]:
        minus = "".join(f"-{line}\n" for line in old.splitlines())
        plus = "".join(f"+{line}\n" for line in new.splitlines())
        patch = f"*** Begin Patch\n*** Update File: {path}\n@@\n{minus}{plus}*** End Patch\n"
        return "apply_patch", {"input": patch}

    def subagent(self, description: str, prompt: str) -> tuple[str, dict[str, Any]]:
        # multi_agent_v2's spawn_agent; fork_turns "none": the subagent starts a conversation of its own.
        task = "".join(c if c.isalnum() else "_" for c in description.lower()).strip("_") or "task"
        return "spawn_agent", {"task_name": task, "message": prompt, "fork_turns": "none"}

    def action_turn(self, action: Action, workspace: str) -> ScriptTurn:
        # A spawned agent runs in the background while the main thread samples on. wait_agent in the same turn
        # blocks the main thread until the subagent finishes, so the scripted calls come in a fixed order.
        turn = super().action_turn(action, workspace)
        if isinstance(action, Subagent):
            turn.tool_calls.append(ScriptCall(name="wait_agent", arguments={"timeout_ms": 600000}))
        return turn
