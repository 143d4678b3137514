"""Named profiles: a ``[default]`` section and ``[profile NAME]`` sections."""

from __future__ import annotations

PROFILE_PREFIX = "profile "


def profiles(config: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """Profile name to its own settings; sections that are not profiles are ignored."""
    result: dict[str, dict[str, str]] = {}
    for section, values in config.items():
        if section == "default":
            result["default"] = dict(values)
        elif section.startswith(PROFILE_PREFIX):
            name = section.lstrip(PROFILE_PREFIX).strip()
            result[name] = dict(values)
    return result


def get_profile(config: dict[str, dict[str, str]], name: str = "default") -> dict[str, str]:
    """Settings of one profile; a profile inherits every key of ``[default]`` it does not set itself."""
    found = profiles(config)
    if name not in found:
        raise KeyError(f"no profile named {name!r}")
    return {**found.get("default", {}), **found[name]}
