"""Qwen Code: Chat Completions, ``--yolo`` (else headless runs drop the shell and edit tools), memory extraction
and usage statistics off."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

from nemo_polar.env.harness.base import Endpoint, Harness, Launch

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

    @classmethod
    def post_install(cls, prefix: Path) -> None:
        rg = prefix / RIPGREP
        if rg.exists():  # npm leaves the vendored ripgrep without its +x bit
            rg.chmod(rg.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)

    def launch(self, instruction: str, endpoint: Endpoint, *, root: str, home: str, workspace: str) -> Launch:
        argv = [self.executable(root), "--yolo", "-o", "json", instruction]
        env = {
            "OPENAI_BASE_URL": f"{endpoint.base_url}/v1",
            "OPENAI_API_KEY": endpoint.api_key,
            "OPENAI_MODEL": endpoint.model,
            "QWEN_CODE_SUPPRESS_YOLO_WARNING": "1",
        }
        return Launch(argv=argv, env=env, files={".qwen/settings.json": json.dumps(SETTINGS, indent=2)})

    def shell(self, command: str) -> tuple[str, dict[str, Any]]:
        return "run_shell_command", {"command": command}

    def read_file(self, path: str) -> tuple[str, dict[str, Any]]:
        return "read_file", {"file_path": path}

    def edit_file(self, path: str, old: str, new: str) -> tuple[str, dict[str, Any]]:
        return "edit", {"file_path": path, "old_string": old, "new_string": new}
