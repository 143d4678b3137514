"""The version type and its parser."""

from __future__ import annotations

import re
from dataclasses import dataclass

_PATTERN = re.compile(
    r"^v?(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?"
    r"(?:\+([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?$"
)


@dataclass(frozen=True)
class Version:
    major: int
    minor: int
    patch: int
    prerelease: tuple[str, ...] = ()
    build: tuple[str, ...] = ()

    def __str__(self) -> str:
        text = f"{self.major}.{self.minor}.{self.patch}"
        if self.prerelease:
            text += "-" + ".".join(self.prerelease)
        if self.build:
            text += "+" + ".".join(self.build)
        return text


def parse(text: str) -> Version:
    """``"1.2.3-rc.1+build.5"`` -> ``Version(1, 2, 3, ("rc", "1"), ("build", "5"))``; a leading ``v`` is allowed."""
    found = _PATTERN.match(text.strip())
    if found is None:
        raise ValueError(f"not a semantic version: {text!r}")
    major, minor, patch, pre, build = found.groups()
    return Version(
        int(major),
        int(minor),
        int(patch),
        tuple(pre.split(".")) if pre else (),
        tuple(build.split(".")) if build else (),
    )
