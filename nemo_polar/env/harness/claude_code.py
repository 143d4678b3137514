"""Claude Code: Anthropic Messages, every model alias pinned to the policy model, non-essential traffic off."""

from __future__ import annotations

from typing import Any

from nemo_polar.env.harness.base import Endpoint, GymValues, Harness, Launch

ALIASES = (
    "ANTHROPIC_MODEL",
    "ANTHROPIC_DEFAULT_OPUS_MODEL",
    "ANTHROPIC_DEFAULT_SONNET_MODEL",
    "ANTHROPIC_DEFAULT_HAIKU_MODEL",
    "ANTHROPIC_SMALL_FAST_MODEL",
    "CLAUDE_CODE_SUBAGENT_MODEL",
)


class ClaudeCode(Harness):
    name = "claude_code"
    package = "@anthropic-ai/claude-code"
    version = "2.1.330"
    bin = "claude"
    transcript_format = "json"
    order = 1
    demo_task = "polar__semverlite-1"
    state_dirs = (".claude",)
    gym = GymValues(title="Claude Code", agent="The Claude Code CLI", api="Anthropic Messages API")

    def __init__(self, env: dict[str, str] | None = None) -> None:
        """``env``: more of Claude Code's own environment settings (e.g. ``CLAUDE_CODE_AUTO_COMPACT_WINDOW`` and
        ``CLAUDE_AUTOCOMPACT_PCT_OVERRIDE`` for when auto-compact fires); they win over the defaults below."""
        self.env = {k: str(v) for k, v in (env or {}).items()}

    def launch(self, instruction: str, endpoint: Endpoint, *, root: str, home: str, workspace: str) -> Launch:
        argv = [
            self.executable(root),
            "-p",
            instruction,
            "--model",
            endpoint.model,
            "--output-format",
            "json",
            "--dangerously-skip-permissions",
            "--no-session-persistence",
        ]
        env = {
            "ANTHROPIC_BASE_URL": endpoint.base_url,  # the client appends /v1/messages
            "ANTHROPIC_API_KEY": endpoint.api_key,
            **dict.fromkeys(ALIASES, endpoint.model),
            "CLAUDE_CONFIG_DIR": f"{home}/.claude",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "IS_SANDBOX": "1",  # root inside the sandbox: allows --dangerously-skip-permissions
            **self.env,
        }
        return Launch(argv=argv, env=env)

    def shell(self, command: str) -> tuple[str, dict[str, Any]]:
        return "Bash", {"command": command}

    def read_file(self, path: str) -> tuple[str, dict[str, Any]]:
        return "Read", {"file_path": path}

    def edit_file(self, path: str, old: str, new: str) -> tuple[str, dict[str, Any]]:
        # Claude Code refuses an Edit of a file it has not Read in the session; scripts read first.
        return "Edit", {"file_path": path, "old_string": old, "new_string": new}

    def subagent(self, description: str, prompt: str) -> tuple[str, dict[str, Any]]:
        # In the foreground: main waits for the subagent's report (background agents only notify later).
        return "Agent", {
            "description": description,
            "prompt": prompt,
            "subagent_type": "general-purpose",
            "run_in_background": False,
        }
