"""Gemini CLI: Google's Gemini API (``streamGenerateContent``), API-key auth pointed at the proxy, the model pinned
(unpinned, every turn starts with a router call on a built-in model name), usage statistics, telemetry and update
checks off, the workspace trusted (else headless runs exit 55) and ``--yolo`` (else they drop the shell and edit
tools)."""

from __future__ import annotations

import copy
import json
from typing import Any

from nemo_polar.env.harness.base import Endpoint, GymValues, Harness, Launch

SETTINGS: dict[str, Any] = {
    # With a base URL but no selected auth type the CLI picks "gateway" and rejects it (exit 41, no request).
    "security": {"auth": {"selectedType": "gemini-api-key"}},
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
    "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
}


class GeminiCli(Harness):
    name = "gemini_cli"
    package = "@google/gemini-cli"
    version = "0.61.0"
    bin = "gemini"
    transcript_format = "json"
    order = 4
    demo_task = "polar__globmatch-1"
    state_dirs = (".gemini",)
    gym = GymValues(title="Gemini CLI", agent="Gemini CLI", api="Google Gemini API")

    def __init__(
        self,
        compression_threshold: float | None = None,
        settings: dict[str, Any] | None = None,
        follow_ups: list[str] | None = None,
    ) -> None:
        """``compression_threshold`` (``model.compressionThreshold``): the fraction of the model's context window
        (1,048,576 tokens for a model name the CLI does not know) at which chat compression fires; it cuts only at
        a user text message, so from a session's second prompt on. ``settings``: more of Gemini CLI's own
        ``settings.json``, merged over the defaults. ``follow_ups``: user messages for the same session, each a later
        ``gemini -p ... -r latest`` run (a resumed session: its history is restored from the CLI's session file)."""
        self.compression_threshold = compression_threshold
        self.extra_settings = settings or {}
        self.follow_ups = list(follow_ups or [])

    def settings(self) -> dict[str, Any]:
        settings = copy.deepcopy(SETTINGS)
        if self.compression_threshold is not None:
            settings["model"] = {"compressionThreshold": self.compression_threshold}
        for key, value in self.extra_settings.items():
            if isinstance(value, dict) and isinstance(settings.get(key), dict):
                settings[key] = {**settings[key], **value}
            else:
                settings[key] = value
        return settings

    def launch(self, instruction: str, endpoint: Endpoint, *, root: str, home: str, workspace: str) -> Launch:
        argv = [self.executable(root), "-m", endpoint.model, "--skip-trust", "--yolo", "-o", "json"]
        runs = [[*argv, "-p", instruction], *([*argv, "-r", "latest", "-p", text] for text in self.follow_ups)]
        env = {
            "GOOGLE_GEMINI_BASE_URL": endpoint.base_url,  # the SDK appends /v1beta/models/{model}:{method}
            "GEMINI_API_KEY": endpoint.api_key,  # sent as x-goog-api-key
            "GEMINI_CLI_HOME": home,
            "GEMINI_CLI_NO_RELAUNCH": "true",  # one Node process, not a re-spawned child with other memory flags
            # The CLI makes any *_PROXY variable its global fetch dispatcher, the local base URL included.
            "NO_PROXY": "127.0.0.1,localhost",
        }
        files = {".gemini/settings.json": json.dumps(self.settings(), indent=2)}
        return Launch(argv=self.chained(runs), env=env, files=files)

    def shell(self, command: str) -> tuple[str, dict[str, Any]]:
        return "run_shell_command", {"command": command}

    def read_file(self, path: str) -> tuple[str, dict[str, Any]]:
        return "read_file", {"file_path": path}

    def edit_file(self, path: str, old: str, new: str) -> tuple[str, dict[str, Any]]:
        instruction = "Apply the scripted edit."
        return "replace", {"file_path": path, "instruction": instruction, "old_string": old, "new_string": new}

    def subagent(self, description: str, prompt: str) -> tuple[str, dict[str, Any]]:
        return "invoke_agent", {"agent_name": "generalist", "prompt": f"{description}: {prompt}"}
