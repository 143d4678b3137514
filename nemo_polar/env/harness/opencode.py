"""opencode (a fifth harness, not in the paper's set): an OpenAI-compatible provider given inline as JSON config,
title generation skipped with ``--title``, model fetches and auto-update off."""

from __future__ import annotations

import json
from typing import Any

from nemo_polar.env.harness.base import Endpoint, Harness, Launch


class OpenCode(Harness):
    name = "opencode"
    package = "opencode-ai"
    version = "1.18.33"
    bin = "opencode"

    def __init__(self, context_window: int = 32768, max_tokens: int = 4096) -> None:
        self.context_window = context_window
        self.max_tokens = max_tokens

    def launch(self, instruction: str, endpoint: Endpoint, *, root: str, home: str, workspace: str) -> Launch:
        model = {"tool_call": True, "limit": {"context": self.context_window, "output": self.max_tokens}}
        config = {
            "model": f"polar/{endpoint.model}",
            "small_model": f"polar/{endpoint.model}",
            "autoupdate": False,
            "share": "disabled",
            "provider": {
                "polar": {
                    "npm": "@ai-sdk/openai-compatible",
                    "options": {"baseURL": f"{endpoint.base_url}/v1", "apiKey": endpoint.api_key},
                    "models": {endpoint.model: model},
                }
            },
        }
        env = {
            "OPENCODE_CONFIG_CONTENT": json.dumps(config),
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",  # else it asks the npm registry for plugin packages
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
            "OPENCODE_DISABLE_SHARE": "1",
        }
        # A prompt given as one argument with spaces reaches the model in literal quotes: pass it as words.
        argv = [self.executable(root), "run", "--auto", "--title", "polar", "--format", "json", *instruction.split()]
        return Launch(argv=argv, env=env)

    def shell(self, command: str) -> tuple[str, dict[str, Any]]:
        return "bash", {"command": command, "description": "run a command"}

    def read_file(self, path: str) -> tuple[str, dict[str, Any]]:
        return "read", {"filePath": path}

    def edit_file(self, path: str, old: str, new: str) -> tuple[str, dict[str, Any]]:
        return "edit", {"filePath": path, "oldString": old, "newString": new}
