"""Cline CLI: one prompt in act mode with its tools auto-approved, its events printed as JSON lines, all its state
in an isolated data directory in its home (``--data-dir``: no background hub) whose provider settings name the
proxy, as ``cline auth`` writes them."""

from __future__ import annotations

import json
from typing import Any, Literal

from nemo_polar.env.harness.base import Endpoint, EnvOption, GymValues, Harness, Launch, one_of

UPDATED_AT = "2026-01-01T00:00:00.000Z"
# api -> (Cline's provider id, the base URL's path)
PROVIDERS = {"chat": ("openai-compatible", "/v1"), "messages": ("anthropic", "/v1")}


class Cline(Harness):
    name = "cline"
    package = "cline"
    version = "3.0.65"
    bin = "cline"
    order = 8
    demo_task = "polar__intervals-1"
    state_dirs = (".cline",)
    env_options = (
        EnvOption("api", "chat", "or messages (Anthropic Messages)"),
        EnvOption("compaction", "agentic", "or basic, off"),
    )
    gym = GymValues(
        title="Cline CLI",
        agent="Cline CLI",
        api="OpenAI Chat Completions API by default; Anthropic Messages with `api`",
    )

    def __init__(self, api: Literal["chat", "messages"] = "chat", compaction: str = "agentic") -> None:
        """``api``: OpenAI Chat Completions (its ``openai-compatible`` provider) or Anthropic Messages (``anthropic``
        with a base URL). ``compaction``: its context compaction mode (``agentic``, ``basic`` or ``off``)."""
        self.api = one_of("cline", "api", api, PROVIDERS)
        self.compaction = compaction

    def launch(self, instruction: str, endpoint: Endpoint, *, root: str, home: str, workspace: str) -> Launch:
        provider, path = PROVIDERS[self.api]
        settings = {"provider": provider, "apiKey": endpoint.api_key, "model": endpoint.model}
        settings["baseUrl"] = f"{endpoint.base_url}{path}"
        providers = {
            "version": 1,
            "lastUsedProvider": provider,
            "modes": {},
            # without updatedAt the entry is dropped and the CLI falls back to Cline's own hosted provider
            "providers": {provider: {"settings": settings, "updatedAt": UPDATED_AT, "tokenSource": "manual"}},
        }
        data = f"{home}/.cline/data"
        argv = [
            self.executable(root),
            "--json",
            "--data-dir",
            data,
            "--config",
            f"{home}/.cline",
            "--compaction",
            self.compaction,
            instruction,  # no -P/-m: given, they rewrite the provider's settings without its key and base URL
        ]
        files = {
            ".cline/data/settings/providers.json": json.dumps(providers, indent=2),
            ".cline/data/settings/global-settings.json": json.dumps(
                {"telemetryOptOut": True, "autoUpdateEnabled": False}
            ),
        }
        # Its feature flags come from a hosted analytics service unless IS_TEST (then every flag keeps its default,
        # as a run with no route out gets them anyway); nothing else reads the variable.
        return Launch(argv=argv, env={"NO_COLOR": "1", "IS_TEST": "true"}, files=files)

    def shell(self, command: str) -> tuple[str, dict[str, Any]]:
        return "run_commands", {"commands": [command]}

    def read_file(self, path: str) -> tuple[str, dict[str, Any]]:
        return "read_files", {"files": [{"path": path}]}

    def edit_file(self, path: str, old: str, new: str) -> tuple[str, dict[str, Any]]:
        return "editor", {"path": path, "old_text": old, "new_text": new}

    def subagent(self, description: str, prompt: str) -> tuple[str, dict[str, Any]]:
        return "spawn_agent", {"systemPrompt": f"You are a helper agent. {description}.", "task": prompt}
