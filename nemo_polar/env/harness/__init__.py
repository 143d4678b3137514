"""Harness adapters for the coding CLIs, found by name."""

from __future__ import annotations

from nemo_polar.env.harness.base import Endpoint, Harness, HarnessMissing, Launch, Unsupported
from nemo_polar.env.harness.claude_code import ClaudeCode
from nemo_polar.env.harness.cline import Cline
from nemo_polar.env.harness.codex import Codex
from nemo_polar.env.harness.copilot import Copilot
from nemo_polar.env.harness.gemini_cli import GeminiCli
from nemo_polar.env.harness.hermes import Hermes
from nemo_polar.env.harness.mini_swe_agent import MiniSweAgent
from nemo_polar.env.harness.opencode import OpenCode
from nemo_polar.env.harness.openhands_sdk import OpenHandsSdk
from nemo_polar.env.harness.pi import Pi
from nemo_polar.env.harness.qwen_code import QwenCode

HARNESSES: dict[str, type[Harness]] = {
    h.name: h
    for h in (Codex, ClaudeCode, QwenCode, Pi, OpenCode, GeminiCli, MiniSweAgent, Hermes, Copilot, Cline, OpenHandsSdk)
}


def get_harness(name: str, **options: object) -> Harness:
    try:
        cls = HARNESSES[name]
    except KeyError:
        raise ValueError(f"unknown harness {name!r}; choose one of {', '.join(HARNESSES)}") from None
    return cls(**options)


def install(names: list[str] | None = None) -> None:
    """Install the pinned CLIs into the shared prefix (``python -m nemo_polar.env.harness``), side by side: each is
    an npm install (or a venv, for a Python harness) of its own (mostly downloads) into a prefix of its own."""
    from concurrent.futures import ThreadPoolExecutor

    chosen = [HARNESSES[name] for name in names or list(HARNESSES)]
    cached = {h.name for h in chosen if h.installed()}
    with ThreadPoolExecutor(max_workers=len(chosen) or 1) as pool:
        prefixes = list(pool.map(lambda h: h.install(), chosen))
    for harness, prefix in zip(chosen, prefixes, strict=True):
        note = " (cached)" if harness.name in cached else ""
        print(f"{harness.name}: {harness.package}@{harness.version} in {prefix}{note}")
    if len(chosen) > 1:
        new = len(chosen) - len(cached)
        print(f"{len(chosen)} CLIs" + (f", {new} installed" if new else " (cached)"))


__all__ = ["HARNESSES", "Endpoint", "Harness", "HarnessMissing", "Launch", "Unsupported", "get_harness", "install"]
