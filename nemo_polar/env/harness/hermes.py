"""Hermes Agent: a Python harness (its own venv) pointed at the proxy as a ``custom`` OpenAI-compatible provider in
``$HERMES_HOME/config.yaml``, run one-shot (``-z``: approvals bypassed, only the final text printed). It streams Chat
Completions with its full tool catalogue.
"""

from __future__ import annotations

from typing import Any

import yaml

from nemo_polar.env.harness.base import Endpoint, EnvOption, GymValues, Launch, PythonHarness


class Hermes(PythonHarness):
    name = "hermes"
    package = "hermes-agent"
    version = "0.19.0"
    bin = "hermes"
    module = "hermes_cli.main"
    order = 6
    demo_task = "polar__textstats-1"
    state_dirs = (".hermes",)
    env_options = (
        EnvOption("max_tokens", 4096, "unset, it asks a custom provider for 65,536 output tokens"),
        EnvOption("context_length", 65536, "the served model's window (Hermes refuses under 64K)"),
        EnvOption("verify_on_stop", False, "true: its nudge to verify before a final answer, each one more user turn"),
    )
    gym = GymValues(title="Hermes Agent", agent="Hermes Agent", api="OpenAI Chat Completions API, streamed")

    def __init__(self, max_tokens: int = 4096, context_length: int = 65536, verify_on_stop: bool = False) -> None:
        """``max_tokens``: the output cap of every call (``model.max_tokens``; unset, a custom provider asks for
        65,536, more than a small model's whole context). ``context_length`` (``model.context_length``): the window
        its compression plans against; set the served model's. Hermes refuses a window under 64K, and unset it looks
        the model up in an online catalogue (a sandbox has no route there). ``verify_on_stop``
        (``agent.verify_on_stop``): its own default (on) answers a final reply after an unverified edit with a nudge
        to verify first, up to twice, each one more user turn of the same chain."""
        self.max_tokens = max_tokens
        self.context_length = context_length
        self.verify_on_stop = verify_on_stop

    def launch(self, instruction: str, endpoint: Endpoint, *, root: str, home: str, workspace: str) -> Launch:
        model: dict[str, Any] = {
            "provider": "custom",
            "base_url": f"{endpoint.base_url}/v1",
            "default": endpoint.model,
            "api_key": "${OPENAI_API_KEY}",  # expanded by Hermes when it loads the file
            "max_tokens": self.max_tokens,
            "context_length": self.context_length,
        }
        env = {
            "HERMES_HOME": f"{home}/.hermes",
            "OPENAI_API_KEY": endpoint.api_key,
            # Its venv is mounted read-only, as its own container image seals it: no pip installs of optional features.
            "HERMES_DISABLE_LAZY_INSTALLS": "1",
        }
        config = {
            "model": model,
            "agent": {"verify_on_stop": self.verify_on_stop},
            # Language servers it would install from npm/PyPI on the first edit: a sandbox has no route there.
            "lsp": {"install_strategy": "manual"},
        }
        files = {".hermes/config.yaml": yaml.safe_dump(config, sort_keys=False)}
        return Launch(argv=[*self.command(root), "-z", instruction], env=env, files=files)

    def transcript(self, stdout: str) -> Any:
        return None  # -z prints only the final answer; its account of the session is the database in its home

    def shell(self, command: str) -> tuple[str, dict[str, Any]]:
        return "terminal", {"command": command}

    def read_file(self, path: str) -> tuple[str, dict[str, Any]]:
        return "read_file", {"path": path}

    def edit_file(self, path: str, old: str, new: str) -> tuple[str, dict[str, Any]]:
        return "patch", {"mode": "replace", "path": path, "old_string": old, "new_string": new}

    def subagent(self, description: str, prompt: str) -> tuple[str, dict[str, Any]]:
        return "delegate_task", {"goal": description, "context": prompt}
