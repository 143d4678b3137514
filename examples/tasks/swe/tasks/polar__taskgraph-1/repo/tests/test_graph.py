import pytest

from taskgraph import CycleError, Graph, execution_order


def test_order_respects_dependencies():
    graph = Graph()
    graph.add("test", ["build"])
    graph.add("build", ["fetch"])
    graph.add("fetch", [])
    assert execution_order(graph) == ["fetch", "build", "test"]


def test_independent_tasks_are_alphabetical():
    graph = Graph()
    for name in ("lint", "docs", "build"):
        graph.add(name, [])
    assert execution_order(graph) == ["build", "docs", "lint"]


def test_cycle_is_reported():
    graph = Graph()
    graph.add("a", ["b"])
    graph.add("b", ["a"])
    with pytest.raises(CycleError):
        execution_order(graph)


def test_undeclared_dependency_is_rejected():
    graph = Graph()
    graph.add("deploy", ["package"])
    with pytest.raises(KeyError):
        execution_order(graph)


def test_duplicate_task_is_rejected():
    graph = Graph()
    graph.add("a", [])
    with pytest.raises(ValueError):
        graph.add("a", [])
