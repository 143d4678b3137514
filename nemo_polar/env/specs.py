"""Polar envs by name: ``conf/env/<name>.yaml`` (the harness, its options and the proxy session config), the same
files ``polar rollout env=<name>`` composes, so the Gym agent and the CLI never disagree about an env.

:func:`resolve_env` is the one place an env and a caller's overrides merge (``PolarEnvConfig``, the Gym agent's
config and a Gym row's ``polar_env``, ``polar rollout``'s Hydra overrides): the harness is replaced, its options and
the session config are merged key by key over the env's, and the result is validated.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field

from nemo_polar.env.harness import HARNESSES, Harness
from nemo_polar.paths import conf_dir
from nemo_polar.proxy.store.sessions import SessionConfig


class PolarEnvSpec(BaseModel):
    name: str
    harness: str
    harness_options: dict[str, Any] = Field(default_factory=dict)
    session: dict[str, Any] = Field(default_factory=dict, description="the proxy's SessionConfig fields")


class UnknownEnv(ValueError):
    pass


class EnvOverrides(BaseModel):
    """What a caller changes of an env."""

    harness: str | None = Field(default=None, description="replaces the env's harness")
    harness_options: dict[str, Any] = Field(default_factory=dict, description="merged over the env's")
    session: dict[str, Any] = Field(default_factory=dict, description="proxy SessionConfig fields, over the env's")


def resolve_env(env: str | PolarEnvSpec, overrides: EnvOverrides | None = None) -> PolarEnvSpec:
    """The env (by name, or as composed by Hydra) with ``overrides`` over it. An unknown env, harness or session
    field raises ``ValueError`` naming it."""
    spec = get_env(env) if isinstance(env, str) else env
    o = overrides or EnvOverrides()
    resolved = PolarEnvSpec(
        name=spec.name,
        harness=o.harness or spec.harness,
        harness_options={**spec.harness_options, **o.harness_options},
        session={**spec.session, **o.session},
    )
    if resolved.harness not in HARNESSES:
        raise ValueError(f"unknown harness {resolved.harness!r}; choose one of {', '.join(HARNESSES)}")
    try:
        SessionConfig.model_validate(resolved.session)
    except ValueError as exc:
        raise ValueError(f"env {resolved.name}: invalid session config: {exc}") from None
    return resolved


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


def env_yaml(harness: type[Harness]) -> str:
    """``conf/env/polar_<name>.yaml`` as the harness declares it: the adapter options its env sets (each with its
    note) and a continuation-mode proxy session."""
    note = f" ({harness.env_note})" if harness.env_note else ""
    about = (
        f"The {harness.name} harness{note} through a proxy session. `harness_options` go to the adapter; `session` is "
        "the proxy's SessionConfig (mode, sampling_overrides, chat_template_kwargs, extra_body, policy_version, "
        "metadata)."
    )
    lines = [f"# {line}" for line in textwrap.wrap(about, 114)]
    lines += [f"name: {harness.env_name()}", f"harness: {harness.name}"]
    if harness.env_options:
        lines.append("harness_options:")
        lines += [f"  {o.key}: {_scalar(o.value)}  # {o.note}" for o in harness.env_options]
    else:
        lines.append("harness_options: {}")
    lines += ["session:", "  mode: continuation"]
    return "\n".join(lines) + "\n"


def _scalar(value: str | int | bool) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def write_env_files(conf: Path | None = None) -> list[Path]:
    """Regenerate every registered harness's Polar env file under ``conf`` (default: the project's conf/)."""
    written = []
    for harness in HARNESSES.values():
        path = (conf or conf_dir()) / "env" / f"{harness.env_name()}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(env_yaml(harness))
        written.append(path)
    return written
