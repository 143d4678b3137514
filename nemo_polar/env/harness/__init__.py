"""Harness adapters for the coding CLIs, found by name: one module each, registered in ``HARNESSES`` (in their
``order``), from which every list of CLIs derives (Polar and Gym environments, the demo's tasks, the patterns table)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

from nemo_polar.env.harness.base import (
    HARNESSES,
    Endpoint,
    EnvOption,
    GymValues,
    Harness,
    HarnessMissing,
    Launch,
    Unsupported,
    register,
)

# What every adapter shares, not adapters: the base class and registry, the scripted policy's actions.
SHARED_MODULES = frozenset({"base", "script"})


def _discover() -> None:
    """Register the adapter each public module of this package defines (the shared modules aside; a private module,
    such as the OpenHands runner, is never imported here): adding a CLI is adding its module."""
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_") or info.name in SHARED_MODULES:
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for value in vars(module).values():
            concrete = isinstance(value, type) and issubclass(value, Harness) and not inspect.isabstract(value)
            if concrete and value.__module__ == module.__name__:  # defined there, not imported
                register(value)


_discover()


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


__all__ = [
    "HARNESSES",
    "Endpoint",
    "EnvOption",
    "GymValues",
    "Harness",
    "HarnessMissing",
    "Launch",
    "Unsupported",
    "get_harness",
    "install",
    "register",
]
