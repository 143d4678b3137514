"""Ordering tasks so that every task comes after its dependencies."""

from __future__ import annotations

from taskgraph.graph import CycleError, Graph


def execution_order(graph: Graph) -> list[str]:
    """Tasks in an order that respects every dependency; ties are broken alphabetically."""
    remaining = {name: set(graph.deps(name)) for name in graph.tasks()}
    for name, deps in remaining.items():
        unknown = deps - remaining.keys()
        if unknown:
            raise KeyError(f"task {name!r} depends on undeclared {sorted(unknown)}")
    order: list[str] = []
    while remaining:
        ready = sorted(name for name, deps in remaining.items() if not deps)
        if not ready:
            raise CycleError(f"dependency cycle among {sorted(remaining)}")
        for name in ready:
            del remaining[name]
            order.append(name)
        for deps in remaining.values():
            deps.difference_update(ready)
    return order
