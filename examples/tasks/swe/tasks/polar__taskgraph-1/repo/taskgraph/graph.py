"""The dependency graph."""

from __future__ import annotations


class CycleError(ValueError):
    """The dependencies form a cycle, so no execution order exists."""


class Graph:
    def __init__(self) -> None:
        self._deps: dict[str, list[str]] = {}

    def add(self, name: str, deps: list[str] = []) -> None:
        """Declare a task; ``deps`` are the tasks that must run before it."""
        if name in self._deps:
            raise ValueError(f"task {name!r} is already declared")
        self._deps[name] = deps

    def depend(self, name: str, dep: str) -> None:
        """Add one more dependency to a declared task."""
        if name not in self._deps:
            raise KeyError(name)
        if dep not in self._deps[name]:
            self._deps[name].append(dep)

    def deps(self, name: str) -> list[str]:
        return list(self._deps[name])

    def tasks(self) -> list[str]:
        return list(self._deps)
