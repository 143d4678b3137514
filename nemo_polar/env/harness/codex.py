"""Codex CLI: Responses API through a custom model provider, with a model catalog so ``apply_patch`` is offered."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nemo_polar.env.harness.base import Endpoint, Harness, Launch

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

    def __init__(self, context_window: int = 32768) -> None:
        self.context_window = context_window

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
            "danger-full-access",
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
            instruction,
        ]
        env = {"CODEX_HOME": f"{home}/.codex", "POLAR_API_KEY": endpoint.api_key}
        return Launch(argv=argv, env=env, files={".codex/catalog.json": self.catalog(endpoint.model)})

    def shell(self, command: str) -> tuple[str, dict[str, Any]]:
        return "exec_command", {"cmd": command}

    def read_file(self, path: str) -> tuple[str, dict[str, Any]]:
        return self.shell(f"cat {path}")

    def edit_file(self, path: str, old: str, new: str) -> tuple[str, dict[str, Any]]:
        minus = "".join(f"-{line}\n" for line in old.splitlines())
        plus = "".join(f"+{line}\n" for line in new.splitlines())
        patch = f"*** Begin Patch\n*** Update File: {path}\n@@\n{minus}{plus}*** End Patch\n"
        return "apply_patch", {"input": patch}
