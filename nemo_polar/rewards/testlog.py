"""What of a test run's output gets graded.

The code under test shares stdout with the test runner: it can print lines that read as results (swebench's
pytest parsers take the last status line per test anywhere in the log) or as the eval script's markers
(``>>>>> Tests Timed Out`` would mask the sample). So the markers are the grader's own, never read from the
output, and for pytest logs only pytest's final report is graded: the short test summary section up to pytest's
final ``N passed, M failed in Xs`` line. What is printed after that line (an atexit handler) is not read, and a
run that never printed one (it crashed, was killed or called ``os._exit``) has no results at all.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import NamedTuple

# swebench.harness.constants' log markers, spelled out: importing swebench takes seconds (tests check they match).
START_TEST_OUTPUT = ">>>>> Start Test Output"
END_TEST_OUTPUT = ">>>>> End Test Output"
TEST_EXIT_CODE = ">>>>> Test Exit Code"
MARKER = ">>>>>"
PYTEST_PARSERS = ("parse_log_pytest", "parse_log_pytest_options", "parse_log_pytest_v2")  # and their aliases
SUMMARY_HEADER = re.compile(r"^=+ short test summary info =+$")
# pytest's last line, e.g. "==== 1 failed, 3 passed, 1 warning in 0.12s ====", "no tests ran in 0.01s" (-q: no
# rules), "... in 61.20s (0:01:01)", and before pytest 5.4 "... in 0.12 seconds".
FINAL_LINE = re.compile(
    r"^(?:=+ )?(?:no tests ran|\d+ \w+(?:, \d+ \w+)*) in \d+(?:\.\d+)?\s?s(?:econds)?(?: \([\d:]+\))?(?: =+)?$"
)


def test_output(log: str) -> str | None:
    """What the test command printed: the text after the eval script's start marker, with every line that looks
    like one of its markers dropped. None if the tests never started."""
    if START_TEST_OUTPUT not in log:
        return None
    output = log.split(START_TEST_OUTPUT, 1)[1]
    return "\n".join(line for line in output.splitlines() if not line.startswith(MARKER))


def pytest_report(output: str) -> str | None:
    """pytest's own final report: from the last short-test-summary header before its final line (from the start
    when the command shows no summary) to that line. None when pytest did not finish its run."""
    lines = output.splitlines()
    ends = [i for i, line in enumerate(lines) if FINAL_LINE.match(line.strip())]
    if not ends:
        return None
    end = ends[-1]
    headers = [i for i in range(end) if SUMMARY_HEADER.match(lines[i].strip())]
    start = headers[-1] + 1 if headers else 0
    return "\n".join(lines[start : end + 1])


def graded_log(output: str, exit_code: int | None) -> str:
    """A log in the shape swebench's ``get_eval_report`` reads: the graded output between its markers, and the
    test command's exit status as the sandbox reported it."""
    return f"{START_TEST_OUTPUT}\n{output}\n{END_TEST_OUTPUT}\n{TEST_EXIT_CODE}: {exit_code}\n"


@functools.cache
def known_log_parsers() -> frozenset[str]:
    """The names of swebench's log parsers (its PARSER_REGISTRY)."""
    from swebench.harness.log_parsers import PARSER_REGISTRY

    return frozenset(PARSER_REGISTRY)


@functools.cache
def is_pytest_parser(name: str) -> bool:
    """Whether swebench's parser ``name`` reads pytest's report: one of its pytest parsers under any of its names
    (``parse_log_requests`` is ``parse_log_pytest_options``, ``parse_log_flask`` is ``parse_log_pytest``, ...)."""
    from swebench.harness.log_parsers import PARSER_REGISTRY

    return PARSER_REGISTRY.get(name) in [PARSER_REGISTRY[p] for p in PYTEST_PARSERS]


@functools.cache
def repo_parser_names() -> dict[str, str]:
    """The parser name swebench's own tables (``MAP_REPO_TO_PARSER_*`` in ``swebench/harness/log_parsers``) give each
    repository, as SWE-bench 5 rows name it. Read from the tables' source: the names are aliases of shared
    functions (``parse_log_requests = parse_log_pytest_options``), so the function alone does not tell them."""
    import ast

    import swebench.harness.log_parsers as parsers

    names: dict[str, str] = {}
    for source in sorted(Path(parsers.__file__).parent.glob("*.py")):
        for node in ast.parse(source.read_text()).body:
            tables = [t for t in getattr(node, "targets", []) if isinstance(t, ast.Name)]
            if not any(t.id.startswith("MAP_REPO_TO_PARSER") for t in tables) or not isinstance(node.value, ast.Dict):
                continue
            for key, value in zip(node.value.keys, node.value.values, strict=True):
                if isinstance(key, ast.Constant) and isinstance(value, ast.Name) and value.id in known_log_parsers():
                    names[key.value] = value.id
    return names


def swebench_version() -> str:
    from importlib.metadata import version

    return version("swebench")


class EvalScriptParts(NamedTuple):
    """A row's eval script cut at its test-output markers (the way swebench's ``record_test_exit_code`` finds
    them: the first line holding the marker)."""

    setup: str  # the environment, resetting the test files, applying the test patch
    tests: str  # the test command: its last exit status is the tests' exit code
    after: str  # resetting the test files again: not needed in a throwaway sandbox


def split_eval_script(script: str) -> EvalScriptParts:
    from swebench.harness.utils import parse_eval_script

    lines = parse_eval_script(script)
    start = next((i for i, line in enumerate(lines) if START_TEST_OUTPUT in line), None)
    end = next((i for i, line in enumerate(lines) if END_TEST_OUTPUT in line), None)
    if start is None or end is None or end < start:
        raise ValueError(
            f"the eval script has no {START_TEST_OUTPUT!r} line followed by an {END_TEST_OUTPUT!r} line: "
            "the grader cannot tell the test command from the setup"
        )
    if start + 1 == end:
        raise ValueError("the eval script runs no command between its test-output markers")
    return EvalScriptParts(
        setup="\n".join(lines[:start]) + "\n",
        tests="\n".join(lines[start + 1 : end]) + "\n",
        after="\n".join(lines[end + 1 :]) + "\n",
    )
