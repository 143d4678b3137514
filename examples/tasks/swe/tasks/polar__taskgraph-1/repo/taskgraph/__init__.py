"""Declare tasks and their dependencies, then run them in dependency order."""

from taskgraph.graph import CycleError, Graph
from taskgraph.order import execution_order

__all__ = ["CycleError", "Graph", "execution_order"]
