"""opencode: one prompt (``opencode run``) with its tools auto-approved and its events printed as JSON lines; the
proxy is a provider given inline as JSON config through one of the AI SDK packages opencode bundles; title
generation skipped with ``--title`` unless asked for; model catalogue fetches, plugins, language-server downloads,
sharing and auto-update off."""

from __future__ import annotations

import json
from typing import Any, Literal

from nemo_polar.env.harness.base import Endpoint, EnvOption, GymValues, Harness, Launch, one_of

# At start-up opencode npm-installs its plugin package into each config directory (from the registry: an egress
# attempt in a sandbox) unless the directory already has node_modules and a lockfile that names every dependency in
# its package.json; with no plugins configured nothing loads from it, so an empty install is one.
PLUGIN = "@opencode-ai/plugin"
CONFIG_DIR = ".config/opencode"

# api -> the AI SDK provider package (bundled in the binary: nothing is installed at run time); each takes the base
# URL with /v1 and appends its own route.
PROVIDERS = {
    "chat": "@ai-sdk/openai-compatible",
    "responses": "@ai-sdk/openai",
    "messages": "@ai-sdk/anthropic",
}


class OpenCode(Harness):
    name = "opencode"
    package = "opencode-ai"
    version = "1.18.33"
    bin = "opencode"
    order = 9
    demo_task = "polar__confmerge-1"
    state_dirs = (".opencode",)
    env_options = (
        EnvOption("api", "chat", "or responses (OpenAI Responses), messages (Anthropic Messages)"),
        EnvOption("context_window", 32768, "the served model's window, as opencode is told it"),
        EnvOption("max_tokens", 4096, "its output cap; it compacts once a step reaches context_window - max_tokens"),
    )
    gym = GymValues(
        title="opencode",
        agent="opencode",
        api="OpenAI Chat Completions API by default; OpenAI Responses or Anthropic Messages with `api`",
    )

    def __init__(
        self,
        api: Literal["chat", "responses", "messages"] = "chat",
        context_window: int = 32768,
        max_tokens: int = 4096,
        compaction: bool = True,
        title: bool = False,
    ) -> None:
        """``api``: the dialect it speaks to the proxy. ``context_window`` and ``max_tokens``: the model's limits
        as opencode is told them; it compacts the session once a step's tokens reach ``context_window -
        max_tokens``. ``compaction``: its automatic compaction on or off. ``title``: let it ask its small model (the
        served one) for the session's title, a side call; off, ``--title`` names the session."""
        self.api = one_of("opencode", "api", api, PROVIDERS)
        self.context_window = context_window
        self.max_tokens = max_tokens
        self.compaction = compaction
        self.title = title

    def launch(self, instruction: str, endpoint: Endpoint, *, root: str, home: str, workspace: str) -> Launch:
        model = {"tool_call": True, "limit": {"context": self.context_window, "output": self.max_tokens}}
        config = {
            "model": f"polar/{endpoint.model}",
            "small_model": f"polar/{endpoint.model}",
            "autoupdate": False,
            "share": "disabled",
            "compaction": {"auto": self.compaction},
            "provider": {
                "polar": {
                    "npm": PROVIDERS[self.api],
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
        title = [] if self.title else ["--title", "polar"]
        argv = [self.executable(root), "run", "--auto", *title, "--format", "json", *instruction.split()]
        deps = {"dependencies": {PLUGIN: self.version}}
        files = {
            f"{CONFIG_DIR}/package.json": json.dumps(deps),
            f"{CONFIG_DIR}/package-lock.json": json.dumps({"lockfileVersion": 3, "packages": {"": deps}}),
            f"{CONFIG_DIR}/node_modules/.keep": "",
        }
        return Launch(argv=argv, env=env, files=files)

    def shell(self, command: str) -> tuple[str, dict[str, Any]]:
        return "bash", {"command": command}

    def read_file(self, path: str) -> tuple[str, dict[str, Any]]:
        return "read", {"filePath": path}

    def edit_file(self, path: str, old: str, new: str) -> tuple[str, dict[str, Any]]:
        return "edit", {"filePath": path, "oldString": old, "newString": new}

    def subagent(self, description: str, prompt: str) -> tuple[str, dict[str, Any]]:
        return "task", {"description": description, "prompt": prompt, "subagent_type": "general"}
