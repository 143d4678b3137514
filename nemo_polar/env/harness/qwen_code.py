"""Qwen Code: Chat Completions, ``--yolo`` (else headless runs drop the shell and edit tools), memory extraction
and usage statistics off by default."""

from __future__ import annotations

import copy
import json
import stat
from pathlib import Path
from typing import Any

from nemo_polar.env.harness.base import Endpoint, GymValues, Harness, Launch

RIPGREP = "node_modules/@qwen-code/qwen-code/vendor/ripgrep/x64-linux/rg"
SETTINGS = {
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
    "general": {"disableAutoUpdate": True, "disableUpdateNag": True, "enableAutoUpdate": False},
    "memory": {"enableManagedAutoMemory": False, "enableManagedAutoDream": False},
    "security": {"auth": {"selectedType": "openai"}},
    "$version": 4,
}


class QwenCode(Harness):
    name = "qwen_code"
    package = "@qwen-code/qwen-code"
    version = "0.24.4"
    bin = "qwen"
    transcript_format = "json"
    order = 2
    demo_task = "polar__lrucache-1"
    state_dirs = (".qwen",)
    gym = GymValues(title="Qwen Code", agent="The Qwen Code CLI", api="OpenAI Chat Completions API")

    def __init__(
        self,
        context_window: int | None = None,
        auto_compact_threshold: float | None = None,
        auto_memory: bool = False,
    ) -> None:
        """``context_window`` (``model.generationConfig.contextWindowSize``) and ``auto_compact_threshold``
        (``context.autoCompactThreshold``, a fraction of the window) set when chat compression fires; unset, Qwen
        Code assumes a 200k window and compacts at 85%. ``auto_memory`` turns on the managed memory extraction
        call that runs after the turn."""
        self.context_window = context_window
        self.auto_compact_threshold = auto_compact_threshold
        self.auto_memory = auto_memory

    @classmethod
    def post_install(cls, prefix: Path) -> None:
        rg = prefix / RIPGREP
        if rg.exists():  # npm leaves the vendored ripgrep without its +x bit
            rg.chmod(rg.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)

    def settings(self) -> dict[str, Any]:
        settings = copy.deepcopy(SETTINGS)
        if self.context_window is not None:
            settings["model"] = {"generationConfig": {"contextWindowSize": self.context_window}}
        if self.auto_compact_threshold is not None:
            settings["context"] = {"autoCompactThreshold": self.auto_compact_threshold}
        if self.auto_memory:
            settings["memory"]["enableManagedAutoMemory"] = True
        return settings

    def launch(self, instruction: str, endpoint: Endpoint, *, root: str, home: str, workspace: str) -> Launch:
        argv = [self.executable(root), "--yolo", "-o", "json", instruction]
        env = {
            "OPENAI_BASE_URL": f"{endpoint.base_url}/v1",
            "OPENAI_API_KEY": endpoint.api_key,
            "OPENAI_MODEL": endpoint.model,
            "QWEN_CODE_SUPPRESS_YOLO_WARNING": "1",
        }
        return Launch(argv=argv, env=env, files={".qwen/settings.json": json.dumps(self.settings(), indent=2)})

    def shell(self, command: str) -> tuple[str, dict[str, Any]]:
        return "run_shell_command", {"command": command}

    def read_file(self, path: str) -> tuple[str, dict[str, Any]]:
        return "read_file", {"file_path": path}

    def edit_file(self, path: str, old: str, new: str) -> tuple[str, dict[str, Any]]:
        return "edit", {"file_path": path, "old_string": old, "new_string": new}

    def subagent(self, description: str, prompt: str) -> tuple[str, dict[str, Any]]:
        # Foreground: top-level agents default to the background, whose result would come back as a later
        # notification rather than as this call's tool result.
        args = {"description": description, "prompt": prompt, "subagent_type": "general-purpose"}
        return "agent", {**args, "run_in_background": False}
