"""Polar envs by name: ``conf/env/<name>.yaml`` (the harness, its options and the proxy session config), the same
files ``polar rollout env=<name>`` composes, so the Gym agent and the CLI never disagree about an env."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field

from nemo_polar.paths import conf_dir


class PolarEnvSpec(BaseModel):
    name: str
    harness: str
    harness_options: dict[str, Any] = Field(default_factory=dict)
    session: dict[str, Any] = Field(default_factory=dict, description="the proxy's SessionConfig fields")


class UnknownEnv(ValueError):
    pass


def env_dir() -> Path:
    return conf_dir() / "env"


def polar_envs() -> dict[str, PolarEnvSpec]:
    envs = {}
    for path in sorted(env_dir().glob("*.yaml")):
        data = yaml.safe_load(path.read_text()) or {}
        envs[path.stem] = PolarEnvSpec.model_validate({"name": path.stem, **data})
    return envs


def get_env(name: str) -> PolarEnvSpec:
    envs = polar_envs()
    if name not in envs:
        raise UnknownEnv(f"unknown Polar env {name!r}; choose one of {', '.join(envs) or '(none found)'}")
    return envs[name]
