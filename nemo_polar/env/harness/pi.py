"""Pi: a ``models.json`` provider (Pi has no base-URL variable), offline mode on."""

from __future__ import annotations

import json
from typing import Any

from nemo_polar.env.harness.base import Endpoint, GymValues, Harness, Launch


class Pi(Harness):
    name = "pi"
    package = "@mariozechner/pi-coding-agent"
    version = "0.73.1"
    bin = "pi"
    order = 3
    demo_task = "polar__ratelimit-1"
    state_dirs = (".pi",)
    gym = GymValues(title="pi", agent="The pi CLI", api="OpenAI Chat Completions API")

    def __init__(
        self,
        context_window: int = 32768,
        max_tokens: int = 4096,
        settings: dict[str, Any] | None = None,
        follow_ups: list[str] | None = None,
    ) -> None:
        """``settings``: Pi's own ``settings.json`` (e.g. ``compaction`` thresholds, ``retry``). ``follow_ups``: user
        messages for the same session, each a later ``pi -p --continue`` run, the way a user continues a session.
        (Several messages in one ``pi -p`` race: the next prompt does not wait for the auto-compaction Pi starts when
        a prompt's run ends, and its own pre-prompt check starts a second one on the same history.)"""
        self.context_window = context_window
        self.max_tokens = max_tokens
        self.settings = settings or {}
        self.follow_ups = list(follow_ups or [])

    def launch(self, instruction: str, endpoint: Endpoint, *, root: str, home: str, workspace: str) -> Launch:
        provider = {
            "baseUrl": f"{endpoint.base_url}/v1",
            "api": "openai-completions",
            "apiKey": "POLAR_API_KEY",  # the name of an environment variable
            "models": [{"id": endpoint.model, "contextWindow": self.context_window, "maxTokens": self.max_tokens}],
        }
        argv = [self.executable(root), "-p", "--mode", "json", "--provider", "polar", "--model", endpoint.model]
        env = {
            "PI_CODING_AGENT_DIR": f"{home}/.pi/agent",
            "POLAR_API_KEY": endpoint.api_key,
            "PI_OFFLINE": "1",
            "PI_SKIP_VERSION_CHECK": "1",
            "PI_TELEMETRY": "0",
        }
        files = {".pi/agent/models.json": json.dumps({"providers": {"polar": provider}}, indent=2)}
        if self.settings:
            files[".pi/agent/settings.json"] = json.dumps(self.settings, indent=2)
        runs = [[*argv, instruction], *([*argv, "--continue", text] for text in self.follow_ups)]
        return Launch(argv=self.chained(runs), env=env, files=files)

    def shell(self, command: str) -> tuple[str, dict[str, Any]]:
        return "bash", {"command": command}

    def read_file(self, path: str) -> tuple[str, dict[str, Any]]:
        return "read", {"path": path}

    def edit_file(self, path: str, old: str, new: str) -> tuple[str, dict[str, Any]]:
        return "edit", {"path": path, "edits": [{"oldText": old, "newText": new}]}
