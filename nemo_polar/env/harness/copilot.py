"""GitHub Copilot CLI in its offline bring-your-own-provider mode: ``COPILOT_OFFLINE`` (no GitHub login, telemetry,
web tools or auto-update) with ``COPILOT_PROVIDER_*`` naming the proxy, one prompt (``-p``) with every tool allowed
and no questions to a user, its events printed as JSON lines."""

from __future__ import annotations

from typing import Any, Literal

from nemo_polar.env.harness.base import Endpoint, EnvOption, GymValues, Harness, Launch, one_of

# api -> (COPILOT_PROVIDER_TYPE, COPILOT_PROVIDER_WIRE_API, the base URL's path)
PROVIDERS = {
    "chat": ("openai", "completions", "/v1"),
    "responses": ("openai", "responses", "/v1"),
    "messages": ("anthropic", None, ""),  # the Anthropic SDK appends /v1/messages
}


class Copilot(Harness):
    name = "copilot"
    package = "@github/copilot"
    version = "1.0.102"
    bin = "copilot"
    order = 7
    demo_task = "polar__money-1"
    state_dirs = (".copilot",)
    env_options = (EnvOption("api", "chat", "or responses (OpenAI Responses), messages (Anthropic Messages)"),)
    gym = GymValues(
        title="GitHub Copilot CLI",
        agent="GitHub Copilot CLI",
        api="OpenAI Chat Completions API by default; Responses or Anthropic Messages with `api`",
    )

    def __init__(self, api: Literal["chat", "responses", "messages"] = "chat", max_prompt_tokens: int = 0) -> None:
        """``api``: the dialect it speaks to the proxy (OpenAI Chat Completions, OpenAI Responses or Anthropic
        Messages). ``max_prompt_tokens`` (``COPILOT_PROVIDER_MAX_PROMPT_TOKENS``; 0: its own default): the prompt
        budget it compacts against, for a model whose window it does not know."""
        self.api = one_of("copilot", "api", api, PROVIDERS)
        self.max_prompt_tokens = max_prompt_tokens

    def launch(self, instruction: str, endpoint: Endpoint, *, root: str, home: str, workspace: str) -> Launch:
        provider, wire_api, path = PROVIDERS[self.api]
        env = {
            "COPILOT_OFFLINE": "true",
            "COPILOT_PROVIDER_BASE_URL": f"{endpoint.base_url}{path}",
            "COPILOT_PROVIDER_TYPE": provider,
            "COPILOT_PROVIDER_API_KEY": endpoint.api_key,
            "COPILOT_MODEL": endpoint.model,
            "COPILOT_HOME": f"{home}/.copilot",
            "COPILOT_AUTO_UPDATE": "false",
            "NO_COLOR": "1",
        }
        if wire_api:
            env["COPILOT_PROVIDER_WIRE_API"] = wire_api
        if self.max_prompt_tokens:
            env["COPILOT_PROVIDER_MAX_PROMPT_TOKENS"] = str(self.max_prompt_tokens)
        argv = [
            self.executable(root),
            "-p",
            instruction,
            "--allow-all",  # tools, paths and URLs without asking (a sandbox is the boundary)
            "--no-ask-user",
            "--disable-client-telemetry",
            "--output-format",
            "json",
        ]
        return Launch(argv=argv, env=env)

    def shell(self, command: str) -> tuple[str, dict[str, Any]]:
        return "bash", {"command": command, "description": "Run the command."}

    def read_file(self, path: str) -> tuple[str, dict[str, Any]]:
        return "view", {"path": path}

    def edit_file(self, path: str, old: str, new: str) -> tuple[str, dict[str, Any]]:
        return "edit", {"path": path, "old_str": old, "new_str": new}

    def subagent(self, description: str, prompt: str) -> tuple[str, dict[str, Any]]:
        args = {"name": "helper", "description": description, "prompt": prompt, "agent_type": "general-purpose"}
        return "task", args
